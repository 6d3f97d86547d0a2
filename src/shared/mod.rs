//! Optional shared state on Redis (`[state] redis_url`): one pooled, self-reconnecting
//! connection, each operation under `op_timeout`, and whether Redis answered last.
//!
//! Every user of shared state has a local fallback: an operation that fails or times out
//! returns `None`, marks Redis down (`/readyz` says so, `tailcut_redis_up` is 0) and the
//! caller carries on with what this instance knows. A request never fails because Redis is
//! down. The next successful operation marks it up again; the connection manager reconnects
//! on its own, with backoff. A command Redis answers with an error reply (`OOM` when it is
//! full under `noeviction`, `READONLY`) also returns `None`, but leaves it up: it is counted
//! and logged at most once a minute.

pub mod gcra;
pub mod hints;
pub mod leases;
pub mod replay;
#[cfg(test)]
pub(crate) mod testkit;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

use crate::config::{redis_host, StateConfig};

/// `tailcut_redis_up`: 1 while the last Redis operation succeeded.
pub const REDIS_UP: &str = "tailcut_redis_up";
/// `tailcut_redis_errors_total{op}`: Redis operations that failed or timed out.
pub const REDIS_ERRORS_TOTAL: &str = "tailcut_redis_errors_total";

/// The shared-state handle. Cheap to clone through `Arc`; absent when `[state]` names no Redis.
pub struct Shared {
    conn: ConnectionManager,
    up: AtomicBool,
    prefix: String,
    instance: String,
    timeout: Duration,
    host: String,
    /// When a refused command was last logged.
    refusal_logged: Mutex<Option<Instant>>,
    /// When a readiness check last started a `PING` (`check_in_background`).
    checked: Mutex<Option<Instant>>,
}

/// How often readiness checks ping Redis at most.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How often a run of refused commands is logged at most.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: only the host is shown.
        f.debug_struct("Shared")
            .field("host", &self.host)
            .field("instance", &self.instance)
            .field("up", &self.is_up())
            .finish()
    }
}

/// Why shared state could not be set up at all (a malformed URL). Redis being unreachable is
/// not an error: the handle starts down and connects when it can.
#[derive(Debug, thiserror::Error)]
#[error("state.redis_url: {0}")]
pub struct SetupError(String);

