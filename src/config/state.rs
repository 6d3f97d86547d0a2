//! `[state]`: where instances share state. Without `redis_url` (the embedded default) every
//! instance keeps its state in memory; with it, resumable streams, per-key limits and health
//! hints are shared through Redis, and each falls back to local state while Redis is down.

use std::time::Duration;

use serde::Deserialize;

use super::validate::Validator;

/// `[state]`, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawState {
    pub redis_url: Option<String>,
    pub redis_url_env: Option<String>,
    pub key_prefix: Option<String>,
    pub instance: Option<String>,
    pub op_timeout_ms: Option<u64>,
    pub lease_ttl_ms: Option<u64>,
    pub hint_poll_ms: Option<u64>,
}

/// `[state]`: the shared-state backend.
#[derive(Debug, Clone, PartialEq)]
pub struct StateConfig {
    /// `redis://` or `rediss://` URL. It may carry a password, so it is never logged: only
    /// its host and port are (`StateConfig::redis_host`).
    pub redis_url: Option<String>,
    /// The environment variable holding the URL instead (read at start).
    pub redis_url_env: Option<String>,
    /// Prefix of every key tailcut writes, so several deployments can share one Redis.
    pub key_prefix: String,
    /// This instance's name in shared records (leases, hints); a random id when unset.
    pub instance: Option<String>,
    /// Each Redis operation's budget; past it the operation counts as failed and the caller
    /// uses local state.
    pub op_timeout: Duration,
    /// How long a concurrent-stream lease lives unless renewed (every third of it): what an
    /// instance that dies leaves behind expires after this.
    pub lease_ttl: Duration,
    /// How often health hints from other instances are read (at most `MAX_HINT_POLL`).
    pub hint_poll: Duration,
}

/// The slowest hint polling allowed: a peer's breaker must be seen within a second.
pub const MAX_HINT_POLL: Duration = Duration::from_millis(1000);

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            redis_url: None,
            redis_url_env: None,
            key_prefix: "tailcut".into(),
            instance: None,
            op_timeout: Duration::from_millis(250),
            lease_ttl: Duration::from_millis(15_000),
            hint_poll: Duration::from_millis(200),
        }
    }
}

impl StateConfig {
    /// The URL to connect to: `redis_url`, else the value of `redis_url_env` if it is set.
    pub fn url(&self) -> Option<String> {
        if let Some(url) = &self.redis_url {
            return Some(url.clone());
        }
        let var = self.redis_url_env.as_ref()?;
        std::env::var(var).ok().filter(|v| !v.is_empty())
    }

    /// Whether shared state is asked for at all.
    pub fn is_shared(&self) -> bool {
        self.redis_url.is_some() || self.redis_url_env.is_some()
    }
}

/// `host:port` of a Redis URL, without user, password or database: what logs and `/readyz`
/// may show.
pub fn redis_host(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or("").to_string()
}

impl Validator {
    pub(super) fn state(&mut self, raw: RawState) -> StateConfig {
        let mut state = StateConfig::default();
        if raw.redis_url.is_some() && raw.redis_url_env.is_some() {
            self.problem("state.redis_url_env", "give redis_url or redis_url_env, not both");
        }
        if let Some(url) = &raw.redis_url {
            if !(url.starts_with("redis://") || url.starts_with("rediss://") || url.starts_with("unix://")) {
                self.problem("state.redis_url", "must start with redis://, rediss:// or unix://");
            } else if let Err(e) = redis::Client::open(url.as_str()) {
                // The error text can quote the URL (and its password): only the kind is shown.
                self.problem("state.redis_url", format!("not a valid Redis URL ({:?})", e.kind()));
            }
        }
        if let Some(prefix) = raw.key_prefix {
            if prefix.is_empty() || prefix.contains(char::is_whitespace) {
                self.problem("state.key_prefix", "must be non-empty, without spaces");
            }
            state.key_prefix = prefix;
        }
        if let Some(ms) = raw.op_timeout_ms {
            if ms == 0 {
                self.problem("state.op_timeout_ms", "must be > 0");
            } else {
                state.op_timeout = Duration::from_millis(ms);
            }
        }
        if let Some(ms) = raw.lease_ttl_ms {
            if ms < 1000 {
                self.problem(
                    "state.lease_ttl_ms",
                    "must be at least 1000 (leases are renewed every third of it)",
                );
            } else {
                state.lease_ttl = Duration::from_millis(ms);
            }
        }
        if let Some(ms) = raw.hint_poll_ms {
            if ms == 0 || Duration::from_millis(ms) > MAX_HINT_POLL {
                self.problem("state.hint_poll_ms", "must be between 1 and 1000");
            } else {
                state.hint_poll = Duration::from_millis(ms);
            }
        }
        state.redis_url = raw.redis_url;
        state.redis_url_env = raw.redis_url_env;
        state.instance = raw.instance;
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_a_url_drops_credentials_and_database() {
        assert_eq!(
            redis_host("redis://:s3cret@cache.internal:6380/2"),
            "cache.internal:6380"
        );
        assert_eq!(redis_host("rediss://user:pw@h:1"), "h:1");
        assert_eq!(redis_host("redis://127.0.0.1:6379"), "127.0.0.1:6379");
    }

    #[test]
    fn state_is_local_by_default_and_checked_when_given() {
        let config = crate::config::load_str(crate::config::DEFAULT_TOML).expect("the default");
        assert!(!config.state.is_shared());
        let bad = "extends = \"default\"\n[state]\nredis_url = \"http://x\"\nop_timeout_ms = 0\nlease_ttl_ms = 10\nhint_poll_ms = 5000\n";
        let err = crate::config::load_str(bad).expect_err("bad url and zero timeout");
        let text = err.to_string();
        assert!(text.contains("state.redis_url"), "{text}");
        assert!(text.contains("state.op_timeout_ms"), "{text}");
        assert!(text.contains("state.lease_ttl_ms"), "{text}");
        assert!(text.contains("state.hint_poll_ms"), "{text}");
    }
}
