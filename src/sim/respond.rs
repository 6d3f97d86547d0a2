//! Answers one chat request: logs it, finds its scenario, plans it, and returns the wire's
//! error response, stream, or aggregated body.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde_json::Value;
use tokio::time::Instant;

use super::aggregate::{Aggregate, Fault};
use super::answer::random_id;
use super::cache::CacheUse;
use super::continuation::{self, PrefillOutcome, Verdict};
use super::plan::{plan, Context, Plan, Script, StatusError, Wire};
use super::record::{Arrival, RecordGuard, SimEnd};
use super::request::{self, Inbound};
use super::scenario::Scenario;
use super::server::SimState;
use super::stream::{self, Encoder};
use super::timing::Moment;
use super::{anthropic, bodies, openai, reasoning};

/// Everything one response is built from.
struct Reply<'a> {
    state: &'a SimState,
    record: u64,
    wire: Wire,
    /// Our id for this response (`x-request-id` / `request-id` header).
    upstream_id: String,
}

pub(crate) async fn respond(
    state: Arc<SimState>,
    wire: Wire,
    scenario_name: String,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let accepted_at = Instant::now();
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let inbound = match (&parsed, wire) {
        (Some(v), Wire::OpenAi) => request::openai(v),
        (Some(v), Wire::Anthropic) => request::anthropic(v),
        (None, _) => Inbound::default(),
    };
    let record = state.log.arrive(Arrival {
        scenario: scenario_name.clone(),
        wire: wire.as_str(),
        request_id: headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        stream: inbound.stream,
        accepted_at,
        body,
        anthropic_beta: headers
            .get("anthropic-beta")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    });
    let guard = RecordGuard::new(state.log.clone(), record);
    let reply = Reply {
        state: &state,
        record,
        wire,
        upstream_id: format!("req_sim{record:012}"),
    };
    let Some(parsed) = parsed else {
        let error = status_error(400, "The request body is not valid JSON.");
        return reply.error(guard, &error);
    };
    // What a real API refuses before anything else (`strict`), whatever the scenario.
    let beta = headers.get("anthropic-beta").and_then(|v| v.to_str().ok());
    if let Some(error) = super::strict::refusal(wire, &parsed, beta) {
        return reply.error(guard, &error);
    }
    let Some((scenario, number)) = state.next_request(&scenario_name) else {
        let message = format!("The simulator has no scenario named '{scenario_name}'.");
        return reply.error(guard, &status_error(404, &message));
    };
    let clock_ms = state.log.clock().ms(accepted_at) as u64;
    let scenario = match scenario.during(clock_ms) {
        Some(now) => Arc::new(now),
        None => scenario,
    };
    // The request is judged before anything else happens to it, as an API validates first.
    let prefill = inbound.prefill.as_ref();
    let verdict = continuation::judge(&scenario.continuation, wire, prefill);
    let prefill_chars = prefill.map_or(0, |p| p.text.chars().count());
    state.log.update(record, |r| r.prefill_chars = prefill_chars);
    let reading = match verdict {
        Verdict::Answer(reading) => reading,
        Verdict::Refuse(error, outcome) => {
            state.log.update(record, |r| r.continuation = Some(outcome));
            return reply.error(guard, &error);
        }
    };
    let mut rng = SmallRng::seed_from_u64(scenario.seed ^ number);
    // Ids come from the arrival number: unique per simulator, whatever the seeds.
    let mut ids = SmallRng::seed_from_u64(record ^ 0x1d5e_ed00);
    let cx = Context {
        wire,
        moment: Moment {
            request_number: number,
            clock_ms,
        },
        reading,
        asks: &inbound.asks,
    };
    match plan(&scenario, &cx, &mut rng, &mut ids) {
        Plan::Status(error) => reply.error(guard, &error),
        Plan::Stream(script) => {
            state.log.update(record, |r| {
                r.planned_ttft_ms = script.ttft.as_secs_f64() * 1000.0;
                r.continuation = script.continuation;
                r.continued = script.continuation == Some(PrefillOutcome::Exact);
            });
            let scope = format!("{scenario_name}/{}", inbound.model.as_deref().unwrap_or_default());
            let cache = match wire {
                Wire::Anthropic => state.cache.charge(&scope, &parsed, inbound.input_tokens),
                Wire::OpenAi => (CacheUse::default(), inbound.input_tokens),
            };
            let encoder = encoder(wire, &scenario, &inbound, &script, cache, &mut ids);
            if inbound.stream {
                let keepalive = scenario.keepalive_ms.filter(|ms| *ms > 0).map(Duration::from_millis);
                reply.stream(guard, script, encoder, (scenario.chunk_split, keepalive))
            } else {
                reply.aggregated(guard, &script, encoder).await
            }
        }
    }
}

fn status_error(status: u16, message: &str) -> StatusError {
    StatusError::new(status, message)
}

