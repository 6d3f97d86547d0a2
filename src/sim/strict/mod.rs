//! The request rules real APIs enforce that the simulated upstream enforces too, each with
//! the real API's status (400 `invalid_request_error`) and message: a request a real provider
//! refuses is refused here, before the scenario plays, so tests against the simulator see
//! what a real route would answer.
//!
//! Written from the providers' published behaviour and the errors their servers return
//! (`/work/shared/reference/providers.md` §1.2, §2.3-§2.5 and the reports it cites),
//! independently of what the provider adapters send, so a test catches an adapter that gets
//! it wrong. A message marked *[unverified]* in its file follows the API's pattern where no
//! real body could be found. The rules, in the order they are checked:
//!
//! OpenAI wire (`openai.rs`, `documents.rs`):
//! - `temperature` outside 0..=2, `top_p` outside 0..=1, `frequency_penalty` /
//!   `presence_penalty` outside -2..=2, `top_logprobs` outside 0..=20: "Invalid 'temperature':
//!   decimal above maximum value. Expected a value <= 2, but got 5 instead." (`param`, code
//!   `decimal_above_max_value` and the like).
//! - `top_logprobs` without `logprobs: true`.
//! - A reasoning model (`o1`, `o3`, `o4`, `gpt-5` families): `max_tokens` is refused (they take
//!   `max_completion_tokens`); so are the sampling fields: on `o1` and `o3-mini` any
//!   `temperature`, `top_p`, penalty, `logit_bias`, `logprobs: true` or `top_logprobs`
//!   ("Unsupported parameter: 'temperature' is not supported with this model."); on the later
//!   ones a `temperature` or `top_p` other than 1 ("Unsupported value: 'temperature' does not
//!   support 0.2 with this model. Only the default (1) value is supported.") and any penalty,
//!   `logit_bias`, `logprobs: true` or `top_logprobs`. gpt-5.1 and later take `temperature`,
//!   `top_p` and `logprobs` with `reasoning_effort: "none"`.
//! - A `file` content part without `file` or with neither `file_data` nor `file_id`, or whose
//!   `file_data` is not a base64 `data:application/pdf` URL.
//!
//! Anthropic wire (`anthropic.rs`, `documents.rs`, `thinking.rs`):
//! - `temperature` or `top_p` outside 0..=1 ("temperature: Input should be less than or equal
//!   to 1").
//! - More than 4 `cache_control` breakpoints ("A maximum of 4 blocks with cache_control may
//!   be provided. Found 5.").
//! - A malformed `document` block: no `source`, an unknown source type, base64 data that is
//!   not a PDF, a `media_type` other than `application/pdf`, a `file` source without the Files
//!   API beta.
//! - Extended thinking (`thinking`, `enabled` or `adaptive`): the budget, `max_tokens` above
//!   it (unless the `interleaved-thinking-2025-05-14` beta), `temperature` 1 only, no
//!   `top_k`, `top_p` in 0.95..=1, no forced `tool_choice` with `enabled`, the current
//!   assistant turn starting with a thinking block (a prefill, a tool loop), and with thinking
//!   off no thinking in a final assistant message; every `thinking` block's signature present
//!   and issued by the simulator for exactly its text (`signature.rs`), every
//!   `redacted_thinking` block's `data` one the simulator issued.

mod anthropic;
mod documents;
mod openai;
mod thinking;

use serde_json::Value;

use super::plan::{StatusError, Wire};

/// The real API's refusal of `body` on `wire` (with its `anthropic-beta` header), when it
/// breaks one of the rules above.
pub(crate) fn refusal(wire: Wire, body: &Value, beta: Option<&str>) -> Option<StatusError> {
    match wire {
        Wire::OpenAi => openai::refusal(body).or_else(|| documents::openai(body)),
        Wire::Anthropic => anthropic::refusal(body)
            .or_else(|| documents::anthropic(body, beta))
            .or_else(|| thinking::refusal(body, beta)),
    }
}

/// Whether the comma-joined `anthropic-beta` header names `feature`.
fn has_beta(beta: Option<&str>, feature: &str) -> bool {
    beta.is_some_and(|b| b.split(',').any(|f| f.trim() == feature))
}

/// A number as the request wrote it (`5`, `2.5`), for messages that quote it.
fn written(value: &Value) -> String {
    value.to_string()
}
