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
//! two values, gets the same answer, which is what restart and continue tests need. A
//! request whose messages end with an assistant message (or an assistant message and a
//! final user message asking to "continue") whose text is a prefix of the answer gets only
//! the remainder. The model reported is the scenario's `model`, else the request's own
//! `model`, else "sim-1". A record's `end` stays `None` while its response is being written.
//!
//! With `stream: false` the simulator waits as long as the stream would have taken and
//! answers with one body. Status errors, drops, in-band errors (as 500 / 529), malformed
//! output (half a body), refusals and truncation apply there too; the other wire faults are
//! stream-only.
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
//!
//! # Known limits
//!
//! One choice per answer (`n` is ignored); no thinking blocks; tool answers carry no text.
//! A fault set "after N tokens" never fires when the answer is shorter than N.

mod aggregate;
mod answer;
mod anthropic;
mod openai;
mod plan;
mod profiles;
mod record;
mod request;
mod respond;
mod scenario;
mod server;
mod stream;
mod timing;

#[cfg(test)]
mod tests;

pub use profiles::{profile, profile_names};
pub use record::{SimEnd, SimRecord};
pub use scenario::{Brownout, ColdStart, Failure, Scenario, ToolCallSpec, Ttft};
pub use server::{serve_standalone, SimHandle};
