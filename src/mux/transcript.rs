//! What the client has been sent so far: the text, the tool calls, and whether anything
//! visible left at all (which decides whether a restart can be seamless).

#[derive(Debug, Default, Clone)]
pub struct Transcript {
    pub text: String,
    pub tool_calls: usize,
    /// A tool call has started upstream and not completed: continuing is impossible.
    pub tool_open: bool,
}

impl Transcript {
    pub fn push_text(&mut self, s: &str) {
        self.text.push_str(s);
    }

    /// Did the client receive anything it would have to unsee?
    pub fn visible(&self) -> bool {
        !self.text.is_empty() || self.tool_calls > 0
    }

    pub fn clear(&mut self) {
        *self = Transcript::default();
    }
}
