//! Validation of the plain sections: `[server]` (with `[server.ws]` and `[server.cors]`),
//! `[hedge]`, the mid-stream `[policies]` and `[breaker]`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::raw::{RawCors, RawHedge, RawServer, RawStreams};
use super::validate::Validator;
use super::{BreakerConfig, ProbeMode, RequestLimits};
use super::{HedgeConfig, MidStreamPolicy, PolicyConfig, ServerConfig, StreamsConfig};

impl Validator {
    pub(super) fn server(&mut self, s: RawServer) -> ServerConfig {
        let ws = s.ws.unwrap_or_default();
        let cors_allowed_origins = self.cors_origins(s.cors.unwrap_or_default(), ws.allowed_origins.is_some());
        let ms = Duration::from_millis;
        ServerConfig {
            listen: self.addr("server.listen", s.listen, "127.0.0.1:8080"),
            drain: ms(s.drain_ms.unwrap_or(15_000)),
            drain_grace: ms(s.drain_grace_ms.unwrap_or(5_000)),
            header_read_timeout: self.timeout("server.header_read_timeout_ms", s.header_read_timeout_ms, 10_000),
            idle_timeout: self.timeout("server.idle_timeout_ms", s.idle_timeout_ms, 60_000),
            body_read_timeout: self.timeout("server.body_read_timeout_ms", s.body_read_timeout_ms, 10_000),
            client_write_timeout: self.timeout("server.client_write_timeout_ms", s.client_write_timeout_ms, 30_000),
            batch_max_share: self.share("server.batch_max_share", s.batch_max_share, 0.8),
            max_header_bytes: s.max_header_bytes.unwrap_or(64 * 1024),
            max_headers: s.max_headers.unwrap_or(100),
            max_body_bytes: s.max_body_bytes.unwrap_or(4 * 1024 * 1024),
            max_answer_bytes: s.max_answer_bytes.unwrap_or(8 * 1024 * 1024).max(1),
            max_connections: s.max_connections.unwrap_or(10_000),
            max_streams: s.max_streams.unwrap_or(5_000),
            sse_keepalive: ms(s.sse_keepalive_ms.unwrap_or(15_000)),
            cors_allowed_origins,
            ws_max_message_bytes: ws.max_message_bytes.unwrap_or(256 * 1024),
            ws_buffer_bytes: ws.buffer_bytes.unwrap_or(8 * 1024),
            ws_send_queue: ws.send_queue.unwrap_or(256).max(1),
            ws_ping_interval: ms(ws.ping_interval_ms.unwrap_or(20_000)),
            admin_token_env: s.admin_token_env,
            allow_unauthenticated: s.allow_unauthenticated.unwrap_or(false),
            metrics_public: s.metrics_public.unwrap_or(false),
            deadline: ms(s.deadline_ms.unwrap_or(60_000).max(1)),
            max_stream: ms(s.max_stream_ms.unwrap_or(600_000).max(1)),
            request_limits: self.request_limits(s.max_messages, s.max_decoded_bytes),
            streams: self.streams(s.streams.unwrap_or_default()),
        }
    }

    /// `[server.streams]`; every bound at least 1 so a zero cannot make streams unusable.
    fn streams(&mut self, s: RawStreams) -> StreamsConfig {
        let ms = Duration::from_millis;
        let max_bytes = s.max_bytes.unwrap_or(256 * 1024);
        if max_bytes < 1024 {
            self.problem("server.streams.max_bytes", "must be at least 1024");
        }
        StreamsConfig {
            max_open: s.max_open.unwrap_or(2_000).max(1),
            max_events: s.max_events.unwrap_or(4_096).max(1),
            max_bytes,
            keep_after_done: ms(s.keep_after_done_ms.unwrap_or(60_000)),
            detached_cancel: ms(s.detached_cancel_ms.unwrap_or(30_000).max(1)),
            retry: ms(s.retry_ms.unwrap_or(1_000)),
        }
    }

