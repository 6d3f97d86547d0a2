//! What the client has been sent so far: the text, the tool calls, whether it saw thinking,
//! and whether anything visible left at all (which decides whether a restart can be seamless).

/// Text kept for seams (swallow, continue); an answer longer than this can only be
/// truncated if it fails, so memory per stream stays bounded, and once past it the text is
/// dropped: nothing can use an incomplete copy.
pub const MAX_KEPT: usize = 256 * 1024;

#[derive(Debug, Default, Clone)]
pub struct Transcript {
    pub text: String,
    /// More text was sent than `MAX_KEPT`: `text` was dropped (it is empty from then on).
    pub overflowed: bool,
    pub tool_calls: usize,
    /// A tool call has started upstream and not completed: continuing is impossible.
    pub tool_open: bool,
    /// The client was shown the route's reasoning: a new answer cannot pass for this one, and
    /// no continuation can carry its (signed) thinking on.
    pub thinking: bool,
    /// The client was handed the route's log-probabilities (`types::ExtraField::Logprobs`).
    pub logprobs: bool,
}

impl Transcript {
    pub fn push_text(&mut self, s: &str) {
        if self.overflowed {
            return;
        }
        if self.text.len() + s.len() > MAX_KEPT {
            self.overflowed = true;
            self.text = String::new();
        } else {
            self.text.push_str(s);
        }
    }

    /// Did the client receive anything it would have to unsee?
    pub fn visible(&self) -> bool {
        !self.text.is_empty() || self.tool_calls > 0 || self.overflowed || self.thinking
    }

    pub fn clear(&mut self) {
        *self = Transcript::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_past_the_cap_is_dropped_not_kept_incomplete() {
        let mut t = Transcript::default();
        let chunk = "x".repeat(1024);
        for _ in 0..MAX_KEPT / 1024 {
            t.push_text(&chunk);
        }
        assert_eq!(t.text.len(), MAX_KEPT, "up to the cap the text is kept whole");
        assert!(!t.overflowed);
        t.push_text("y");
        assert!(t.overflowed && t.visible(), "past it: overflowed, and still visible");
        assert_eq!(t.text.capacity(), 0, "its memory is freed");
        t.push_text("z");
        assert!(t.text.is_empty(), "and nothing more is kept");
    }
}
