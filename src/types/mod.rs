//! Provider-neutral types: what a client asked for, what the mux emits, and the envelope.

mod envelope;
mod event;
mod prefill;
mod request;

pub use envelope::{Envelope, FailedAttempt, HedgeInfo, LeaseInfo, Level};
pub use event::{ErrorEvent, EventStream, FinishReason, StreamEvent, ToolCall, Usage};
pub use prefill::{Prefill, PrefillConvention};
pub use request::{
    ChatRequest, ContentPart, Message, ResponseFormat, ResponseType, Role, Sampling, ToolChoice, ToolSpec,
};
