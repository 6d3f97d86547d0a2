//! The simulated upstream: a real HTTP server on loopback that speaks the OpenAI Chat
//! Completions and Anthropic Messages wire formats exactly, driven by explicit scenarios.
//!
//! tailcut starts it in-process for `provider = "simulated"` routes (reached over loopback
//! through the real adapters), `tailcut sim` runs it standalone ([`serve_standalone`]), and
//! tests use it to prove hedging, cancellation and failure handling: every request leaves a
//! [`SimRecord`] saying when it arrived, when its first content token left, how many tokens
//! were written and how it ended. `client_closed` in that record is the proof that a caller
//! closed the upstream connection.
//!
//! # HTTP surface
//!
//! | method and path | what |
//! |---|---|
//! | `POST /s/{scenario}/v1/chat/completions` | OpenAI Chat Completions, streamed or not |
//! | `POST /s/{scenario}/v1/messages` | Anthropic Messages, streamed or not |
//! | `GET /_sim/log` / `DELETE /_sim/log` | the records (JSON array) / forget them |
//! | `GET /_sim/scenarios` | scenario names (registered ones and the profiles) |
//! | `PUT /_sim/scenarios/{name}` | add or replace a scenario (JSON body) |
//!
//! A scenario name that is neither registered nor a built-in profile gets a 404 in the
//! wire's error format. Nothing is chosen by magic model names.
//!
//! # How a response is played
//!
//! Headers and the opening event (the role chunk, or `message_start` + the text block's
//! `content_block_start` + `ping`) leave at once; the first content token follows after the
//! drawn TTFT, then one token per inter-token gap. Every event is its own body chunk (or
//! `chunk_split` pieces). All delays are `tokio::time::sleep`, so paused-time tests drive the
//! simulator too. The per-request RNG is `SmallRng::seed_from_u64(seed ^ n)` where `n`
//! counts the scenario's requests from 0, so a run is reproducible. Generated text depends
//! only on `seed` and `tokens`: every request of a scenario, and any scenario with the same
//! two values, gets the same answer, which is what restart and continue tests need (see
//! "Prefill" below for a request that ends with an assistant message). The model reported
//! is the scenario's `model`, else the request's own `model`, else "sim-1". A record's
//! `end` stays `None` while its response is being written.
//!
//! An explicit `text` is cut into its words, each with the whitespace in front of it, so the
//! tokens concatenate back to the text exactly, whatever it holds (repeated words, digit
//! groups, blank lines, multi-byte characters). `failure.drop_after_bytes` aborts the
//! connection once that many bytes of this response's text are out, rounded down to a char
//! boundary: the token holding the cut is split and its first part sent as its own delta.
//!
//! With `stream: false` the simulator waits as long as the stream would have taken and
//! answers with one body. Status errors, drops, in-band errors (as 500 / 529), malformed
//! output (half a body), refusals and truncation apply there too; the other wire faults are
//! stream-only.
//!
//! # Honouring the request
//!
//! Unless the scenario gives an explicit answer (`text`, `tool_calls`) or sets
//! `ignores_request`, the answer is what the request asks for: offered tools get one call to
//! the tool `tool_choice` names (else the first offered; `"none"` gets text) with arguments
//! generated from the tool's schema (`schema.rs`: every property, values within
//! the schema's enums and bounds); OpenAI JSON mode gets `{"answer": <the text>}` and a
//! `json_schema` format an instance of its schema, pretty-printed so its words stream as
//! tokens; `max_tokens` cuts the answer (text tokens or tool-argument fragments) to that many
//! and ends it with `length`. Usage reports the tokens actually written.
//!
//! A scenario with a `quality` (`quality.rs`: a preset, `strong` / `fair` / `weak`, or rates)
//! also follows the prompt: the last user message's quoted phrase is the text answer, and a
//! prompt naming a refuse topic is refused; each rate is the share of requests that get a
//! wrong answer, JSON or tool arguments that do not parse, a missed or a needless refusal
//! instead, drawn from `seed` and a hash of the messages (never the request number), so the
//! same prompt always gets the same verdict.
//!
//! # Schedules (the scenario's `phases`)
//!
//! Phases follow each other on the simulator's clock and repeat; each overrides the
//! scenario's `ttft`, `failure` and `continuation` while it lasts ([`Scenario::during`]).
//! Every route on one simulator shares the clock, so two routes' schedules stay in step (the
//! default config's `demo` model relies on that).
//!
//! # Prefill ([`Continuation`], the scenario's `continuation` section)
//!
//! A request whose final message is an assistant message with text carries a prefill. On the
//! Anthropic wire it always is one, and one whose last text part ends in whitespace is
//! refused as the real API does: 400 `invalid_request_error`, "messages: final assistant
//! content cannot end with trailing whitespace" (before any other fault). On the OpenAI wire
//! `convention` says which request shape is continued; any other shape is history and the
//! whole answer is sent, as api.openai.com does:
//!
//! | `convention` | continued when |
//! |---|---|
//! | `any` (default) | any final assistant message |
//! | `assistant` | a plain one (no `prefix: true`, no `continue_final_message: true`) |
//! | `prefix` | the final assistant message has `"prefix": true` (DeepSeek beta, Mistral) |
//! | `vllm` | the request has `"continue_final_message": true` (vLLM) |
//! | `none` | never (api.openai.com) |
//!
//! A continued prefill gets `behaviour`:
//!
//! | `behaviour` | the answer |
//! |---|---|
//! | `exact` (default) | only the remainder after the prefill: a prefill ending inside a token gets the token's tail, one the gateway stripped of whitespace gets the whitespace back first; the whole answer when the prefill is not a prefix of it |
//! | `starts_over` | the whole answer from its start |
//! | `diverges` | a different answer: the first `diverge_after_words` words of the answer (default 3, at most all but the last), then other words, so the text parts right after the shared words |
//! | `refuses` | HTTP 400 in the wire's error format with `refusal_message`, by default llama.cpp's "Assistant response prefill is incompatible with enable_thinking" |
//!
//! A user message saying "continue" is no prefill: the answer starts from the beginning.
//! [`SimRecord::continuation`] says what happened ([`PrefillOutcome`]): `exact`,
//! `not_a_prefix`, `starts_over`, `diverges`, `refused`, `not_honoured` (the wrong shape for
//! the convention) or `trailing_whitespace`; `None` without a prefill.
//!
//! # Built-in profiles ([`profile`])
//!
//! | name | TTFT | tokens | other |
//! |---|---|---|---|
//! | `fast-stable` | lognormal median 80 ms, σ 0.2 | 40, 10 ms apart | |
//! | `spiky` | median 550 ms, σ 0.65, 2% stalls of 3-12 s | 60, 25 ms apart | |
//! | `cold-start` | as `fast-stable`, first 3 requests +4 s | 40, 10 ms apart | |
//! | `always-429` | | | every request: 429 `rate_limit`, `retry-after: 2` |
//! | `drop-mid-stream` | as `fast-stable` | 40, 10 ms apart | connection aborted after 5 tokens |
//! | `tool-call` | as `fast-stable` | | one `get_weather` call, `{"city": "Paris", "unit": "celsius"}` in 12 fragments |
//! | `correlated-brownout` | as `spiky`, +2.5 s during the first half of every 10 s | 60, 25 ms apart | degrades every route on the simulator together |
//! | `slow` | median 3000 ms, σ 0.1 | 40, 30 ms apart | |
//! | `hostile-text` | as `fast-stable` | its text's 18 words, 10 ms apart | repeated words, `$1,000,000`, a blank line and "Naïve café — 日本語 🎉", where seams and byte cuts break |
//!
//! # Reasoning ([`Thinking`], the scenario's `thinking` section; `reasoning.rs`)
//!
//! An Anthropic request with `thinking` of type `enabled` or `adaptive` gets a `thinking`
//! block before its answer, as §3.4 of the wire reference shows it (the block's deltas are
//! the scenario's `thinking.deltas`, default 6, of a few words each, derived from the prompt):
//!
//! ```text
//! message_start
//! content_block_start  {"index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}
//! ping
//! content_block_delta  {"index":0,"delta":{"type":"thinking_delta","thinking":"The request asks:"}}   × deltas
//! content_block_delta  {"index":0,"delta":{"type":"signature_delta","signature":"…"}}
//! content_block_stop   {"index":0}
//! [content_block_start {"index":1,"content_block":{"type":"redacted_thinking","data":"…"}} + stop]  thinking.redacted
//! content_block_start  {"index":1,"content_block":{"type":"text","text":""}}   (or tool_use blocks from 1)
//! content_block_delta  {"index":1,"delta":{"type":"text_delta","text":"…"}}   × tokens
//! content_block_stop, message_delta (output_tokens: thinking + answer), message_stop
//! ```
//!
//! With `display: "omitted"` the block gets only its signature (the tokens are billed all
//! the same); with `stream: false` the body's `content` starts with the thinking block and its
//! signature. A thinking delta is one token: it counts toward `tokens_sent`, usage,
//! `max_tokens` (the answer gets what the reasoning leaves) and every fault "after N tokens",
//! which can therefore cut inside the thinking block; it is not the answer's first content
//! token (`first_token_at_ms`). Signatures are HMAC-SHA256 of the thinking text under the
//! simulator's key (`signature.rs`): the same on every simulator, checked when a request
//! carries a block back, as are a `redacted_thinking` block's `data`.
//!
//! On the OpenAI wire the model id decides, unless `thinking.openai` says otherwise: OpenAI's
//! reasoning models (`o1`, `o3`, `o4`, `gpt-5` families) reason hidden, billed in
//! `completion_tokens` and `completion_tokens_details.reasoning_tokens`; a model id naming a
//! reasoner (`reasoner`, or a part `r1`: `deepseek-reasoner`, `deepseek-r1:14b`) streams
//! `delta.reasoning_content` chunks (`content: null`) before the content, as DeepSeek does,
//! and the aggregate's message carries `reasoning_content`. `thinking.openai` can force
//! `reasoning_content` or `reasoning` (vLLM's field) deltas on any model, or `none`.
//!
//! # What else a request can ask for
//!
//! - OpenAI `logprobs: true` (with `top_logprobs` up to 20): each content chunk carries
//!   `logprobs.content` with one entry per token (`token`, `logprob` ≤ 0, `bytes`,
//!   `top_logprobs`), deterministic per token and position (`logprobs.rs`); a refusal's under
//!   `logprobs.refusal`; the aggregate holds them all. Other chunks carry `"logprobs": null`.
//! - Every OpenAI chunk carries `system_fingerprint` (`fp_` and ten hex digits, fixed per
//!   model) and, when the request names a `service_tier`, the tier served (`auto` as
//!   `default`, `fast` as `priority`).
//! - Anthropic `cache_control` on a tool, system block or message block (or the top level):
//!   `cache_creation_input_tokens` the first time a prefix is seen, `cache_read_input_tokens`
//!   after, `input_tokens` only the rest (`cache.rs`, 1,024 prefixes remembered per
//!   simulator, per scenario and model). Without it both are sent as 0.
//! - Anthropic `document` blocks and OpenAI `file` parts in their real forms.
//!
//! # Known limits
//!
//! Strict where the real APIs are (`strict`): a request a real API refuses is refused with its
//! status and message, whatever the scenario (the rules are listed in `strict/mod.rs`).
//!
//! One choice per answer (`n` is ignored); tool answers carry no text; one thinking block
//! per answer (no interleaved thinking between tool calls). A fault set "after N tokens" (or
//! bytes) never fires when the answer is shorter than N. An exact or diverging answer comes
//! from the scenario's answer, never from the prefill's words: a prefill that is not a prefix
//! of it gets the whole answer. Documents are checked, not read: they add no input tokens.

mod aggregate;
mod answer;
mod anthropic;
mod beats;
mod bodies;
mod bounds;
mod cache;
mod continuation;
mod faults;
mod logprobs;
mod openai;
mod plan;
mod profiles;
mod quality;
mod reasoning;
mod record;
mod request;
mod respond;
mod scenario;
mod schema;
mod server;
mod signature;
mod stream;
mod strict;
mod timing;

#[cfg(test)]
mod tests;

pub use continuation::{answer_tokens, diverging_answer, PrefillOutcome};
pub use profiles::{profile, profile_names};
pub use quality::{Quality, DEFAULT_REFUSE_TOPICS};
pub use record::{SimEnd, SimRecord};
pub use scenario::{
    Behaviour, Brownout, ColdStart, Continuation, Convention, Failure, OpenAiReasoning, Phase, Scenario, Thinking,
    ToolCallSpec, Ttft,
};
pub use server::{serve_standalone, SimHandle};
