//! What the client has been sent so far: the text, the tool calls, and whether anything
//! visible left at all (which decides whether a restart can be seamless).

/// Text kept for seams (swallow, continue); an answer longer than this can only be
/// truncated if it fails, so memory per stream stays bounded.
const MAX_KEPT: usize = 256 * 1024;

#[derive(Debug, Default, Clone)]
pub struct Transcript {
    pub text: String,
    /// More text was sent than `MAX_KEPT`: `text` is incomplete.
    pub overflowed: bool,
    pub tool_calls: usize,
    /// A tool call has started upstream and not completed: continuing is impossible.
    pub tool_open: bool,
}

impl Transcript {
    pub fn push_text(&mut self, s: &str) {
        if self.text.len() + s.len() > MAX_KEPT {
            self.overflowed = true;
        } else {
            self.text.push_str(s);
        }
    }

    /// Did the client receive anything it would have to unsee?
    pub fn visible(&self) -> bool {
        !self.text.is_empty() || self.tool_calls > 0 || self.overflowed
    }

    pub fn clear(&mut self) {
        *self = Transcript::default();
    }
}