    fn request_limits(&mut self, max_messages: Option<usize>, max_decoded_bytes: Option<usize>) -> RequestLimits {
        let defaults = RequestLimits::default();
        let limits = RequestLimits {
            max_messages: max_messages.unwrap_or(defaults.max_messages),
            max_decoded_bytes: max_decoded_bytes.unwrap_or(defaults.max_decoded_bytes),
        };
        if limits.max_messages == 0 {
            self.problem("server.max_messages", "must be at least 1");
        }
        if limits.max_decoded_bytes < 1024 {
            self.problem("server.max_decoded_bytes", "must be at least 1024");
        }
        limits
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
    /// A connection timeout in ms: zero would close every connection at once, so it is refused.
    fn timeout(&mut self, path: &str, value: Option<u64>, default: u64) -> Duration {
        let ms = value.unwrap_or(default);
        if ms == 0 {
            self.problem(path, "must be at least 1 (a zero timeout would close every connection)");
            return Duration::from_millis(default);
        }
        Duration::from_millis(ms)
    }

    /// A share of a capacity, in (0, 1].
    fn share(&mut self, path: &str, value: Option<f64>, default: f64) -> f64 {
        let share = value.unwrap_or(default);
        if !(share > 0.0 && share <= 1.0) {
            self.problem(path, "must be in (0, 1]");
            return default;
        }
        share
    }

    /// `[server.cors] allowed_origins`, normalized to the form browsers send in `Origin`.
    fn cors_origins(&mut self, cors: RawCors, listed_under_ws: bool) -> Vec<String> {
        if listed_under_ws {
            self.problem(
                "server.ws.allowed_origins",
                "moved to [server.cors] allowed_origins (one list for HTTP and WebSocket alike)",
            );
        }
        let mut origins = Vec::new();
        for (i, text) in cors.allowed_origins.unwrap_or_default().iter().enumerate() {
            match normalize_origin(text) {
                Ok(origin) if origins.contains(&origin) => {}
                Ok(origin) => origins.push(origin),
                Err(why) => self.problem(format!("server.cors.allowed_origins[{i}]"), format!("{text:?}: {why}")),
            }
        }
        origins
    }
}

/// An exact origin as a browser serializes it: lowercase `scheme://host[:port]`, without the
/// scheme's default port.
pub fn normalize_origin(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.contains('*') {
        return Err(
            "wildcards are not allowed: every web site's scripts could then call tailcut from \
             their visitors' browsers and spend its provider keys; list each origin"
                .into(),
        );
    }
    if text.eq_ignore_ascii_case("null") {
        return Err(
            "the opaque origin \"null\" (sandboxed frames, file:// pages) can be sent by any \
             page; serve the page from a real origin and list that"
                .into(),
        );
    }
    let lower = text.to_ascii_lowercase();
    let Some((scheme, authority)) = lower.split_once("://") else {
        return Err("must be scheme://host[:port], e.g. https://app.example".into());
    };
    let default_port = match scheme {
        "http" => 80,
        "https" => 443,
        _ => return Err("the scheme must be http or https".into()),
    };
    if let Some(bare) = authority.strip_suffix('/').filter(|a| !a.contains(['/', '?', '#'])) {
        return Err(format!("no trailing slash: browsers send {scheme}://{bare}"));
    }
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err("an origin is scheme://host[:port] only: no path, query or user".into());
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (inside, rest) = v6.split_once(']').ok_or("an IPv6 address needs its closing ']'")?;
            if inside.is_empty() || !inside.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.') {
                return Err("not an IPv6 address in brackets".into());
            }
            let port = match rest {
                "" => None,
                _ => Some(rest.strip_prefix(':').ok_or("only :port may follow an IPv6 address")?),
            };
            (&authority[..inside.len() + 2], port)
        }
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if !host.starts_with('[')
        && (host.is_empty() || !host.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'))
    {
        return Err(
            "the host must be a name (in its xn-- form if not ASCII), an IPv4 address or an IPv6 \
             address in brackets"
                .into(),
        );
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("{p:?} is not a port (1-65535)")),
            Ok(p) if p == default_port => None,
            Ok(p) => Some(p),
        },
    };
    Ok(match port {
        Some(p) => format!("{scheme}://{host}:{p}"),
        None => format!("{scheme}://{host}"),
    })
}