impl Shared {
    /// The handle for `config`, or `None` when state is local. Connects lazily: this never
    /// waits for Redis, and an unreachable Redis only means the handle starts down.
    /// Must run inside a tokio runtime.
    pub fn start(config: &StateConfig) -> Result<Option<Arc<Shared>>, SetupError> {
        let Some(url) = config.url() else { return Ok(None) };
        let host = redis_host(&url);
        // The error text can quote the URL; only its kind is kept.
        let client = redis::Client::open(url.as_str()).map_err(|e| SetupError(format!("{:?}", e.kind())))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.op_timeout))
            .set_response_timeout(Some(config.op_timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(2));
        let conn = ConnectionManager::new_lazy_with_config(client, manager_config)
            .map_err(|e| SetupError(format!("{:?}", e.kind())))?;
        let instance = config.instance.clone().unwrap_or_else(random_instance);
        metrics::gauge!(REDIS_UP).set(0.0);
        Ok(Some(Arc::new(Shared {
            conn,
            up: AtomicBool::new(false),
            prefix: config.key_prefix.clone(),
            instance,
            timeout: config.op_timeout,
            host,
            refusal_logged: Mutex::new(None),
            checked: Mutex::new(None),
        })))
    }

    /// Runs one operation on a clone of the pooled connection, under `op_timeout`. `None` when
    /// it failed or timed out (Redis is then marked down); the caller falls back to local state.
    /// `op` names the operation in `tailcut_redis_errors_total` and the log.
    pub async fn run<T, F, Fut>(&self, op: &'static str, f: F) -> Option<T>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        match tokio::time::timeout(self.timeout, f(self.conn.clone())).await {
            Ok(Ok(value)) => {
                self.mark(true);
                Some(value)
            }
            Ok(Err(e)) if refused_by_server(&e) => {
                // Redis answered: it is up, only this command was refused (full under
                // `noeviction`, a read-only replica). Marking it down here made it flap with
                // every read that still worked, and log each flip.
                self.refused(op, e.code().unwrap_or("ERR"));
                None
            }
            Ok(Err(e)) => {
                self.failed(op, &format!("{:?}", e.kind()));
                None
            }
            Err(_) => {
                self.failed(op, "timed out");
                None
            }
        }
    }

    /// Whether the last operation succeeded. False until the first one does.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Checks Redis now (a `PING`), updating `is_up`.
    pub async fn ping(&self) -> bool {
        self.run("ping", |mut c| async move {
            redis::cmd("PING").query_async::<String>(&mut c).await
        })
        .await
        .is_some()
    }

    /// For a readiness check that must not wait on Redis: starts a `PING` in the background
    /// (at most one each `CHECK_EVERY`), whose outcome `is_up` reports from then on.
    pub fn check_in_background(self: &Arc<Self>) {
        let now = Instant::now();
        {
            let mut checked = self.checked.lock();
            if checked.is_some_and(|at| now.saturating_duration_since(at) < CHECK_EVERY) {
                return;
            }
            *checked = Some(now);
        }
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            shared.ping().await;
        });
    }

    /// The key `<prefix>:<name>`.
    pub fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    /// This instance's name in shared records.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// `host:port` of the Redis in use: what logs may show (`/readyz`, public, does not).
    pub fn host(&self) -> &str {
        &self.host
    }

    fn failed(&self, op: &'static str, why: &str) {
        metrics::counter!(REDIS_ERRORS_TOTAL, "op" => op).increment(1);
        if self.up.load(Ordering::Relaxed) {
            tracing::warn!(redis = %self.host, op, why, "redis unreachable: serving with local state");
        }
        self.mark(false);
    }

    /// A command Redis refused: counted, and logged at most once per `REFUSAL_LOG_EVERY`.
    fn refused(&self, op: &'static str, code: &str) {
        metrics::counter!(REDIS_ERRORS_TOTAL, "op" => op).increment(1);
        self.mark(true);
        let now = Instant::now();
        let mut last = self.refusal_logged.lock();
        if last.is_none_or(|at| now.saturating_duration_since(at) >= REFUSAL_LOG_EVERY) {
            *last = Some(now);
            tracing::warn!(redis = %self.host, op, code, "redis refused a command: that state is not shared meanwhile");
        }
    }

    fn mark(&self, up: bool) {
        if self.up.swap(up, Ordering::Relaxed) != up {
            metrics::gauge!(REDIS_UP).set(if up { 1.0 } else { 0.0 });
            if up {
                tracing::info!(redis = %self.host, "redis reachable: state is shared");
            }
        }
    }
}

/// Whether Redis itself answered `e` with an error reply (`OOM`, `READONLY`, `MISCONF`, ...):
/// it is reachable, the command was refused.
fn refused_by_server(e: &redis::RedisError) -> bool {
    matches!(e.kind(), redis::ErrorKind::Server(_) | redis::ErrorKind::Extension)
}

/// A random instance id: 64 bits in hex.
fn random_instance() -> String {
    format!("i-{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_state_needs_no_handle_and_an_unreachable_redis_is_only_down() {
        assert!(Shared::start(&StateConfig::default()).expect("local").is_none());
        // Port 1 on loopback: nothing listens, the connection is refused at once.
        let config = StateConfig {
            redis_url: Some("redis://:pw@127.0.0.1:1".into()),
            op_timeout: Duration::from_millis(200),
            ..StateConfig::default()
        };
        let shared = Shared::start(&config).expect("valid url").expect("shared");
        assert!(!shared.is_up());
        assert!(!shared.ping().await, "nothing listens on port 1");
        assert!(!shared.is_up());
        assert_eq!(shared.host(), "127.0.0.1:1");
        assert!(!format!("{shared:?}").contains("pw"), "the password is never shown");
        assert_eq!(shared.key("replay:st_1"), "tailcut:replay:st_1");
    }

    #[tokio::test]
    async fn a_command_redis_refuses_leaves_it_up() {
        let redis = testkit::RedisServer::start();
        let shared = testkit::shared(&redis, "one");
        assert!(shared.ping().await);
        // Full, and refusing to evict: writes get OOM, reads still work.
        assert!(redis
            .command("CONFIG SET maxmemory-policy noeviction")
            .starts_with("+OK"));
        assert!(redis.command("CONFIG SET maxmemory 1").starts_with("+OK"));
        let set = shared
            .run("test_set", |mut c| async move {
                redis::cmd("SET").arg("k").arg("v").query_async::<()>(&mut c).await
            })
            .await;
        assert!(set.is_none(), "the write was refused");
        assert!(shared.is_up(), "Redis answered: it is up, only the write was refused");
        assert!(shared.ping().await, "and reads work");
    }
}
