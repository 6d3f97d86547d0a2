//! Shared health hints: when a route's breaker opens here, or it starts cooling after a 429,
//! this instance writes a hint (route, kind, for how long) to Redis with that TTL; every
//! instance reads its peers' hints every `hint_poll` (≤ 1 s) and hands them to its `Health`,
//! where they are advisory only (see `health`'s module doc): the route is ranked last, never
//! refused, its breaker untouched, and the hint ends with its TTL.
//!
//! One key per route, `<prefix>:{hints}:<route>` (one hash tag, so a poll is one pipeline in
//! one cluster slot), holding `{"kind", "instance", "at"}`. The TTL, read with `PTTL`, is the
//! hint's life, so instances' clocks never enter. Polling rather than pub/sub: a poll after a
//! reconnect sees every live hint, where a subscriber would have missed what was published
//! while it was away. The poll also re-marks Redis up after an outage, which admission
//! (`transport::auth`) waits for before it asks Redis again.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::Shared;
use crate::health::{Health, HintKind};

/// `tailcut_health_hints_total{direction, kind}`: hints sent to and received from peers.
pub const HEALTH_HINTS_TOTAL: &str = "tailcut_health_hints_total";

/// A hint is sent again only when its end moves by more than this.
const RESEND_SLACK: Duration = Duration::from_millis(100);

/// A hint as stored in Redis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stored {
    kind: String,
    instance: String,
    /// When the sender wrote it (its unix ms): tells one hint from the next, nothing more.
    at: u64,
}

/// Starts the hint task: it publishes this instance's outages and reads its peers' until
/// `health` or `shared` is dropped. Needs a runtime.
pub fn spawn(shared: &Arc<Shared>, health: &Arc<Health>, poll: Duration) {
    tokio::spawn(run(Arc::downgrade(shared), Arc::downgrade(health), poll));
}

async fn run(shared: Weak<Shared>, health: Weak<Health>, poll: Duration) {
    let mut hints = Hints::default();
    let mut tick = tokio::time::interval(poll.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (Some(shared), Some(health)) = (shared.upgrade(), health.upgrade()) else {
            return;
        };
        hints.publish(&shared, &health).await;
        hints.read(&shared, &health).await;
    }
}

/// What one instance remembers between rounds.
#[derive(Default)]
struct Hints {
    /// Per route, the end of the last hint this instance sent.
    sent: HashMap<String, Instant>,
    /// Per route, the last peer hint taken (`instance`, `at`), so each is counted once.
    seen: HashMap<String, (String, u64)>,
}

impl Hints {
    /// Sends a hint for every route this instance sees down that it has not told of yet.
    async fn publish(&mut self, shared: &Shared, health: &Health) {
        let now = Instant::now();
        self.sent.retain(|_, until| *until > now);
        for outage in health.outages(now) {
            // Sent again when its end moved either way: later (a longer outage), or earlier (a
            // long drill replaced by a short one), else peers would keep the old end.
            if self
                .sent
                .get(&outage.route)
                .is_some_and(|sent| outage.until <= *sent + RESEND_SLACK && *sent <= outage.until + RESEND_SLACK)
            {
                continue;
            }
            let ttl_ms = u64::try_from(outage.until.saturating_duration_since(now).as_millis())
                .unwrap_or(u64::MAX)
                .max(1);
            let value = Stored {
                kind: outage.kind.as_str().to_string(),
                instance: shared.instance().to_string(),
                at: unix_ms(),
            };
            let Ok(value) = serde_json::to_string(&value) else {
                continue;
            };
            let key = hint_key(shared, &outage.route);
            let sent: Option<()> = shared
                .run("hint_publish", |mut c| async move {
                    redis::cmd("SET")
                        .arg(key)
                        .arg(value)
                        .arg("PX")
                        .arg(ttl_ms)
                        .query_async(&mut c)
                        .await
                })
                .await;
            if sent.is_some() {
                metrics::counter!(HEALTH_HINTS_TOTAL, "direction" => "sent", "kind" => outage.kind.as_str())
                    .increment(1);
                tracing::info!(route = %outage.route, kind = outage.kind.as_str(), ttl_ms, "health hint sent to peers");
                self.sent.insert(outage.route, outage.until);
            }
        }
    }

    /// Reads every route's hint (one pipeline) and hands peers' live ones to `health`.
    async fn read(&mut self, shared: &Shared, health: &Health) {
        let names: Vec<String> = health.routes().iter().map(|r| r.name.clone()).collect();
        if names.is_empty() {
            return;
        }
        let keys: Vec<String> = names.iter().map(|n| hint_key(shared, n)).collect();
        let replies: Option<Vec<(Option<String>, i64)>> = shared
            .run("hint_read", |mut c| async move {
                let mut pipe = redis::pipe();
                for key in &keys {
                    pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
                }
                let flat: Vec<redis::Value> = pipe.query_async(&mut c).await?;
                Ok(pairs(flat))
            })
            .await;
        let Some(replies) = replies else { return };
        let now = Instant::now();
        for (name, (value, pttl)) in names.iter().zip(replies) {
            let Some(hint) = value.and_then(|v| serde_json::from_str::<Stored>(&v).ok()) else {
                continue;
            };
            let (Some(kind), Ok(ttl_ms)) = (HintKind::parse(&hint.kind), u64::try_from(pttl)) else {
                continue;
            };
            if hint.instance == shared.instance() || ttl_ms == 0 {
                continue;
            }
            health.peer_hint(name, kind, now + Duration::from_millis(ttl_ms));
            let id = (hint.instance.clone(), hint.at);
            if self.seen.get(name) != Some(&id) {
                metrics::counter!(HEALTH_HINTS_TOTAL, "direction" => "received", "kind" => kind.as_str()).increment(1);
                tracing::info!(route = %name, kind = kind.as_str(), from = %hint.instance, ttl_ms, "health hint from a peer: route ranked last");
                self.seen.insert(name.clone(), id);
            }
        }
    }
}

