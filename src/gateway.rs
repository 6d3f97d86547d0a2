//! The one transport-agnostic entry point: `ChatRequest` + `RequestCtx` -> `EventStream`.
//! Every transport calls `Gateway::chat`; the gateway copies what planning reads (prompt
//! size, route health, the session's lease), asks the router for a plan over those copies
//! with no lock held, and hands the plan to the mux.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{Config, ProviderKind, Wire};
use crate::health::Health;
use crate::mux::tool_calls::{Gates, SchemaRefusal};
use crate::mux::Mux;
use crate::provider::anthropic::AnthropicProvider;
use crate::provider::openai::OpenAiProvider;
use crate::provider::{self, SharedProvider};
use crate::sim::SimHandle;
use crate::types::{
    ChatRequest, Envelope, ErrorClass, ErrorEvent, EventStream, ExclusionCode, LeaseUpdate, Level, Plan, RequestCtx,
    StreamEvent,
};
use crate::{router, telemetry};

mod headers;

pub(crate) use headers::CONTROL_HEADERS;

/// A request refused before any stream exists.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    #[error("unknown model {model:?}; known models: {}", known.join(", "))]
    UnknownModel { model: String, known: Vec<String> },
    #[error("{0}")]
    BadRequest(String),
    /// A request header's value is refused: `header` names it (OpenAI's `param`).
    #[error("{message}")]
    BadHeader { header: &'static str, message: String },
    #[error("tailcut is at capacity; retry shortly")]
    Overloaded { retry_after: Duration },
    /// A tool's parameters or the response format's schema do not compile, or not within
    /// the request's pattern budget.
    #[error("{0}")]
    InvalidSchema(SchemaRefusal),
}

impl GatewayError {
    /// The HTTP status, as in `docs/errors.md`: an unknown model is a 404, as OpenAI and
    /// Anthropic answer it.
    pub fn status(&self) -> u16 {
        match self {
            GatewayError::UnknownModel { .. } => 404,
            GatewayError::BadRequest(_) | GatewayError::BadHeader { .. } | GatewayError::InvalidSchema(_) => 400,
            GatewayError::Overloaded { .. } => 503,
        }
    }

    pub fn class(&self) -> ErrorClass {
        match self {
            GatewayError::UnknownModel { .. }
            | GatewayError::BadRequest(_)
            | GatewayError::BadHeader { .. }
            | GatewayError::InvalidSchema(_) => ErrorClass::BadRequest,
            GatewayError::Overloaded { .. } => ErrorClass::Overloaded,
        }
    }

    /// A refused value of the request header `header`.
    pub fn bad_header(header: &'static str, message: impl Into<String>) -> Self {
        GatewayError::BadHeader {
            header,
            message: message.into(),
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            GatewayError::Overloaded { retry_after } => Some(*retry_after),
            _ => None,
        }
    }
}

/// Public model listing entry (`GET /v1/models`).
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub name: String,
    pub routes: Vec<String>,
}

/// The gateway: config, health and the mux, shared by every transport.
pub struct Gateway {
    config: Arc<Config>,
    health: Arc<Health>,
    mux: Arc<Mux>,
}

/// A reason the server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("route {route}: environment variable {var} (api_key_env) is not set")]
    MissingKey { route: String, var: String },
    #[error("route {route}: no base_url and no simulated upstream to serve it")]
    NoUpstream { route: String },
    #[error("simulated upstream: {0}")]
    Sim(std::io::Error),
    #[error("refusing to listen on {addr} with no [auth]: anyone who can reach it could spend the routes' provider keys. Add client keys (`tailcut keys new --tenant NAME` prints one and its [[auth.keys]] lines), listen on 127.0.0.1, or set server.allow_unauthenticated = true (tailcut serve --allow-unauthenticated) to serve it open anyway")]
    Unauthenticated { addr: SocketAddr },
}

