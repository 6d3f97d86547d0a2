//! Who may use the edge: client keys bound to tenants, browser tokens minted from them, the
//! per-key limits, and the admin token of the private ops routes.
//!
//! With `[auth]`, every chat request carries a key (`Authorization: Bearer` for the OpenAI
//! SDKs, `x-api-key` for the Anthropic ones) or a token (the same headers, or `?token=` on
//! `GET /v1/stream` and the `GET /v1/ws` upgrade, where a browser cannot set headers).
//! Without it everything is served as it comes, and the server listens on loopback only
//! (`Config::refuses_listen`). Each chat endpoint takes three steps:
//! 1. `Access::authorize`, before the body is decoded: the credential (missing, wrong or
//!    expired → 401); `x-tailcut-tenant`, which may only name the key's own tenant (any
//!    other name, existing or not, gets the same 403, so tenant names cannot be probed);
//!    then the context gets the key's tenant, its name and its priority cap.
//! 2. `Caller::admit`, once the request is decoded: the key's (and the token's) models
//!    (403), a slot of the key's `max_streams` (429), its `rpm` and `tpm` (429 with
//!    Retry-After). A refused request takes nothing from any limit.
//! 3. `Admission::guard` wraps the answer's event stream, so the stream slot is held until
//!    the answer is dropped (finished, failed or disconnected).
//!
//! Limits (`limits`): rpm and tpm are GCRA limiters over `tokio::time::Instant` bursting to a
//! minute's worth. With `[state] redis_url` they hold across instances (`across`): the same
//! GCRA runs in Redis, stream slots are leased there, and while Redis does not answer each
//! instance goes by its local limiter and semaphore alone. tpm counts, before the request runs, its estimated input tokens plus its
//! `max_tokens` (or the router's default output reserve); actual usage is not settled
//! afterwards. A request that alone exceeds the tpm can never pass: a 400, not a 429. A
//! full `max_streams` is a 429 with `Retry-After: 1`, not a 503: the key is at its limit, not
//! tailcut, and a 503 would tell clients and operators the server is overloaded.
//!
//! Secrets: keys are kept and compared as SHA-256 digests, in constant time (`subtle`);
//! tokens are HMAC-SHA256 (`token`, checked by `hmac`'s constant-time verify). Neither is
//! ever put in a response, a log line or a metric: logs name the key (`name`).

mod across;
mod caller;
mod credential;
pub mod keygen;
mod limits;
mod mint;
mod refusal;
pub mod token;

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::http::{header, HeaderMap};
use parking_lot::Mutex;
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use caller::Authed;
pub use caller::{Admission, Caller, Via};
pub use credential::{admin_bearer, query_token, redact_token_param, same_secret};
pub use limits::{token_cost, Limit};
pub use mint::mint;
pub use refusal::Refusal;

use crate::config::{Config, KeyConfig};
use crate::shared::leases::StreamLeases;
use crate::shared::Shared;
use crate::types::RequestCtx;
use credential::Presented;
use limits::KeyLimits;
use token::{Claims, Clock, Signer, TokenError};

/// Counts refused requests by reason (the `Refusal` code).
pub const AUTH_REFUSALS_TOTAL: &str = "tailcut_auth_refusals_total";

/// The keys, their live limits and the token signer; one per server, in `AppState`.
pub struct Access {
    /// `None`: no `[auth]`, every request is served as it comes.
    keys: Option<Vec<Arc<KeyEntry>>>,
    signer: Option<Signer>,
    /// Why tokens are off, when they are.
    tokens_off: &'static str,
    clock: Clock,
    models: BTreeSet<String>,
    /// Limits shared with other instances, with `[state] redis_url`.
    across: Option<Arc<Across>>,
    lease_ttl: std::time::Duration,
}

/// The shared-state handle and this instance's stream leases on it.
struct Across {
    shared: Arc<Shared>,
    leases: Arc<StreamLeases>,
}

/// One `[[auth.keys]]` entry and its state.
struct KeyEntry {
    config: KeyConfig,
    limits: Mutex<KeyLimits>,
    streams: Option<Arc<Semaphore>>,
}