impl Validator {
    pub(super) fn breaker(&mut self, b: super::raw::RawBreaker) -> BreakerConfig {
        let d = BreakerConfig::default();
        let ms = Duration::from_millis;
        let error_rate = b.error_rate.unwrap_or(d.error_rate);
        if !(0.0..=1.0).contains(&error_rate) || error_rate == 0.0 {
            self.problem("breaker.error_rate", "must be in (0, 1]");
        }
        let cooldown = b.cooldown_ms.map_or(d.cooldown, ms);
        if cooldown.is_zero() {
            // A zero cool-down doubles to zero: a failing route would be probed in a loop.
            self.problem("breaker.cooldown_ms", "must be at least 1");
        }
        // Unset, the cap follows a longer base cool-down rather than reject it.
        let max_cooldown = b.max_cooldown_ms.map_or(d.max_cooldown.max(cooldown), ms);
        if cooldown > max_cooldown {
            self.problem("breaker.cooldown_ms", "must not exceed breaker.max_cooldown_ms");
        }
        if max_cooldown > MAX_BREAKER_COOLDOWN {
            self.problem(
                "breaker.max_cooldown_ms",
                format!(
                    "must not exceed {} (a recovered route would wait that long)",
                    MAX_BREAKER_COOLDOWN.as_millis()
                ),
            );
        }
        let probe = match b.probe.as_deref() {
            None => d.probe,
            Some(s) => ProbeMode::parse(s).unwrap_or_else(|| {
                self.problem("breaker.probe", "must be \"background\" or \"traffic\"");
                d.probe
            }),
        };
        let quota_cooldown = b.quota_cooldown_ms.map_or(d.quota_cooldown, ms);
        if quota_cooldown.is_zero() || quota_cooldown > MAX_QUOTA_COOLDOWN {
            self.problem(
                "breaker.quota_cooldown_ms",
                format!("must be in [1, {}]", MAX_QUOTA_COOLDOWN.as_millis()),
            );
        }
        BreakerConfig {
            window: b.window_secs.map_or(d.window, |s| Duration::from_secs(s.max(1))),
            min_volume: b.min_volume.unwrap_or(d.min_volume),
            error_rate: error_rate.clamp(0.0, 1.0),
            consecutive_failures: b.consecutive_failures.unwrap_or(d.consecutive_failures),
            cooldown: cooldown.max(ms(1)),
            max_cooldown: max_cooldown.max(ms(1)),
            half_open_probes: b.half_open_probes.unwrap_or(d.half_open_probes).max(1),
            probe,
            quota_cooldown: quota_cooldown.clamp(ms(1), MAX_QUOTA_COOLDOWN),
        }
    }
}

