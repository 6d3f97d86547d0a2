//! Provider adapters: translate a `ChatRequest` into an upstream's wire format and its stream
//! back into neutral `Delta`s, classifying every failure on the way.
//!
//! Contract of a `DeltaStream`: it yields deltas until the upstream's terminal signal
//! (`Delta::Finish`, possibly followed by one `Delta::Usage`) and then ends. Any failure
//! (transport error, in-band error event, malformed event, EOF before the terminal signal)
//! is yielded once as `Err` and the stream ends. Dropping the stream closes the upstream
//! connection.

pub mod anthropic;
mod error;
pub mod openai;
pub mod sse;

use std::pin::Pin;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::Stream;

pub use error::{Blame, ErrorClass, ProviderError};

use crate::types::{ChatRequest, FinishReason, Usage};

/// One piece of an upstream answer, before the mux assembles or commits anything.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// Non-empty answer text (role-only and empty deltas are never emitted, T12).
    Text(String),
    /// A fragment of a tool call. `id`/`name` arrive only on a call's first fragment (T1);
    /// `index` is the only key that identifies the call (T3).
    ToolFragment(ToolFragment),
    /// An explicit end of one tool call (Anthropic `content_block_stop`, T6).
    ToolEnd { index: u32 },
    Usage(Usage),
    /// The upstream's terminal signal for the answer.
    Finish(FinishReason),
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolFragment {
    pub index: u32,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: String,
}

pub type DeltaStream = Pin<Box<dyn Stream<Item = Result<Delta, ProviderError>> + Send>>;

/// What the mux hands an adapter for one attempt.
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    pub chat: Arc<ChatRequest>,
    /// For the `continue` policy: assistant text the answer must continue from.
    pub prefill: Option<String>,
    /// Correlates upstream logs with ours (sent as `x-request-id`).
    pub request_id: String,
}

/// An upstream that can stream an answer. One instance per route.
pub trait Provider: Send + Sync + 'static {
    /// Opens the upstream stream. Resolves once the upstream accepted the request (2xx
    /// response headers); a non-2xx answer resolves to a classified `Err`.
    fn open(&self, req: UpstreamRequest) -> BoxFuture<'static, Result<DeltaStream, ProviderError>>;
}

pub type SharedProvider = Arc<dyn Provider>;
