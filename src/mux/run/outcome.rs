//! How a request ends up: failed attempts in the envelope, the error a client gets, the L3
//! answer cache, and the decision record.

use std::time::Duration;

use tokio::time::Instant;

use super::Run;
use crate::mux::attempt::Attempt;
use crate::provider::ProviderError;
use crate::telemetry as t;
use crate::types::{ErrorClass, ErrorEvent, FailedAttempt, FinishReason, Level, StreamEvent};

/// The longest Retry-After a client is told.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

impl Run {
    /// An attempt dropped for a reason that is not its route's fault (the request's own
    /// deadline, the stream-length cap): told in the envelope, never held against the route.
    pub(super) fn record_abandoned(&mut self, attempt: &mut Attempt, err: &ProviderError) {
        attempt.permit = None;
        self.push_failed(attempt, err);
    }

    pub(super) fn record_failure(&mut self, attempt: &mut Attempt, err: &ProviderError) {
        attempt.resolve(Err(err));
        let rejected = attempt.take_rejected();
        self.repair.note(&attempt.route, rejected);
        self.moved_route_failed(&attempt.route);
        metrics::counter!(t::UPSTREAM_ERRORS_TOTAL, "route" => attempt.route.to_string(), "class" => err.metric_label()).increment(1);
        match err.class {
            ErrorClass::Auth => {
                metrics::counter!(t::AUTH_ERRORS_TOTAL, "route" => attempt.route.to_string()).increment(1);
                tracing::error!(route = %attempt.route, status = ?err.status, "upstream rejected tailcut's credentials: check the route's api_key_env");
            }
            ErrorClass::NotFound => {
                metrics::counter!(t::CONFIG_ERRORS_TOTAL, "route" => attempt.route.to_string(), "class" => err.metric_label()).increment(1);
                tracing::error!(route = %attempt.route, status = ?err.status, "upstream does not know this route's model or URL: check the route's model and base_url");
            }
            ErrorClass::Quota => {
                metrics::counter!(t::CONFIG_ERRORS_TOTAL, "route" => attempt.route.to_string(), "class" => err.metric_label()).increment(1);
                tracing::error!(route = %attempt.route, status = ?err.status, "upstream account is out of quota or credit: the route is cooled");
            }
            _ => {}
        }
        self.retry_hints.extend(err.retry_after);
        self.push_failed(attempt, err);
    }

    fn push_failed(&mut self, attempt: &Attempt, err: &ProviderError) {
        let now = Instant::now();
        self.env.fell_back_from.push(FailedAttempt {
            route: attempt.route.to_string(),
            class: err.class,
            status: err.status,
            message: err.message.clone(),
            after_ms: self.since_start(now),
            after_tokens: attempt.tokens,
        });
    }

    /// Every route was tried or passed over: the most telling error for the client.
    pub(super) fn exhausted(&mut self) -> ErrorEvent {
        let fails = &self.env.fell_back_from;
        let now = Instant::now();
        let waits: Vec<Duration> = self.routes.skipped().filter_map(|s| s.1.wait(now)).collect();
        let (class, status, retry_after) = if fails.is_empty() && self.routes.only_deadline_skips() {
            // The client's own deadline left no route enough time: a timeout, not overload
            // (a Retry-After would only make SDKs repeat the same hopeless request).
            (ErrorClass::Timeout, 504, None)
        } else if fails.is_empty() && self.routes.only_cooling_skips() {
            // Every route is cooling after its provider's 429: the client is told to slow
            // down, with the soonest a route recovers as Retry-After.
            (
                ErrorClass::RateLimited,
                429,
                waits.iter().min().copied().or(Some(Duration::from_secs(1))),
            )
        } else if fails.is_empty() {
            (
                ErrorClass::Overloaded,
                503,
                waits.iter().min().copied().or(Some(Duration::from_secs(1))),
            )
        } else if fails.iter().all(|f| f.class == ErrorClass::RateLimited) {
            (ErrorClass::RateLimited, 429, None)
        } else if fails.iter().all(|f| f.class == ErrorClass::ContextLength) && waits.is_empty() {
            // Every route said the prompt is too long (and none was only unavailable: a
            // bigger window that is cooling may serve later): that is the client's to fix.
            (ErrorClass::ContextLength, 400, None)
        } else if fails.iter().any(|f| f.class == ErrorClass::Timeout) {
            (ErrorClass::Timeout, 504, None)
        } else if fails.iter().all(|f| f.status == Some(503)) {
            // Every route said 503: the soonest any of them said to come back, if one did
            // (an upstream's own hint, never a guess).
            (ErrorClass::Unavailable, 503, self.retry_hints.iter().min().copied())
        } else {
            (ErrorClass::Unavailable, 502, None)
        };
        let mut parts: Vec<String> = fails
            .iter()
            .map(|f| match f.status {
                Some(s) => format!("{} ({} {s}: {})", f.route, f.class, f.message),
                None => format!("{} ({}: {})", f.route, f.class, f.message),
            })
            .collect();
        parts.extend(
            self.routes
                .skipped()
                .map(|(r, why, at)| format!("{r} (skipped: {})", why.reason(at))),
        );
        let message = format!("no route could serve the request: {}", parts.join("; "));
        let mut err = ProviderError::new(class, message);
        err.retry_after = retry_after;
        let mut ev = self.error_event(&err);
        ev.status = status;
        ev
    }

