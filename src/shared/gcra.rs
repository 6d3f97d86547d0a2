//! Per-key rpm and tpm across instances: one atomic GCRA in Redis (`gcra.lua`) per request,
//! on Redis's clock, with the local limiter's semantics (burst = a minute's worth, tpm charged
//! the request's estimated tokens). `None` means Redis did not answer: the caller uses its
//! local limiter.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::Shared;

/// Loaded once; `invoke_async` sends EVALSHA and falls back to EVAL when Redis lacks it.
static GCRA: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("gcra.lua")));

/// Which of a key's limits refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Rpm,
    Tpm,
}

/// What the shared limiter said about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Taken from both limits.
    Admitted,
    /// Nothing taken; retry after `wait` (computed by the script).
    Refused { limit: Which, wait: Duration },
}

impl Shared {
    /// Takes one request costing `tokens` from `key`'s shared `rpm` and `tpm` (each `None`
    /// when the key has no such limit), or from neither. The caller refuses a request over
    /// the whole tpm before asking (a 400, never a 429). `None` when Redis did not answer
    /// within `op_timeout`.
    pub async fn take_rate(&self, key: &str, rpm: Option<u32>, tpm: Option<u32>, tokens: u64) -> Option<Verdict> {
        if rpm.is_none() && tpm.is_none() {
            return Some(Verdict::Admitted);
        }
        // One hash tag per key: both limits live in one cluster slot, as the script needs.
        let rpm_key = self.key(&format!("limit:{{{key}}}:rpm"));
        let tpm_key = self.key(&format!("limit:{{{key}}}:tpm"));
        let (code, wait_ms): (i64, i64) = self
            .run("gcra", |mut c| async move {
                GCRA.key(rpm_key)
                    .key(tpm_key)
                    .arg(rpm.unwrap_or(0))
                    .arg(tpm.unwrap_or(0))
                    .arg(tokens)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let wait = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0));
        Some(match code {
            1 => Verdict::Refused {
                limit: Which::Rpm,
                wait,
            },
            2 => Verdict::Refused {
                limit: Which::Tpm,
                wait,
            },
            _ => Verdict::Admitted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::testkit::{shared, shared_at, RedisServer};

    #[tokio::test]
    async fn rpm_bursts_a_minute_then_refuses_with_the_scripts_wait_on_every_instance() {
        let server = RedisServer::start();
        let (one, two) = (shared(&server, "i-1"), shared(&server, "i-2"));
        assert_eq!(one.take_rate("app", Some(2), None, 1).await, Some(Verdict::Admitted));
        assert_eq!(two.take_rate("app", Some(2), None, 1).await, Some(Verdict::Admitted));
        for who in [&one, &two] {
            match who.take_rate("app", Some(2), None, 1).await {
                Some(Verdict::Refused {
                    limit: Which::Rpm,
                    wait,
                }) => assert!(
                    wait > Duration::from_secs(29) && wait <= Duration::from_secs(30),
                    "one interval (60 s / 2) to wait, not {wait:?}"
                ),
                other => panic!(
                    "the third request of the minute is refused on {}: {other:?}",
                    who.instance()
                ),
            }
        }
        assert_eq!(
            one.take_rate("other", Some(2), None, 1).await,
            Some(Verdict::Admitted),
            "keys are apart"
        );
    }

    #[tokio::test]
    async fn tpm_counts_tokens_and_a_refusal_takes_nothing_from_rpm() {
        let server = RedisServer::start();
        let s = shared(&server, "i-1");
        assert_eq!(
            s.take_rate("k", Some(3), Some(1000), 600).await,
            Some(Verdict::Admitted)
        );
        match s.take_rate("k", Some(3), Some(1000), 600).await {
            Some(Verdict::Refused {
                limit: Which::Tpm,
                wait,
            }) => assert!(
                wait > Duration::from_millis(11_900) && wait <= Duration::from_secs(12),
                "200 tokens short at 1000/min is 12 s, not {wait:?}"
            ),
            other => panic!("a tpm refusal, not {other:?}"),
        }
        // rpm 3: one taken, the tpm refusal took none, so two more fit and the fourth does not.
        assert_eq!(s.take_rate("k", Some(3), Some(1000), 0).await, Some(Verdict::Admitted));
        assert_eq!(s.take_rate("k", Some(3), Some(1000), 0).await, Some(Verdict::Admitted));
        assert!(
            matches!(
                s.take_rate("k", Some(3), Some(1000), 0).await,
                Some(Verdict::Refused { limit: Which::Rpm, .. })
            ),
            "the fourth request of the minute"
        );
        let keys = server.command("KEYS *");
        assert!(keys.contains("tailcut:limit:{k}:rpm"), "{keys}");
        let ttl = server.command("PTTL tailcut:limit:{k}:rpm");
        assert!(!ttl.starts_with(":-1"), "limit keys expire: {ttl}");
    }

    #[tokio::test]
    async fn without_redis_the_caller_is_told_to_use_its_local_limiter() {
        let s = shared_at("redis://127.0.0.1:1", "i-1");
        assert_eq!(s.take_rate("k", Some(1), None, 1).await, None, "no answer, no verdict");
        assert!(!s.is_up(), "marked down");
    }
}
