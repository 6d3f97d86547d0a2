//! Admission against limits shared with other instances: a lease of the key's `max_streams`
//! and one GCRA over its rpm and tpm, both in Redis. Each step that gets no answer from Redis
//! falls back to this instance's own semaphore or limiter, so a request never fails because
//! Redis is down. The local semaphore applies either way.

use std::sync::Arc;

use futures::StreamExt;
use tokio::time::Instant;

use super::limits::{token_cost, Limit};
use super::{refused, Across, Admission, Authed, Caller, Refusal};
use crate::gateway::GatewayError;
use crate::shared::gcra::{Verdict, Which};
use crate::shared::leases::Lease;
use crate::transport::error::ErrorReply;
use crate::types::{ChatRequest, EventStream, RequestCtx};

impl Caller {
    /// Step 2 with Redis: models, the local stream slot, the shared stream lease, then the
    /// shared rates. A refused request takes nothing: a lease already taken is released when
    /// the refusal drops it, and the script writes nothing when it refuses.
    pub(super) async fn admit_across(
        &self,
        across: &Across,
        req: &ChatRequest,
        ctx: &mut RequestCtx,
        now: Instant,
    ) -> Result<Admission, Refusal> {
        self.bind(ctx)?;
        let Some(a) = &self.authed else {
            return Ok(Admission {
                slot: None,
                lease: None,
            });
        };
        let slot = self.local_slot(a, req)?;
        let lease = self.take_shared(across, a, token_cost(req), now).await?;
        Ok(Admission { slot, lease })
    }

    /// A WebSocket request (`Caller::gated`), which the session admits synchronously: the
    /// model and the local slot are checked at once; the gateway's answer stream (lazy:
    /// nothing runs until it is polled) then first takes the shared lease and rates, and is
    /// replaced by the refusal's error when they refuse.
    pub(super) fn admit_deferred<F>(
        &self,
        across: Arc<Across>,
        req: ChatRequest,
        mut ctx: RequestCtx,
        chat: &mut F,
    ) -> Result<EventStream, ErrorReply>
    where
        F: FnMut(ChatRequest, RequestCtx) -> Result<EventStream, GatewayError>,
    {
        let request_id = ctx.request_id.clone();
        let checked = self.bind(&mut ctx).and_then(|()| match &self.authed {
            None => Ok(None),
            Some(a) => self.local_slot(a, &req).map(|slot| Some((slot, a.clone()))),
        });
        let (slot, authed) = match checked {
            Ok(Some(checked)) => checked,
            Ok(None) => return chat(req, ctx).map_err(|e| ErrorReply::from_gateway(&e)),
            Err(refusal) => {
                refused(&refusal, self.key_name());
                return Err(refusal.reply());
            }
        };
        let tokens = token_cost(&req);
        let mut events = Some(chat(req, ctx).map_err(|e| ErrorReply::from_gateway(&e))?);
        let mut slot = Some(slot);
        let caller = self.clone();
        let taken = async move {
            let taken = caller.take_shared(&across, &authed, tokens, Instant::now()).await;
            if let Err(refusal) = &taken {
                refused(refusal, caller.key_name());
            }
            taken
        };
        Ok(Box::pin(futures::stream::once(taken).flat_map(
            move |taken| -> EventStream {
                match (taken, events.take()) {
                    (Ok(lease), Some(events)) => Admission {
                        slot: slot.take().flatten(),
                        lease,
                    }
                    .guard(events),
                    (Err(refusal), _) => refusal.into_events(request_id.clone()),
                    (Ok(_), None) => Box::pin(futures::stream::empty()),
                }
            },
        )))
    }

