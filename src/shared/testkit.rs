//! For unit tests of the shared-state scripts: a throwaway `redis-server` (the same helper the
//! integration tests use) and a `Shared` handle on it.

#[path = "../../tests/support/redis.rs"]
mod redis_server;

use std::sync::Arc;
use std::time::Duration;

pub use redis_server::RedisServer;

use super::Shared;
use crate::config::StateConfig;

/// A handle on `server` under `instance`, with a generous timeout (the machine may be busy).
pub fn shared(server: &RedisServer, instance: &str) -> Arc<Shared> {
    shared_at(&server.url(), instance)
}

/// A handle on `url` (which may be a port nothing listens on).
pub fn shared_at(url: &str, instance: &str) -> Arc<Shared> {
    let config = StateConfig {
        redis_url: Some(url.to_string()),
        instance: Some(instance.to_string()),
        op_timeout: Duration::from_secs(2),
        ..StateConfig::default()
    };
    match Shared::start(&config) {
        Ok(Some(shared)) => shared,
        other => panic!("a shared handle on {url}: {other:?}"),
    }
}