impl Gateway {
    /// Builds the gateway. Simulated routes are pointed at `sim` (the in-process simulated
    /// upstream), reached over loopback through the same adapters real routes use.
    pub fn new(config: Arc<Config>, sim: Option<&SimHandle>) -> Result<Self, StartError> {
        let client = provider::http_client();
        let mut providers: HashMap<String, SharedProvider> = HashMap::new();
        for route in &config.routes {
            let base_url = match (route.provider, &route.base_url, sim) {
                (_, Some(url), _) => url.clone(),
                (ProviderKind::Simulated, None, Some(sim)) => {
                    let scenario = route.scenario.as_deref().unwrap_or("fast-stable");
                    match route.wire {
                        Wire::OpenAi => sim.openai_base_url(scenario),
                        Wire::Anthropic => sim.anthropic_base_url(scenario),
                    }
                }
                _ => {
                    return Err(StartError::NoUpstream {
                        route: route.name.clone(),
                    })
                }
            };
            let api_key = match &route.api_key_env {
                Some(var) => match std::env::var(var) {
                    Ok(key) if !key.is_empty() => {
                        // Upstream text is redacted against every configured key, exactly.
                        if !provider::register_secret(&key) {
                            tracing::warn!(
                                route = %route.name,
                                min_chars = provider::MIN_SECRET_CHARS,
                                "the route's key is too short to redact exactly; only key shapes are redacted"
                            );
                        }
                        Some(key)
                    }
                    _ => {
                        return Err(StartError::MissingKey {
                            route: route.name.clone(),
                            var: var.clone(),
                        })
                    }
                },
                None => None,
            };
            let client = if route.http2_prior_knowledge {
                client.with_http2_prior_knowledge()
            } else {
                client.clone()
            };
            let client = client.with_connect_timeout(route.connect_timeout);
            let p: SharedProvider = match route.wire {
                Wire::OpenAi => Arc::new(OpenAiProvider::with_rules(
                    base_url,
                    route.model.clone(),
                    api_key,
                    client,
                    route.rules.clone(),
                )),
                Wire::Anthropic => Arc::new(AnthropicProvider::with_rules(
                    base_url,
                    route.model.clone(),
                    api_key,
                    client,
                    route.rules.clone(),
                )),
            };
            providers.insert(route.name.clone(), p);
        }
        Ok(Self::with_providers(config, providers))
    }