impl Access {
    /// Builds the key table from `[auth]` and reads the token secret from its variable.
    pub fn new(config: &Config) -> Self {
        metrics::describe_counter!(
            AUTH_REFUSALS_TOTAL,
            "Client requests refused by access checks, by reason"
        );
        let models = config.models.keys().cloned().collect();
        let Some(auth) = &config.auth else {
            return Access {
                keys: None,
                signer: None,
                tokens_off: "no [auth] is configured, so no key or token is needed",
                clock: Clock::new(),
                models,
                across: None,
                lease_ttl: config.state.lease_ttl,
            };
        };
        let keys = auth
            .keys
            .iter()
            .map(|k| {
                Arc::new(KeyEntry {
                    limits: Mutex::new(KeyLimits::new(k.rpm, k.tpm)),
                    streams: k.max_streams.map(|n| Arc::new(Semaphore::new(n as usize))),
                    config: k.clone(),
                })
            })
            .collect();
        let (signer, tokens_off) = match &auth.token_secret_env {
            None => (None, "set auth.token_secret_env to enable them"),
            Some(var) => match std::env::var(var)
                .ok()
                .as_deref()
                .and_then(|s| Signer::new(s.as_bytes()))
            {
                Some(signer) => (Some(signer), ""),
                None => {
                    tracing::warn!(
                        var = %var,
                        min_bytes = token::MIN_SECRET_BYTES,
                        "auth.token_secret_env names a variable that is unset or too short; browser tokens are off"
                    );
                    (
                        None,
                        "the variable auth.token_secret_env names is unset or shorter than 32 bytes",
                    )
                }
            },
        };
        Access {
            keys: Some(keys),
            signer,
            tokens_off,
            clock: Clock::new(),
            models,
            across: None,
            lease_ttl: config.state.lease_ttl,
        }
    }

    /// Shares the keys' limits with other instances through `shared` (and starts renewing
    /// this instance's stream leases). Without `[auth]` there is nothing to share.
    pub fn with_shared(mut self, shared: Option<&Arc<Shared>>) -> Self {
        if let (Some(shared), true) = (shared, self.is_on()) {
            self.across = Some(Arc::new(Across {
                leases: StreamLeases::start(Arc::clone(shared), self.lease_ttl),
                shared: Arc::clone(shared),
            }));
        }
        self
    }

    /// Is `[auth]` on?
    pub fn is_on(&self) -> bool {
        self.keys.is_some()
    }

    /// Step 1 for a chat endpoint: who is calling, checked against the tenant it names; the
    /// context then carries the key's tenant, name and priority cap.
    pub fn authorize(
        &self,
        headers: &HeaderMap,
        query_token: Option<&str>,
        ctx: &mut RequestCtx,
    ) -> Result<Caller, Refusal> {
        let caller = self.caller(headers, query_token).and_then(|c| c.bind(ctx).map(|()| c));
        if let Err(refusal) = &caller {
            refused(refusal, ctx.key.as_deref());
        }
        caller
    }

    /// Who is calling, by the credential the request presents.
    pub fn caller(&self, headers: &HeaderMap, query_token: Option<&str>) -> Result<Caller, Refusal> {
        let Some(keys) = &self.keys else {
            return Ok(Caller {
                authed: None,
                across: None,
            });
        };
        let authed = self.resolve(keys, credential::presented(headers, query_token))?;
        // The first credential by precedence is the one used (`Authorization`, `x-api-key`,
        // then `?token=`), but every one presented must be valid: a client would otherwise
        // never learn that the token its page holds, or a second header, is wrong or expired.
        let header_key = headers.get(header::AUTHORIZATION).is_some() || headers.get("x-api-key").is_some();
        if headers.get(header::AUTHORIZATION).is_some() {
            if let Some(api_key) = headers.get("x-api-key") {
                let mut only = HeaderMap::new();
                only.insert("x-api-key", api_key.clone());
                self.resolve(keys, credential::presented(&only, None))?;
            }
        }
        if let Some(token) = query_token.filter(|t| header_key && !t.trim().is_empty()) {
            self.resolve(keys, credential::presented(&HeaderMap::new(), Some(token)))?;
        }
        Ok(Caller {
            authed: Some(authed),
            across: self.across.clone(),
        })
    }

