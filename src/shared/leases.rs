//! Concurrent streams per key across instances: leased counters. Each key has a sorted set of
//! lease ids scored by their expiry (Redis's clock); taking one drops the expired, counts the
//! rest and adds one if under `max_streams`, atomically (a script). A task per instance
//! renews its live leases every third of `lease_ttl`; dropping a lease removes it (a spawned,
//! bounded release). An instance that dies stops renewing, so its leases expire on their own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use redis::Script;
use tokio::sync::Semaphore;

use super::Shared;

/// Drop the expired, count, add when under the cap. `KEYS[1]` the key's set; `ARGV`: the cap,
/// the lease id, the ttl in ms. 1 when taken, 0 when the key is at its cap.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
",
    )
});

/// Pushes the expiry of this instance's live leases in one set to now + ttl. A lease that
/// expired meanwhile (Redis was unreachable for a whole ttl) is added back: its stream is
/// still running and counts. `KEYS[1]` the set; `ARGV`: the ttl in ms, then the lease ids.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], ttl)
return #ARGV - 1
",
    )
});

/// Releases in flight at most; past that a dropped lease is left to expire (within a ttl).
const MAX_RELEASES_IN_FLIGHT: usize = 64;

/// This instance's stream leases.
pub struct StreamLeases {
    shared: Arc<Shared>,
    ttl: Duration,
    /// Live leases by number: (the key's set, the lease id). As many as this instance's open
    /// streams of keys with `max_streams`, which the local semaphores bound.
    live: Mutex<HashMap<u64, (String, String)>>,
    next: AtomicU64,
    releases: Arc<Semaphore>,
}

/// The key is at its `max_streams` across instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// One stream's lease; removed from Redis when dropped.
#[must_use = "the lease is released when dropped"]
pub struct Lease {
    leases: Arc<StreamLeases>,
    number: u64,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("number", &self.number).finish()
    }
}

impl StreamLeases {
    /// The leases of this instance, without a renewal task (see [`StreamLeases::start`]).
    pub fn new(shared: Arc<Shared>, ttl: Duration) -> Arc<Self> {
        Arc::new(StreamLeases {
            shared,
            ttl,
            live: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            releases: Arc::new(Semaphore::new(MAX_RELEASES_IN_FLIGHT)),
        })
    }

    /// The leases and their renewal task, which ends once they are dropped. Needs a runtime.
    pub fn start(shared: Arc<Shared>, ttl: Duration) -> Arc<Self> {
        let leases = Self::new(shared, ttl);
        tokio::spawn(renew_while_alive(Arc::downgrade(&leases)));
        leases
    }

    /// Takes one of `key`'s `max` stream leases. `None` when Redis did not answer: the caller
    /// goes by its local count alone.
    pub async fn acquire(self: &Arc<Self>, key: &str, max: u32) -> Option<Result<Lease, Full>> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let set = self.shared.key(&format!("streams:{{{key}}}"));
        let id = format!("{}:{number}", self.shared.instance());
        let ttl_ms = self.ttl_ms();
        let taken: i64 = {
            let (set, id) = (set.clone(), id.clone());
            self.shared
                .run("lease_acquire", |mut c| async move {
                    ACQUIRE.key(set).arg(max).arg(id).arg(ttl_ms).invoke_async(&mut c).await
                })
                .await?
        };
        if taken != 1 {
            return Some(Err(Full));
        }
        self.live.lock().insert(number, (set, id));
        Some(Ok(Lease {
            leases: Arc::clone(self),
            number,
        }))
    }

    /// Live leases of this instance.
    pub fn live(&self) -> usize {
        self.live.lock().len()
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX).max(1)
    }

    /// Renews every live lease once, one script call per key.
    async fn renew(&self) {
        let mut by_set: HashMap<String, Vec<String>> = HashMap::new();
        for (set, id) in self.live.lock().values() {
            by_set.entry(set.clone()).or_default().push(id.clone());
        }
        let ttl_ms = self.ttl_ms();
        for (set, ids) in by_set {
            let renewed: Option<i64> = self
                .shared
                .run("lease_renew", |mut c| async move {
                    let mut call = RENEW.key(set);
                    call.arg(ttl_ms);
                    for id in ids {
                        call.arg(id);
                    }
                    call.invoke_async(&mut c).await
                })
                .await;
            if renewed.is_none() {
                // Redis is down: the rest would fail too; the next round tries again.
                return;
            }
        }
    }
}