    /// The shared part of admission: the key's stream lease, then its rates, each falling
    /// back to local state when Redis does not answer.
    async fn take_shared(
        &self,
        across: &Across,
        a: &Authed,
        tokens: u64,
        now: Instant,
    ) -> Result<Option<Lease>, Refusal> {
        let name = a.key.config.name.as_str();
        let lease = match a.key.config.max_streams {
            Some(max) => match across.leases.acquire(name, max).await {
                Some(Ok(lease)) => Some(lease),
                Some(Err(_full)) => return Err(Refusal::Streams(max)),
                None => None,
            },
            None => None,
        };
        let (rpm, tpm) = {
            let limits = a.key.limits.lock();
            limits.check_size(tokens)?;
            (limits.rpm(), limits.tpm())
        };
        match across.shared.take_rate(name, rpm, tpm, tokens).await {
            Some(Verdict::Admitted) => {
                // Kept in step with the shared limiter, so that while Redis is down this
                // instance's own traffic still counts. Redis decided: no refusal here.
                let _ = a.key.limits.lock().take(now, tokens);
            }
            Some(Verdict::Refused { limit, wait }) => {
                let (limit, per_minute) = match limit {
                    Which::Rpm => (Limit::Rpm, rpm.unwrap_or(0)),
                    Which::Tpm => (Limit::Tpm, tpm.unwrap_or(0)),
                };
                return Err(Refusal::RateLimited {
                    limit,
                    per_minute,
                    wait,
                });
            }
            None => a.key.limits.lock().take(now, tokens)?,
        }
        Ok(lease)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::http::{HeaderMap, HeaderValue};

    use super::super::{credential, Access};
    use super::*;
    use crate::shared::testkit::{shared, shared_at, RedisServer};
    use crate::shared::Shared;
    use crate::types::{Dialect, Message, Role};

    const KEY: &str = "tc_across-key-0123456789";

    fn instance(limits: &str, shared: &Arc<Shared>) -> Access {
        let toml = format!(
            "[[routes]]\nname = \"a\"\nprovider = \"simulated\"\n[models.chat]\nroutes = [\"a\"]\n\
             [tenants.acme]\n[auth]\n[[auth.keys]]\nname = \"app\"\nsha256 = \"{}\"\ntenant = \"acme\"\n{limits}",
            hex::encode(credential::sha256(KEY))
        );
        Access::new(&crate::config::load_str(&toml).expect("valid config")).with_shared(Some(shared))
    }

    fn caller(access: &Access) -> Caller {
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", HeaderValue::from_static(KEY));
        access
            .authorize(&headers, None, &mut RequestCtx::new(Dialect::OpenAi))
            .expect("a known key")
    }

    fn chat() -> ChatRequest {
        ChatRequest {
            model: "chat".into(),
            messages: vec![Message::text(Role::User, "hi")],
            max_tokens: Some(10),
            ..ChatRequest::default()
        }
    }

    async fn admit(caller: &Caller) -> Result<Admission, Refusal> {
        caller.admit(&chat(), &mut RequestCtx::new(Dialect::OpenAi)).await
    }

    #[tokio::test]
    async fn rpm_and_streams_hold_across_two_instances() {
        let server = RedisServer::start();
        let (s1, s2) = (shared(&server, "i-1"), shared(&server, "i-2"));
        assert!(s1.ping().await && s2.ping().await, "redis is up");
        let one = caller(&instance("rpm = 3\nmax_streams = 1\n", &s1));
        let two = caller(&instance("rpm = 3\nmax_streams = 1\n", &s2));
        let held = admit(&one).await.expect("the first stream, on i-1");
        assert_eq!(
            admit(&two).await.err(),
            Some(Refusal::Streams(1)),
            "i-2's own semaphore is free, but the key streams on i-1"
        );
        drop(held);
        drop(once_free(&two).await.expect("i-2 streams once i-1's lease is released"));
        // Two of rpm 3 are taken (one on each); the stream refusals took none.
        drop(once_free(&one).await.expect("the third of the minute"));
        match once_free(&two).await.err() {
            Some(Refusal::RateLimited {
                limit: Limit::Rpm,
                per_minute: 3,
                wait,
            }) => assert!(
                wait > Duration::from_secs(19) && wait <= Duration::from_secs(20),
                "{wait:?}"
            ),
            other => panic!("the fourth of the minute is refused on i-2: {other:?}"),
        }
    }

    /// Admits once the key's one stream is free (a dropped lease is released by a spawned
    /// task): bounded, real time.
    async fn once_free(caller: &Caller) -> Result<Admission, Refusal> {
        for _ in 0..100 {
            match admit(caller).await {
                Err(Refusal::Streams(1)) => tokio::time::sleep(Duration::from_millis(20)).await,
                other => return other,
            }
        }
        panic!("the stream was not released within two seconds");
    }

    /// What a gated (WebSocket) request yields: `None` for an admitted one (the test's
    /// answers are empty), the error's status for a refused one.
    async fn ws_request(caller: &Caller) -> Option<u16> {
        let mut chat = caller
            .clone()
            .gated(|_req, _ctx| Ok(Box::pin(futures::stream::empty()) as EventStream));
        let events: Vec<_> = chat(chat_req(), RequestCtx::new(Dialect::Native))
            .expect("refusals are events")
            .collect()
            .await;
        events.into_iter().find_map(|e| match e {
            crate::types::StreamEvent::Error(e) => Some(e.status),
            _ => None,
        })
    }

    fn chat_req() -> ChatRequest {
        chat()
    }

    #[tokio::test]
    async fn websocket_requests_share_the_rpm_too() {
        let server = RedisServer::start();
        let (s1, s2) = (shared(&server, "i-1"), shared(&server, "i-2"));
        assert!(s1.ping().await && s2.ping().await, "redis is up");
        let one = caller(&instance("rpm = 2\n", &s1));
        let two = caller(&instance("rpm = 2\n", &s2));
        assert_eq!(ws_request(&one).await, None, "first, over i-1's socket");
        assert_eq!(ws_request(&two).await, None, "second, over i-2's socket");
        assert_eq!(ws_request(&one).await, Some(429), "the third of the minute, on i-1");
        assert_eq!(
            admit(&two).await.err().map(|r| r.status()),
            Some(429),
            "and over HTTP on i-2"
        );
    }

    #[tokio::test]
    async fn with_redis_gone_each_instance_uses_its_local_limits() {
        let mut server = RedisServer::start();
        let s1 = shared(&server, "i-1");
        assert!(s1.ping().await, "up");
        let one = caller(&instance("rpm = 2\nmax_streams = 1\n", &s1));
        server.kill();
        // Redis was up when admission began: the lease and the rate get no answer, and the
        // local semaphore and limiter decide.
        let first = admit(&one).await.expect("admitted on local state");
        assert!(!s1.is_up(), "marked down");
        assert_eq!(admit(&one).await.err(), Some(Refusal::Streams(1)), "local semaphore");
        drop(first);
        drop(admit(&one).await.expect("second of rpm 2, locally"));
        assert!(
            matches!(admit(&one).await.err(), Some(Refusal::RateLimited { .. })),
            "the local limiter counted both"
        );
        let never = shared_at("redis://127.0.0.1:1", "i-3");
        let three = caller(&instance("rpm = 1\n", &never));
        drop(
            admit(&three)
                .await
                .expect("a Redis that never answered fails no request"),
        );
    }
}