    /// The key a presented credential is, if it is a valid one.
    fn resolve(&self, keys: &[Arc<KeyEntry>], presented: Presented<'_>) -> Result<Authed, Refusal> {
        match presented {
            Presented::Nothing => Err(Refusal::MissingKey),
            Presented::Unreadable => Err(Refusal::BadKey),
            Presented::KeyInUrl => Err(Refusal::KeyInUrl),
            Presented::Repeated(name) => Err(Refusal::Repeated(name)),
            Presented::Key(key) => Ok(Authed {
                key: find_key(keys, &credential::sha256(key)).ok_or(Refusal::BadKey)?,
                via: Via::Key,
                token_models: None,
                expires: None,
            }),
            Presented::Token(token) => self.token_caller(keys, token),
        }
    }

    fn token_caller(&self, keys: &[Arc<KeyEntry>], token: &str) -> Result<Authed, Refusal> {
        let signer = self.signer.as_ref().ok_or(Refusal::BadToken)?;
        let claims = signer.verify(token, self.clock.now_unix()).map_err(|e| match e {
            TokenError::Expired => Refusal::ExpiredToken,
            TokenError::Invalid => Refusal::BadToken,
        })?;
        // A key removed, moved to another tenant or replaced under its name (rotated) since
        // takes its tokens with it.
        let key = keys
            .iter()
            .find(|k| {
                k.config.name == claims.key
                    && k.config.tenant == claims.tenant
                    && token::key_fingerprint(&k.config.sha256) == claims.key_fp
            })
            .ok_or(Refusal::BadToken)?;
        Ok(Authed {
            key: Arc::clone(key),
            via: Via::Token,
            token_models: claims.models,
            expires: Some((claims.exp, self.clock)),
        })
    }

    fn sign(&self, claims: &Claims) -> Option<String> {
        self.signer.as_ref().map(|s| s.sign(claims))
    }
}

/// The entry whose hash is `digest`. Every entry is compared, in constant time each.
fn find_key(keys: &[Arc<KeyEntry>], digest: &[u8; 32]) -> Option<Arc<KeyEntry>> {
    let mut found = None;
    for key in keys {
        if bool::from(key.config.sha256.ct_eq(digest)) {
            found = Some(Arc::clone(key));
        }
    }
    found
}