fn encoder(
    wire: Wire,
    scenario: &Scenario,
    inbound: &Inbound,
    script: &Script,
    (cache, uncached): (CacheUse, u32),
    ids: &mut SmallRng,
) -> Encoder {
    let model = scenario
        .model
        .clone()
        .or_else(|| inbound.model.clone())
        .unwrap_or_else(|| "sim-1".to_owned());
    let message = scenario.failure.message.clone();
    match wire {
        Wire::OpenAi => {
            let ident = openai::Identity {
                id: random_id("chatcmpl-", 29, ids),
                created: unix_now(),
                system_fingerprint: openai::fingerprint(&model),
                model,
                input_tokens: inbound.input_tokens,
                service_tier: inbound.service_tier.as_deref().map(openai::served_tier),
            };
            let extras = openai::Extras {
                include_usage: inbound.include_usage,
                role_with_first_tool: scenario.tool_first_with_role,
                logprobs: inbound.logprobs,
                reasoning_field: reasoning::openai_field(scenario.thinking.openai),
                reasoning: script.reasoning,
                reports_reasoning: script.reasoning.tokens > 0,
            };
            Encoder::OpenAi(openai::Encoder::new(ident, extras).with_error_message(message))
        }
        Wire::Anthropic => {
            let ident = anthropic::Identity {
                id: random_id("msg_01", 22, ids),
                model,
                input_tokens: uncached,
                cache,
                hidden_tokens: script.reasoning.hidden,
            };
            Encoder::Anthropic(anthropic::Encoder::new(ident, script.kind, script.thinks, message))
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Reply<'_> {
    /// The wire's error envelope with `status` (and retry headers when set).
    fn error(&self, mut guard: RecordGuard, error: &StatusError) -> Response {
        let status = StatusCode::from_u16(error.status)
            .ok()
            .filter(|s| (200..=599).contains(&s.as_u16()))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let message = error.message.as_deref();
        let body = match self.wire {
            Wire::OpenAi => bodies::openai_error(status.as_u16(), message, error.param.as_deref(), error.code),
            Wire::Anthropic => bodies::anthropic_error(status.as_u16(), message, &self.upstream_id),
        };
        self.state.log.update(self.record, |r| r.status = status.as_u16());
        guard.finish(SimEnd::ErrorStatus);
        let mut response = self.response(status, "application/json", Body::from(body.to_string()));
        let headers = response.headers_mut();
        if let Some(s) = error.retry_after_s {
            headers.insert("retry-after", HeaderValue::from(s));
        }
        if let Some(ms) = error.retry_after_ms {
            headers.insert("retry-after-ms", HeaderValue::from(ms));
        }
        response
    }

    /// A 200 event stream that plays the script.
    /// `framing`: the scenario's `chunk_split` and `keepalive_ms`.
    fn stream(
        &self,
        guard: RecordGuard,
        script: Script,
        encoder: Encoder,
        framing: (Option<usize>, Option<Duration>),
    ) -> Response {
        let body = stream::body(script.steps, script.end, encoder, guard, framing);
        self.response(
            StatusCode::OK,
            "text/event-stream; charset=utf-8",
            Body::from_stream(body),
        )
    }

    /// Waits as long as the stream would take, then answers with one JSON body.
    async fn aggregated(&self, mut guard: RecordGuard, script: &Script, encoder: Encoder) -> Response {
        let agg = Aggregate::of(&script.steps);
        // Dropped here if the client leaves: the guard then records `client_closed`.
        tokio::time::sleep(agg.total_wait).await;
        if agg.output_tokens > 0 || !agg.tool_calls.is_empty() {
            guard.first_token();
        }
        self.state
            .log
            .update(self.record, |r| r.tokens_sent = agg.output_tokens);
        let json = match &encoder {
            Encoder::OpenAi(e) => bodies::openai_completion(e, &agg),
            Encoder::Anthropic(e) => bodies::anthropic_message(e.identity(), &agg),
        };
        let text = json.to_string();
        let body = match agg.fault {
            Some(Fault::InBandError) => {
                let status = match self.wire {
                    Wire::OpenAi => 500,
                    Wire::Anthropic => 529,
                };
                let message = match &encoder {
                    Encoder::OpenAi(e) => e.error_message(),
                    Encoder::Anthropic(e) => e.error_message(),
                };
                let error = StatusError {
                    message: message.map(str::to_owned),
                    ..StatusError::new(status, "")
                };
                return self.error(guard, &error);
            }
            Some(Fault::Drop) => {
                guard.finish(SimEnd::Dropped);
                let broken = futures::stream::once(async {
                    Err::<axum::body::Bytes, _>(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "simulated connection drop",
                    ))
                });
                Body::from_stream(broken)
            }
            Some(Fault::Malformed) => {
                guard.finish(SimEnd::Truncated);
                let half = text.len() / 2;
                Body::from(text.as_bytes()[..half].to_vec())
            }
            None => {
                guard.finish(SimEnd::Completed);
                Body::from(text)
            }
        };
        self.response(StatusCode::OK, "application/json", body)
    }

    fn response(&self, status: StatusCode, content_type: &'static str, body: Body) -> Response {
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        let id_header = match self.wire {
            Wire::OpenAi => "x-request-id",
            Wire::Anthropic => "request-id",
        };
        if let Ok(value) = HeaderValue::from_str(&self.upstream_id) {
            headers.insert(id_header, value);
        }
        response
    }
}
