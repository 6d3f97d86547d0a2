//! What an answer that failed its quality gate said (the tool calls as assembled, or the
//! held structured text), kept for its one repair, and how it reads back to the route.

/// One tool call as the upstream wrote it, whatever its validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedCall {
    pub name: Option<String>,
    pub arguments: String,
}

/// The invalid output of one attempt. Bounded by the gates' own caps (the assembler's and
/// the structured gate's buffered bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    /// The answer's tool calls, in the order they started.
    ToolCalls(Vec<RejectedCall>),
    /// A structured answer's whole text.
    Structured(String),
}

/// The most of the invalid output that goes back to the route: enough for a model to see
/// its mistake, without resending a megabyte of it.
pub const MAX_ECHO_BYTES: usize = 16 * 1024;

impl Rejected {
    /// The invalid answer as the assistant's previous turn, in plain text. Plain text because
    /// every wire can carry it: the Anthropic wire cannot carry tool-call arguments that are
    /// not JSON, and some providers reject a history naming a tool that was not offered.
    pub fn as_assistant_text(&self) -> String {
        let text = match self {
            Rejected::Structured(text) => text.clone(),
            Rejected::ToolCalls(calls) => calls
                .iter()
                .map(|c| {
                    format!(
                        "Tool call {} with arguments: {}",
                        c.name.as_deref().unwrap_or("(no name)"),
                        c.arguments
                    )
                })
                .collect::<Vec<_>>()
                .join("\n"),
        };
        super::schema::cut(text, MAX_ECHO_BYTES)
    }

    /// What kind of answer it was, for the repair's request.
    pub fn is_structured(&self) -> bool {
        matches!(self, Rejected::Structured(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_calls_read_back_as_text_with_their_raw_arguments() {
        let r = Rejected::ToolCalls(vec![
            RejectedCall {
                name: Some("weather".into()),
                arguments: "{\"city\": ".into(),
            },
            RejectedCall {
                name: None,
                arguments: "{}".into(),
            },
        ]);
        assert_eq!(
            r.as_assistant_text(),
            "Tool call weather with arguments: {\"city\": \nTool call (no name) with arguments: {}"
        );
        assert!(!r.is_structured());
    }

    #[test]
    fn a_long_output_is_cut_at_a_char_boundary() {
        let r = Rejected::Structured("é".repeat(MAX_ECHO_BYTES));
        let text = r.as_assistant_text();
        assert!(text.len() <= MAX_ECHO_BYTES + '…'.len_utf8(), "bounded: {}", text.len());
        assert!(text.ends_with('…'), "marked as cut");
    }
}