/// Logs and counts a refusal once, where it is decided: by reason and key name, never the
/// credential.
fn refused(refusal: &Refusal, key: Option<&str>) {
    metrics::counter!(AUTH_REFUSALS_TOTAL, "reason" => refusal.metric_label()).increment(1);
    match refusal.class() {
        crate::types::ErrorClass::Unauthenticated => {
            tracing::debug!(reason = refusal.metric_label(), "request refused")
        }
        _ => tracing::info!(
            reason = refusal.metric_label(),
            key = key.unwrap_or("-"),
            "request refused"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ChatRequest, Dialect, Message, Priority, Role};
    use axum::http::HeaderValue;
    use std::time::Duration;
    use tokio::time::Instant;

    const KEY: &str = "tc_test-key-0123456789";

    fn access(key_extra: &str) -> Access {
        let toml = format!(
            "[[routes]]\nname = \"a\"\nprovider = \"simulated\"\n[models.chat]\nroutes = [\"a\"]\n\
             [models.other]\nroutes = [\"a\"]\n[tenants.acme]\n[tenants.globex]\n\
             [auth]\n[[auth.keys]]\nname = \"app\"\nsha256 = \"{}\"\ntenant = \"acme\"\n{key_extra}",
            hex::encode(credential::sha256(KEY))
        );
        Access::new(&crate::config::load_str(&toml).expect("valid config"))
    }

    fn with_key(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static(KEY));
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("value"));
        }
        h
    }

    fn chat(model: &str) -> ChatRequest {
        ChatRequest {
            model: model.into(),
            messages: vec![Message::text(Role::User, "hi")],
            max_tokens: Some(10),
            ..ChatRequest::default()
        }
    }

    #[test]
    fn the_key_decides_the_tenant_and_caps_the_priority() {
        let access = access("priority = \"batch\"\n");
        let mut ctx = RequestCtx::new(Dialect::OpenAi);
        let caller = access.authorize(&with_key(&[]), None, &mut ctx).expect("a known key");
        assert_eq!(ctx.tenant.as_deref(), Some("acme"), "the key's tenant");
        assert_eq!(ctx.key.as_deref(), Some("app"), "the key's name");
        assert_eq!(ctx.priority, Priority::Batch, "capped");
        assert_eq!(caller.via(), Some(Via::Key), "by key");
        for tenant in ["globex", "nobody"] {
            let mut ctx = RequestCtx::new(Dialect::OpenAi);
            ctx.tenant = Some(tenant.into());
            assert_eq!(
                access.authorize(&with_key(&[]), None, &mut ctx).err(),
                Some(Refusal::Tenant),
                "{tenant}: forbidden and unknown tenants are refused alike"
            );
        }
        let mut ctx = RequestCtx::new(Dialect::OpenAi);
        ctx.tenant = Some("acme".into());
        assert!(
            access.authorize(&with_key(&[]), None, &mut ctx).is_ok(),
            "its own tenant"
        );
    }

    #[test]
    fn wrong_or_missing_keys_are_refused() {
        let access = access("");
        let mut ctx = RequestCtx::new(Dialect::OpenAi);
        assert_eq!(
            access.authorize(&HeaderMap::new(), None, &mut ctx).err(),
            Some(Refusal::MissingKey)
        );
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer tc_wrong"));
        assert_eq!(access.authorize(&h, None, &mut ctx).err(), Some(Refusal::BadKey));
        assert_eq!(
            access.authorize(&HeaderMap::new(), Some(KEY), &mut ctx).err(),
            Some(Refusal::KeyInUrl),
            "never a key in a URL"
        );
    }

    #[test]
    fn without_auth_everyone_is_let_in_unchanged() {
        let toml = "[[routes]]\nname = \"a\"\nprovider = \"simulated\"\n[models.chat]\nroutes = [\"a\"]\n";
        let access = Access::new(&crate::config::load_str(toml).expect("valid"));
        let mut ctx = RequestCtx::new(Dialect::OpenAi);
        ctx.tenant = Some("whoever".into());
        let caller = access.authorize(&HeaderMap::new(), None, &mut ctx).expect("open");
        assert_eq!(ctx.tenant.as_deref(), Some("whoever"), "the gateway judges the tenant");
        assert!(caller.admit_local(&chat("anything"), &mut ctx).is_ok(), "no limits");
        assert!(!access.is_on(), "off");
    }

    #[test]
    fn models_streams_and_rates_are_the_keys() {
        let access = access("models = [\"chat\"]\nmax_streams = 1\nrpm = 2\n");
        let mut ctx = RequestCtx::new(Dialect::OpenAi);
        let caller = access.authorize(&with_key(&[]), None, &mut ctx).expect("key");
        let now = Instant::now();
        assert_eq!(
            caller.admit_at(&chat("other"), &mut ctx, now).err(),
            Some(Refusal::Model("other".into())),
            "off the allowlist"
        );
        let first = caller.admit_at(&chat("chat"), &mut ctx, now).expect("first");
        assert_eq!(
            caller.admit_at(&chat("chat"), &mut ctx, now).err(),
            Some(Refusal::Streams(1)),
            "one stream at a time"
        );
        drop(first);
        let second = caller.admit_at(&chat("chat"), &mut ctx, now).expect("the slot is back");
        drop(second);
        assert_eq!(
            caller.admit_at(&chat("chat"), &mut ctx, now).err(),
            Some(Refusal::RateLimited {
                limit: Limit::Rpm,
                per_minute: 2,
                wait: Duration::from_secs(30)
            }),
            "two a minute"
        );
    }
}