    pub(super) fn error_event(&mut self, err: &ProviderError) -> ErrorEvent {
        self.settle_state_hash();
        let mut env = self.env.clone();
        if env.route.is_none() {
            env.level = Level::L4;
        }
        let (message, status) = match err.class {
            ErrorClass::Auth => (
                format!(
                    "gateway configuration error: an upstream rejected tailcut's credentials ({})",
                    err.message
                ),
                502,
            ),
            _ => (err.message.clone(), err.class.http_status()),
        };
        let retry_after = err
            .retry_after
            .or_else(|| {
                (err.class == ErrorClass::RateLimited)
                    .then(|| self.retry_hints.iter().min().copied().unwrap_or(Duration::from_secs(1)))
            })
            // An upstream's absurd hint is not passed on as is.
            .map(|d| d.min(MAX_RETRY_AFTER));
        ErrorEvent {
            code: None,
            class: err.class,
            status,
            message,
            retry_after,
            envelope: env,
        }
    }

    /// The decision record, logged once per request where its outcome is decided.
    pub(super) fn log_outcome(&self, outcome: &str) {
        self.rotation_outcome(outcome);
        let completed = outcome == "completed";
        macro_rules! decided {
            ($level:ident) => {
                tracing::$level!(
            request_id = %self.ctx.request_id,
            model = %self.req.model,
            outcome,
            route = self.env.route.as_deref().unwrap_or("-"),
            level = self.env.level.as_str(),
            attempts = self.attempts,
            hedged = self.env.hedged,
            ttft_ms = self.env.ttft_ms,
            fell_back_from = ?self.env.fell_back_from.iter().map(|f| (&f.route, &f.class, f.status)).collect::<Vec<_>>(),
            skipped = ?self.routes.skipped().map(|(r, why, at)| (r, why.metric_label(), why.reason(at))).collect::<Vec<_>>(),
            plan = %serde_json::to_string(&self.plan).unwrap_or_default(),
            state_hash = %self.env.state_hash,
            family = self.env.family.as_deref().unwrap_or("-"),
            route_changes = ?self.env.route_changes.iter().map(|c| (&c.from, &c.to, c.layer.as_str())).collect::<Vec<_>>(),
            repair = ?self.env.repair.as_ref().map(|r| (&r.route, &r.outcome)),
            "request decided"
                )
            };
        }
        // The decision record: every request at debug, every request that did not simply
        // complete at info.
        if completed {
            decided!(debug);
        } else {
            decided!(info);
        }
    }

    /// A complete cached answer to serve at L3 instead of `err`, when the cache is on.
    pub(super) fn cached_answer(&mut self, err: &ErrorEvent) -> Option<crate::mux::cache::CachedAnswer> {
        if !self.mux.config.cache.enabled
            || matches!(
                err.class,
                ErrorClass::BadRequest | ErrorClass::Auth | ErrorClass::Refusal | ErrorClass::NoRoute
            )
        {
            return None;
        }
        self.mux
            .cache
            .lock()
            .get(self.ctx.tenant.as_deref().unwrap_or(""), &self.req, Instant::now())
    }

    /// The events of a cached answer served at L3.
    pub(super) fn serve_cached(&mut self, answer: crate::mux::cache::CachedAnswer) -> Vec<StreamEvent> {
        self.env.level = Level::L3;
        self.env.route = Some("cache".into());
        self.env.model = Some(answer.served_by.clone());
        self.env.ttft_ms = Some(self.since_start(Instant::now()));
        self.log_outcome("served_from_cache");
        let mut out = vec![StreamEvent::Start(Box::new(self.env.clone()))];
        if !answer.text.is_empty() {
            out.push(StreamEvent::TextDelta(answer.text));
        }
        out.extend(
            answer
                .tool_calls
                .into_iter()
                .map(|call| StreamEvent::ToolCall(Box::new(call))),
        );
        if self.req.include_usage {
            out.extend(answer.usage.map(StreamEvent::Usage));
        }
        out.push(StreamEvent::Finish {
            reason: answer.finish,
            envelope: Box::new(self.env.clone()),
        });
        out
    }

    /// A completed answer: keep it for L3 when the cache is on.
    pub(super) fn remember(&mut self, route: &str, finish: FinishReason) {
        if !self.mux.config.cache.enabled || self.env.level == Level::L3 || self.transcript.overflowed {
            // An answer past the transcript's cap is not held whole: nothing to keep.
            return;
        }
        if self.transcript.thinking || self.transcript.logprobs {
            // The cache keeps text and tool calls: an answer with reasoning or logprobs would
            // come back without them. (A route's fingerprint or tier says nothing of an
            // answer the cache serves.)
            return;
        }
        let answer = crate::mux::cache::CachedAnswer {
            text: self.transcript.text.clone(),
            tool_calls: std::mem::take(&mut self.calls),
            finish,
            usage: self.answer_usage(),
            served_by: route.to_string(),
        };
        let scope = self.ctx.tenant.as_deref().unwrap_or("");
        let _ = self.mux.cache.lock().put(scope, &self.req, answer, Instant::now());
    }
}