async fn renew_while_alive(leases: Weak<StreamLeases>) {
    let every = match leases.upgrade() {
        Some(l) => (l.ttl / 3).max(Duration::from_millis(10)),
        None => return,
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(leases) = leases.upgrade() else { return };
        leases.renew().await;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some((set, id)) = self.leases.live.lock().remove(&self.number) else {
            return;
        };
        // Without a free release slot or a runtime, the lease is no longer renewed and
        // expires within a ttl.
        let Ok(permit) = Arc::clone(&self.leases.releases).try_acquire_owned() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = Arc::clone(&self.leases.shared);
        runtime.spawn(async move {
            let _permit = permit;
            let _: Option<i64> = shared
                .run("lease_release", |mut c| async move {
                    redis::cmd("ZREM").arg(set).arg(id).query_async(&mut c).await
                })
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::testkit::{shared, shared_at, RedisServer};

    /// Waits (real time, bounded) until `leases` can take one of `key`'s `max`.
    async fn eventually_acquire(leases: &Arc<StreamLeases>, key: &str, max: u32) -> Lease {
        for _ in 0..100 {
            if let Some(Ok(lease)) = leases.acquire(key, max).await {
                return lease;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no lease of {key} within two seconds");
    }

    #[tokio::test]
    async fn the_cap_holds_across_instances_and_a_dropped_lease_frees_its_place() {
        let server = RedisServer::start();
        let one = StreamLeases::start(shared(&server, "i-1"), Duration::from_secs(15));
        let two = StreamLeases::start(shared(&server, "i-2"), Duration::from_secs(15));
        let a = one.acquire("app", 2).await.expect("redis answers").expect("first");
        let _b = two.acquire("app", 2).await.expect("redis answers").expect("second");
        assert_eq!(
            one.acquire("app", 2).await.map(|r| r.err()),
            Some(Some(Full)),
            "full on i-1"
        );
        assert_eq!(
            two.acquire("app", 2).await.map(|r| r.err()),
            Some(Some(Full)),
            "full on i-2"
        );
        assert!(
            matches!(two.acquire("other", 1).await, Some(Ok(_))),
            "another key has its own cap"
        );
        drop(a);
        assert_eq!(one.live(), 0, "forgotten at once locally");
        let _c = eventually_acquire(&two, "app", 2).await;
    }

    #[tokio::test]
    async fn a_dead_instances_leases_expire_and_live_ones_are_renewed() {
        let server = RedisServer::start();
        let ttl = Duration::from_millis(300);
        // No renewal task: this instance "dies" holding its lease.
        let dead = StreamLeases::new(shared(&server, "dead"), ttl);
        std::mem::forget(dead.acquire("app", 1).await.expect("redis").expect("taken"));
        let alive = StreamLeases::start(shared(&server, "alive"), ttl);
        assert_eq!(
            alive.acquire("app", 1).await.map(|r| r.err()),
            Some(Some(Full)),
            "held by the dead one"
        );
        let lease = eventually_acquire(&alive, "app", 1).await;
        // Three ttls later the renewed lease still holds the only place.
        tokio::time::sleep(ttl * 3).await;
        assert_eq!(
            dead.acquire("app", 1).await.map(|r| r.err()),
            Some(Some(Full)),
            "the live lease was renewed"
        );
        drop(lease);
    }

    #[tokio::test]
    async fn without_redis_there_is_no_verdict() {
        let leases = StreamLeases::new(shared_at("redis://127.0.0.1:1", "i-1"), Duration::from_secs(15));
        assert!(leases.acquire("app", 1).await.is_none(), "local count only");
        assert_eq!(leases.live(), 0);
    }
}
