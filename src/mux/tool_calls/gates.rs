//! The request's quality gates, compiled once per request: every attempt (primary, hedge,
//! failover, repair, shadow) takes a fresh tool-call assembler and structured-answer gate
//! that share the compiled tool schemas and response schema.

use super::{StructuredGate, ToolCallAssembler};
use crate::types::ChatRequest;

/// The compiled gates of one request; cloning shares the compiled schemas.
#[derive(Debug, Clone)]
pub struct Gates {
    /// Holds no call: each attempt's assembler starts as a clone of it.
    assembler: ToolCallAssembler,
    /// Holds no text; `None` when the request asks for no structured answer.
    structured: Option<StructuredGate>,
}

impl Gates {
    /// Compiles `req`'s tool schemas and response schema. The repair's request carries the
    /// same tools and response format, so the same gates judge it.
    pub fn for_request(req: &ChatRequest) -> Self {
        Gates {
            assembler: ToolCallAssembler::new(&req.tools),
            structured: StructuredGate::for_request(req),
        }
    }

    /// An empty assembler and gate for one attempt.
    pub fn for_attempt(&self) -> (ToolCallAssembler, Option<StructuredGate>) {
        (self.assembler.clone(), self.structured.clone())
    }
}