    /// Builds the gateway over given providers (tests inject their own).
    pub fn with_providers(config: Arc<Config>, providers: HashMap<String, SharedProvider>) -> Self {
        router::warm_tokenizers(&config);
        let health = Arc::new(Health::new(&config, Instant::now()));
        let mux = Arc::new(Mux::new(Arc::clone(&config), Arc::clone(&health), providers));
        Gateway { config, health, mux }
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// The mux, for the background prober (`mux::probe`), which probes through its providers.
    pub fn mux(&self) -> &Arc<Mux> {
        &self.mux
    }

    /// Plans the request and returns its event stream. The first event is `Start` (commit)
    /// or `Error` (nothing was committed: render it as an HTTP error).
    pub fn chat(&self, req: ChatRequest, mut ctx: RequestCtx) -> Result<EventStream, GatewayError> {
        if !self.config.models.contains_key(&req.model) {
            return Err(GatewayError::UnknownModel {
                model: req.model,
                known: self.config.models.keys().cloned().collect(),
            });
        }
        if req.messages.is_empty() {
            return Err(GatewayError::BadRequest("messages must not be empty".into()));
        }
        // The request's schemas, compiled here once for all its attempts (and refused here
        // when they do not compile, or not within its pattern budget).
        let gates = Gates::compile(&req).map_err(GatewayError::InvalidSchema)?;
        match self.mux.metrics.model(&req.model) {
            Some(m) => m.requests().increment(1),
            None => metrics::counter!(telemetry::REQUESTS_TOTAL, "model" => req.model.clone()).increment(1),
        }
        let now = Instant::now();
        let tenant = match ctx.tenant.as_deref() {
            Some(name) => Some(router::tenant_defaults(&self.config, name).ok_or_else(|| {
                GatewayError::bad_header(
                    "x-tailcut-tenant",
                    format!("unknown tenant {name:?} (x-tailcut-tenant)"),
                )
            })?),
            None => None,
        };
        if let Some(t) = tenant {
            router::apply_tenant(&mut ctx, t);
        }
        // A session names a lease within its tenant: two tenants' "user-1" are two sessions.
        // (The separator is a control character, which no header value carries.)
        ctx.session = ctx
            .session
            .take()
            .map(|s| format!("{}\u{1f}{s}", ctx.tenant.as_deref().unwrap_or_default()));
        // A client may shorten its deadline, never extend it past the server's.
        ctx.deadline = Some(
            ctx.deadline
                .map_or(self.config.server.deadline, |d| d.min(self.config.server.deadline)),
        );
        let mut needs = router::Requirements::from_ctx(&ctx).with_task(ctx.task.as_deref());
        if let Some(t) = tenant {
            needs = needs.with_tenant(t);
        }
        let planned = self.plan(&req, &needs, ctx.session.as_deref(), now);
        let active = ActiveStream::open(self.mux.metrics.active_streams());
        let stream = match planned {
            Ok(plan) => self.mux.run(req, ctx, plan, gates, active),
            Err(e) => {
                crate::telemetry::rotation::none_eligible(e.exclusions());
                // A prompt too long for every route is the client's to shorten: say so in the
                // terms the SDKs know (`context_length_exceeded`), not as a routing failure.
                let too_long = e
                    .exclusions()
                    .iter()
                    .all(|x| x.codes.contains(&ExclusionCode::ContextLength));
                let event = StreamEvent::Error(Box::new(ErrorEvent {
                    code: None,
                    class: if too_long {
                        ErrorClass::ContextLength
                    } else {
                        ErrorClass::NoRoute
                    },
                    status: 400,
                    message: e.to_string(),
                    retry_after: None,
                    envelope: Envelope {
                        request_id: ctx.request_id,
                        level: Level::L4,
                        state_hash: crate::types::state_hash(&req).into(),
                        ..Envelope::default()
                    },
                }));
                Box::pin(async_stream::stream! {
                    let _active = active;
                    yield event;
                }) as EventStream
            }
        };
        Ok(stream)
    }

    /// The request path's plan: measure the prompt, copy the model's route health and the
    /// session's lease, plan over those copies with no lock held, then apply the plan's lease
    /// revocation. Locks taken: each route's health lock once, briefly (its view); the lease
    /// table at most twice, briefly (copy the entry; apply a revocation), and only for a
    /// session with leases on. Tokenizing happens before any of them.
    fn plan(
        &self,
        req: &ChatRequest,
        needs: &router::Requirements,
        session: Option<&str>,
        now: Instant,
    ) -> Result<Plan, router::RouteError> {
        let prompt = router::count_prompt(&self.config, req);
        let routes = router::model_routes(&self.config, req);
        let health = self.health.views(routes.iter().map(String::as_str), now);
        let session = session.filter(|_| self.config.leases.enabled);
        let lease = session.and_then(|s| self.mux.leases.lock().get(s));
        let snapshot = router::Snapshot {
            config: &self.config,
            health: &health,
            lease: lease.as_ref(),
            now,
        };
        let plan = router::plan_over(&snapshot, req, needs, &prompt)?;
        if let (Some(session), LeaseUpdate::Revoke { .. }) = (session, &plan.lease_update) {
            self.mux.leases.lock().apply(session, &plan.lease_update);
        }
        Ok(plan)
    }

    pub fn models(&self) -> Vec<ModelInfo> {
        self.config
            .models
            .iter()
            .map(|(name, m)| ModelInfo {
                name: name.clone(),
                routes: m.routes.clone(),
            })
            .collect()
    }
}

/// Counts one open client stream in `tailcut_active_streams` for as long as it lives. The
/// stream holds it (`Mux::run`'s guard) rather than being wrapped: no second boxed stream
/// per request, no forwarding poll per event.
struct ActiveStream(metrics::Gauge);

impl ActiveStream {
    fn open(gauge: &metrics::Gauge) -> Self {
        gauge.increment(1.0);
        ActiveStream(gauge.clone())
    }
}

impl Drop for ActiveStream {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