/// `GET`/`PTTL` replies, two per key, as (value, ms left). A missing or odd reply reads as
/// no hint.
fn pairs(flat: Vec<redis::Value>) -> Vec<(Option<String>, i64)> {
    let mut out = Vec::with_capacity(flat.len() / 2);
    let mut it = flat.into_iter();
    while let (Some(value), Some(ttl)) = (it.next(), it.next()) {
        let value = redis::from_redis_value::<Option<String>>(value).ok().flatten();
        let ttl = redis::from_redis_value::<i64>(ttl).unwrap_or(-2);
        out.push((value, ttl));
    }
    out
}

fn hint_key(shared: &Shared, route: &str) -> String {
    shared.key(&format!("{{hints}}:{route}"))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::testkit::{shared, shared_at, RedisServer};

    fn health() -> Arc<Health> {
        let config = crate::config::load_str(
            "[[routes]]\nname = \"eu-a\"\nprovider = \"simulated\"\n[[routes]]\nname = \"eu-b\"\nprovider = \"simulated\"\n[models.chat]\nroutes = [\"eu-a\", \"eu-b\"]\n",
        )
        .expect("test config");
        Arc::new(Health::new(&config, Instant::now()))
    }

    #[tokio::test]
    async fn a_breaker_opened_on_one_instance_is_a_live_hint_on_the_other_and_never_on_itself() {
        let server = RedisServer::start();
        let (s1, s2) = (shared(&server, "i-1"), shared(&server, "i-2"));
        let (h1, h2) = (health(), health());
        let (mut one, mut two) = (Hints::default(), Hints::default());
        assert!(h1.force_open("eu-a", Instant::now()), "a route of the test config");
        one.publish(&s1, &h1).await;
        assert_eq!(one.sent.len(), 1, "one hint sent");
        one.publish(&s1, &h1).await;
        assert_eq!(one.sent.len(), 1, "not sent again while it stands");
        two.read(&s2, &h2).await;
        let (kind, until) = h2.live_peer_hint("eu-a", Instant::now()).expect("i-2 took the hint");
        assert_eq!(kind, HintKind::BreakerOpen);
        assert!(until > Instant::now(), "live for its TTL");
        assert!(
            h2.availability("eu-a", Instant::now()).is_ok(),
            "advisory: i-2's own breaker is closed"
        );
        assert!(h2.view("eu-a", Instant::now()).cooling, "ranked as cooling");
        one.read(&s1, &h1).await;
        assert!(
            h1.live_peer_hint("eu-a", Instant::now()).is_none(),
            "an instance skips its own hints"
        );
        let ttl = server.command("PTTL tailcut:{hints}:eu-a");
        assert!(
            ttl.starts_with(':') && !ttl.starts_with(":-"),
            "the hint key expires: {ttl}"
        );
    }

    #[tokio::test]
    async fn a_hint_whose_outage_is_cut_short_is_sent_again_with_the_shorter_life() {
        let server = RedisServer::start();
        let s1 = shared(&server, "i-1");
        let h1 = health();
        let mut one = Hints::default();
        let long = Duration::from_secs(600);
        assert!(h1.force_open_for("eu-a", Instant::now(), long).is_some());
        one.publish(&s1, &h1).await;
        let pttl = |server: &RedisServer| -> i64 {
            let reply = server.command("PTTL tailcut:{hints}:eu-a");
            reply.trim().trim_start_matches(':').parse().unwrap_or(-1)
        };
        assert!(pttl(&server) > 500_000, "the long drill's hint");
        // A 3 s drill replaces it: peers must not keep the 600 s end.
        h1.force_open_for("eu-a", Instant::now(), Duration::from_secs(3));
        one.publish(&s1, &h1).await;
        let ttl = pttl(&server);
        assert!(
            (1..=3_000).contains(&ttl),
            "the hint now ends with the short drill: {ttl} ms"
        );
    }

    #[tokio::test]
    async fn without_redis_hints_are_neither_sent_nor_read() {
        let s = shared_at("redis://127.0.0.1:1", "i-1");
        let h = health();
        h.force_open("eu-a", Instant::now());
        let mut hints = Hints::default();
        hints.publish(&s, &h).await;
        assert!(hints.sent.is_empty(), "not marked sent: it is tried again next round");
        hints.read(&s, &h).await;
        assert!(h.live_peer_hint("eu-a", Instant::now()).is_none());
    }
}