/// The longest spacing between two probes of a route a config may ask for.
const MAX_BREAKER_COOLDOWN: Duration = Duration::from_secs(600);
/// The longest a quota failure may cool a route (Health's cap on any cooling).
const MAX_QUOTA_COOLDOWN: Duration = Duration::from_secs(3600);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::ProbeMode;
    use crate::config::{load_str, ConfigError};

    fn with_breaker(section: &str) -> Result<crate::config::Config, ConfigError> {
        load_str(&format!(
            "[[routes]]\nname = \"a\"\nprovider = \"simulated\"\n[models.chat]\nroutes = [\"a\"]\n[breaker]\n{section}"
        ))
    }

    fn problem_paths(section: &str) -> Vec<String> {
        match with_breaker(section) {
            Err(ConfigError::Invalid(problems)) => problems.into_iter().map(|p| p.path).collect(),
            Err(e) => panic!("a validation error, not {e}"),
            Ok(_) => Vec::new(),
        }
    }

    fn with_server(section: &str) -> Result<crate::config::Config, ConfigError> {
        load_str(&format!(
            "{section}\n[[routes]]\nname = \"a\"\nprovider = \"simulated\"\n[models.chat]\nroutes = [\"a\"]\n"
        ))
    }

    #[test]
    fn zero_connection_timeouts_and_a_share_outside_zero_to_one_are_refused() {
        let section = "[server]\nheader_read_timeout_ms = 0\nidle_timeout_ms = 0\nbody_read_timeout_ms = 0\n\
                       client_write_timeout_ms = 0\nbatch_max_share = 1.5";
        let paths: Vec<String> = match with_server(section) {
            Err(ConfigError::Invalid(problems)) => problems.into_iter().map(|p| p.path).collect(),
            other => panic!("a validation error, not {:?}", other.map(|_| ())),
        };
        for key in [
            "server.header_read_timeout_ms",
            "server.idle_timeout_ms",
            "server.body_read_timeout_ms",
            "server.client_write_timeout_ms",
            "server.batch_max_share",
        ] {
            assert!(paths.iter().any(|p| p == key), "{key} is named: {paths:?}");
        }
        for share in ["0", "0.0", "-0.1", "nan"] {
            let section = format!("[server]\nbatch_max_share = {share}");
            assert!(with_server(&section).is_err(), "batch_max_share = {share} is refused");
        }
        let cfg = with_server("[server]\nbatch_max_share = 1.0").expect("a share of 1 is allowed");
        assert_eq!(cfg.server.batch_max_share, 1.0, "kept");
        let cfg = with_server("").expect("defaults are valid");
        assert_eq!(
            (
                cfg.server.body_read_timeout,
                cfg.server.client_write_timeout,
                cfg.server.batch_max_share
            ),
            (Duration::from_secs(10), Duration::from_secs(30), 0.8),
            "documented defaults"
        );
    }

    #[test]
    fn cors_origins_are_kept_as_browsers_send_them() {
        let cfg = with_server(
            "[server.cors]\nallowed_origins = [\"https://App.Example\", \"https://app.example:443\", \
             \"http://localhost:5173\", \"http://[::1]:3000\"]",
        )
        .expect("valid");
        assert_eq!(
            cfg.server.cors_allowed_origins,
            ["https://app.example", "http://localhost:5173", "http://[::1]:3000"],
            "lowercase, default port dropped, duplicates merged"
        );
        let cfg = with_server("").expect("valid");
        assert!(cfg.server.cors_allowed_origins.is_empty(), "no origins by default");
    }

    #[test]
    fn bad_cors_origins_are_reported_with_their_path_and_reason() {
        for (origin, why) in [
            ("*", "wildcards are not allowed"),
            ("https://*.example", "wildcards are not allowed"),
            ("null", "opaque origin"),
            ("app.example", "scheme://host"),
            ("ftp://app.example", "http or https"),
            ("https://app.example/", "no trailing slash"),
            ("https://app.example/chat", "no path"),
            ("https://user@app.example", "no path, query or user"),
            ("https://app.example:99999", "not a port"),
            ("https://", "no path, query or user"),
            ("http://::1", "in brackets"),
            ("https://bücher.example", "xn--"),
        ] {
            let section = format!("[server.cors]\nallowed_origins = [\"https://ok.example\", {origin:?}]");
            match with_server(&section) {
                Err(ConfigError::Invalid(problems)) => assert!(
                    problems
                        .iter()
                        .any(|p| p.path == "server.cors.allowed_origins[1]" && p.message.contains(why)),
                    "{origin:?} is refused at its index, saying {why:?}: {problems:?}"
                ),
                other => panic!(
                    "{origin:?} must be refused, got {:?}",
                    other.map(|c| c.server.cors_allowed_origins)
                ),
            }
        }
    }

    #[test]
    fn ws_allowed_origins_points_to_server_cors() {
        match with_server("[server.ws]\nallowed_origins = [\"https://app.example\"]") {
            Err(ConfigError::Invalid(problems)) => assert!(
                problems
                    .iter()
                    .any(|p| p.path == "server.ws.allowed_origins" && p.message.contains("[server.cors]")),
                "the old key names its new home: {problems:?}"
            ),
            other => panic!("the old key must be refused, got {:?}", other.is_ok()),
        }
    }

    #[test]
    fn breaker_defaults_probe_in_the_background_with_a_short_cap() {
        let cfg = with_breaker("").expect("valid");
        assert_eq!(cfg.breaker.probe, ProbeMode::Background, "background probes by default");
        assert_eq!(
            cfg.breaker.max_cooldown,
            Duration::from_secs(5),
            "probes at most 5 s apart"
        );
        assert_eq!(
            cfg.breaker.quota_cooldown,
            Duration::from_secs(300),
            "quota cools for 5 min"
        );
    }

    #[test]
    fn breaker_keys_are_read() {
        let cfg =
            with_breaker("probe = \"traffic\"\nmax_cooldown_ms = 8000\nquota_cooldown_ms = 60000\n").expect("valid");
        assert_eq!(cfg.breaker.probe, ProbeMode::Traffic, "probe");
        assert_eq!(cfg.breaker.max_cooldown, Duration::from_secs(8), "max_cooldown_ms");
        assert_eq!(cfg.breaker.quota_cooldown, Duration::from_secs(60), "quota_cooldown_ms");
    }

    #[test]
    fn a_long_base_cooldown_raises_an_unset_cap() {
        let cfg = with_breaker("cooldown_ms = 8000\n").expect("valid without max_cooldown_ms");
        assert_eq!(
            cfg.breaker.max_cooldown,
            Duration::from_secs(8),
            "the cap follows the base"
        );
    }

    #[test]
    fn bad_breaker_values_are_reported_with_their_path() {
        for (section, path) in [
            ("probe = \"sometimes\"\n", "breaker.probe"),
            ("cooldown_ms = 0\n", "breaker.cooldown_ms"),
            ("cooldown_ms = 3000\nmax_cooldown_ms = 2000\n", "breaker.cooldown_ms"),
            ("max_cooldown_ms = 36000000\n", "breaker.max_cooldown_ms"),
            ("quota_cooldown_ms = 0\n", "breaker.quota_cooldown_ms"),
            ("error_rate = 0.0\n", "breaker.error_rate"),
        ] {
            let paths = problem_paths(section);
            assert!(
                paths.iter().any(|p| p == path),
                "{section:?} is a problem at {path}: {paths:?}"
            );
        }
    }
}
