//! Validation of the plain sections: `[server]` (with `[server.ws]`), `[hedge]` and the
//! mid-stream `[policies]`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::raw::{RawHedge, RawServer};
use super::validate::Validator;
use super::{HedgeConfig, MidStreamPolicy, PolicyConfig, ServerConfig};

impl Validator {
    pub(super) fn server(&mut self, s: RawServer) -> ServerConfig {
        let ws = s.ws.unwrap_or_default();
        let ms = Duration::from_millis;
        ServerConfig {
            listen: self.addr("server.listen", s.listen, "127.0.0.1:8080"),
            drain: ms(s.drain_ms.unwrap_or(15_000)),
            header_read_timeout: ms(s.header_read_timeout_ms.unwrap_or(10_000)),
            max_header_bytes: s.max_header_bytes.unwrap_or(64 * 1024),
            max_headers: s.max_headers.unwrap_or(100),
            max_body_bytes: s.max_body_bytes.unwrap_or(4 * 1024 * 1024),
            max_connections: s.max_connections.unwrap_or(10_000),
            max_streams: s.max_streams.unwrap_or(5_000),
            sse_keepalive: ms(s.sse_keepalive_ms.unwrap_or(15_000)),
            ws_allowed_origins: ws.allowed_origins.unwrap_or_default(),
            ws_max_message_bytes: ws.max_message_bytes.unwrap_or(256 * 1024),
            ws_buffer_bytes: ws.buffer_bytes.unwrap_or(8 * 1024),
            ws_send_queue: ws.send_queue.unwrap_or(256).max(1),
            ws_ping_interval: ms(ws.ping_interval_ms.unwrap_or(20_000)),
            admin_token_env: s.admin_token_env,
            deadline: ms(s.deadline_ms.unwrap_or(60_000).max(1)),
            max_stream: ms(s.max_stream_ms.unwrap_or(600_000).max(1)),
        }
    }

    pub(super) fn hedge(&mut self, h: RawHedge) -> HedgeConfig {
        let ms = Duration::from_millis;
        let percentile = h.percentile.unwrap_or(0.95);
        if !(0.5..1.0).contains(&percentile) {
            self.problem("hedge.percentile", "must be in [0.5, 1.0)");
        }
        let floor = ms(h.floor_ms.unwrap_or(50));
        let ceiling = ms(h.ceiling_ms.unwrap_or(5_000));
        if floor > ceiling {
            self.problem("hedge.floor_ms", "must not exceed hedge.ceiling_ms");
        }
        let ratio = h.budget_ratio.unwrap_or(0.1);
        if !(0.0..=1.0).contains(&ratio) {
            self.problem("hedge.budget_ratio", "must be in [0, 1]");
        }
        let max_concurrent = h.max_concurrent_attempts.unwrap_or(2);
        if max_concurrent == 0 {
            self.problem("hedge.max_concurrent_attempts", "must be at least 1");
        }
        HedgeConfig {
            enabled: h.enabled.unwrap_or(true),
            percentile,
            floor,
            ceiling,
            default_delay: ms(h.default_delay_ms.unwrap_or(2_000)),
            min_samples: h.min_samples.unwrap_or(20),
            window: Duration::from_secs(h.window_secs.unwrap_or(60).max(1)),
            budget_ratio: ratio,
            budget_floor_per_sec: h.budget_floor_per_sec.unwrap_or(1.0).max(0.0),
            budget_window: Duration::from_secs(h.budget_window_secs.unwrap_or(10).max(1)),
            max_concurrent_attempts: max_concurrent.max(1),
        }
    }

    pub(super) fn policies(&mut self, value: Option<&toml::Value>) -> PolicyConfig {
        use MidStreamPolicy::*;
        let mut by_type: BTreeMap<&'static str, (MidStreamPolicy, MidStreamPolicy)> = BTreeMap::from([
            ("prose", (Continue, Restart)),
            ("structured", (Restart, Truncate)),
            ("tool", (Restart, Truncate)),
            ("voice", (Continue, Truncate)),
        ]);
        let Some(value) = value else {
            return PolicyConfig { by_type };
        };
        let Some(table) = value.as_table() else {
            self.problem("policies", "must be a table: type = [\"first\", \"fallback\"]");
            return PolicyConfig { by_type };
        };
        for (key, v) in table {
            let path = format!("policies.{key}");
            let Some(slot) = ["prose", "structured", "tool", "voice"].into_iter().find(|t| t == key) else {
                self.problem(&path, "unknown response type (prose, structured, tool, voice)");
                continue;
            };
            let names: Vec<&str> = match v {
                toml::Value::String(s) => vec![s.as_str()],
                toml::Value::Array(a) => a.iter().filter_map(|x| x.as_str()).collect(),
                _ => Vec::new(),
            };
            let parsed: Vec<MidStreamPolicy> = names.iter().filter_map(|n| MidStreamPolicy::parse(n)).collect();
            if parsed.is_empty() || parsed.len() != names.len() || parsed.len() > 2 {
                self.problem(&path, "must be one or two of \"restart\", \"continue\", \"truncate\"");
                continue;
            }
            if matches!(slot, "tool" | "structured") && parsed.contains(&Continue) {
                self.problem(&path, "continue is never allowed for tool or structured answers");
                continue;
            }
            let first = parsed[0];
            // A single policy falls back to an honest truncation.
            let fallback = parsed.get(1).copied().unwrap_or(Truncate);
            by_type.insert(slot, (first, fallback));
        }
        PolicyConfig { by_type }
    }
}

impl Validator {
    pub(super) fn breaker(&mut self, b: super::raw::RawBreaker) -> crate::health::breaker::BreakerConfig {
        let d = crate::health::breaker::BreakerConfig::default();
        let error_rate = b.error_rate.unwrap_or(d.error_rate);
        if !(0.0..=1.0).contains(&error_rate) || error_rate == 0.0 {
            self.problem("breaker.error_rate", "must be in (0, 1]");
        }
        let cooldown = b.cooldown_ms.map_or(d.cooldown, Duration::from_millis);
        let max_cooldown = b.max_cooldown_ms.map_or(d.max_cooldown, Duration::from_millis);
        if cooldown > max_cooldown {
            self.problem("breaker.cooldown_ms", "must not exceed breaker.max_cooldown_ms");
        }
        crate::health::breaker::BreakerConfig {
            window: b.window_secs.map_or(d.window, |s| Duration::from_secs(s.max(1))),
            min_volume: b.min_volume.unwrap_or(d.min_volume),
            error_rate: error_rate.clamp(0.0, 1.0),
            consecutive_failures: b.consecutive_failures.unwrap_or(d.consecutive_failures),
            cooldown,
            max_cooldown,
            half_open_probes: b.half_open_probes.unwrap_or(d.half_open_probes).max(1),
        }
    }
}
