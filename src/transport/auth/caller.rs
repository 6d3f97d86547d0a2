//! An authenticated caller (or, without `[auth]`, anyone) and what admitting one of its
//! requests holds: the checks of step 2 (`Caller::admit`) and the guard of step 3
//! (`Admission::guard`); see the `auth` module doc.

use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::{refused, token_cost, Across, KeyEntry, Refusal};
use crate::gateway::GatewayError;
use crate::shared::leases::Lease;
use crate::transport::error::ErrorReply;
use crate::types::{ChatRequest, EventStream, RequestCtx};

/// How a caller proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Key,
    Token,
}

/// An authenticated caller (or, without `[auth]`, anyone).
#[derive(Clone)]
pub struct Caller {
    pub(super) authed: Option<Authed>,
    pub(super) across: Option<Arc<Across>>,
}

#[derive(Clone)]
pub(super) struct Authed {
    pub(super) key: Arc<KeyEntry>,
    pub(super) via: Via,
    /// A token's own model list, within its key's.
    pub(super) token_models: Option<Vec<String>>,
    /// A token's expiry (unix seconds) and the clock it is read by: a WebSocket outlives the
    /// upgrade its token was checked at, and each request on it is checked again.
    pub(super) expires: Option<(u64, super::token::Clock)>,
}

/// A request let in: holds its stream slot, if its key limits streams.
#[must_use = "guard the answer's stream with it"]
pub struct Admission {
    pub(super) slot: Option<OwnedSemaphorePermit>,
    /// The key's lease of a stream across instances, when Redis granted one.
    pub(super) lease: Option<Lease>,
}

impl Caller {
    /// The name of the caller's key; `None` without `[auth]`.
    pub fn key_name(&self) -> Option<&str> {
        self.authed.as_ref().map(|a| a.key.config.name.as_str())
    }

    pub fn via(&self) -> Option<Via> {
        self.authed.as_ref().map(|a| a.via)
    }

    /// May this caller use `model`? Its key's list, narrowed by its token's.
    pub fn may_use(&self, model: &str) -> bool {
        self.authed.as_ref().is_none_or(|a| {
            a.key.config.may_use(model) && a.token_models.as_ref().is_none_or(|m| m.iter().any(|x| x == model))
        })
    }

    /// The model check of step 2 alone, for a request that runs no model
    /// (`POST /v1/messages/count_tokens`): refused (403) as `admit` refuses it, logged and
    /// counted once; no limit is taken.
    pub fn check_model(&self, model: &str) -> Result<(), Refusal> {
        if self.may_use(model) {
            return Ok(());
        }
        let refusal = Refusal::Model(model.to_string());
        refused(&refusal, self.key_name());
        Err(refusal)
    }

    /// Checks that a token has not expired since it was presented, and the tenant the context
    /// names (from `x-tailcut-tenant`) against the key's, then sets the key's tenant and name
    /// and caps the priority. Idempotent.
    pub fn bind(&self, ctx: &mut RequestCtx) -> Result<(), Refusal> {
        let Some(a) = &self.authed else { return Ok(()) };
        if a.expires.is_some_and(|(exp, clock)| clock.now_unix() >= exp) {
            return Err(Refusal::ExpiredToken);
        }
        let key = &a.key.config;
        ctx.key = Some(key.name.clone());
        if ctx.tenant.as_ref().is_some_and(|t| *t != key.tenant) {
            return Err(Refusal::Tenant);
        }
        ctx.tenant = Some(key.tenant.clone());
        if let Some(cap) = key.priority {
            ctx.priority = ctx.priority.min(cap);
        }
        Ok(())
    }

    /// Step 2: the decoded request against the key's models, streams and rates: across
    /// instances while Redis answers (`across`), else this instance's own.
    pub async fn admit(&self, req: &ChatRequest, ctx: &mut RequestCtx) -> Result<Admission, Refusal> {
        let admitted = match &self.across {
            Some(across) if across.shared.is_up() => self.admit_across(across, req, ctx, Instant::now()).await,
            _ => self.admit_at(req, ctx, Instant::now()),
        };
        if let Err(refusal) = &admitted {
            refused(refusal, self.key_name());
        }
        admitted
    }

    /// Step 2 against this instance's limits only (WebSocket requests while Redis is down).
    pub fn admit_local(&self, req: &ChatRequest, ctx: &mut RequestCtx) -> Result<Admission, Refusal> {
        let admitted = self.admit_at(req, ctx, Instant::now());
        if let Err(refusal) = &admitted {
            refused(refusal, self.key_name());
        }
        admitted
    }

    pub(super) fn admit_at(&self, req: &ChatRequest, ctx: &mut RequestCtx, now: Instant) -> Result<Admission, Refusal> {
        self.bind(ctx)?;
        let Some(a) = &self.authed else {
            return Ok(Admission {
                slot: None,
                lease: None,
            });
        };
        let slot = self.local_slot(a, req)?;
        a.key.limits.lock().take(now, token_cost(req))?;
        Ok(Admission { slot, lease: None })
    }

    /// The model check and a slot of the key's local `max_streams`.
    pub(super) fn local_slot(&self, a: &Authed, req: &ChatRequest) -> Result<Option<OwnedSemaphorePermit>, Refusal> {
        if !self.may_use(&req.model) {
            return Err(Refusal::Model(req.model.clone()));
        }
        let slot = match (&a.key.streams, a.key.config.max_streams) {
            (Some(streams), Some(max)) => Some(
                Arc::clone(streams)
                    .try_acquire_owned()
                    .map_err(|_| Refusal::Streams(max))?,
            ),
            _ => None,
        };
        Ok(slot)
    }
}

impl Caller {
    /// Wraps `chat` so each request it is given is admitted first (step 2 and 3 for a
    /// WebSocket); a request refused here (a model the key may not use, the key's
    /// `max_streams`, its rates) is the error the session answers for that request's id,
    /// with no `accepted` before it, as is the gateway's own refusal. With Redis, the
    /// shared lease and rates are taken when the answer stream is first polled, before
    /// anything runs (`across`): a refusal there comes after `accepted`, as the stream's
    /// error.
    pub fn gated<F>(self, mut chat: F) -> impl FnMut(ChatRequest, RequestCtx) -> Result<EventStream, ErrorReply> + Send
    where
        F: FnMut(ChatRequest, RequestCtx) -> Result<EventStream, GatewayError> + Send,
    {
        move |req, mut ctx| match self.across.clone().filter(|a| a.shared.is_up()) {
            Some(across) => self.admit_deferred(across, req, ctx, &mut chat),
            None => match self.admit_local(&req, &mut ctx) {
                Ok(admission) => chat(req, ctx)
                    .map(|events| admission.guard(events))
                    .map_err(|e| ErrorReply::from_gateway(&e)),
                Err(refusal) => Err(refusal.reply()),
            },
        }
    }
}

impl Admission {
    /// Step 3: the answer's events, holding the stream slot until they are dropped.
    pub fn guard(self, events: EventStream) -> EventStream {
        match (self.slot, self.lease) {
            (None, None) => events,
            (slot, lease) => Box::pin(events.map(move |event| {
                let _held = (&slot, &lease);
                event
            })),
        }
    }
}
