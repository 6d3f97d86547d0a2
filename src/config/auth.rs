//! The `[auth]` section: client keys (kept only as SHA-256 hashes, each bound to a tenant,
//! with an optional model allowlist, limits and priority cap) and the environment variable
//! holding the browser tokens' secret; validated with a key path for every problem. Also
//! the safe-by-default rule: no `[auth]`, no listening beyond loopback.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use super::raw::{RawAuth, RawKey};
use super::validate::Validator;
use super::{Config, ModelConfig, TenantConfig};
use crate::types::Priority;

/// `[auth]`: when present, every client request needs a key or a token.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthConfig {
    /// Name of the environment variable holding the HMAC secret of browser tokens; `None`
    /// (or the variable unset) turns `POST /v1/tokens` off.
    pub token_secret_env: Option<String>,
    pub keys: Vec<KeyConfig>,
}

/// One `[[auth.keys]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyConfig {
    /// Names the key in logs and in tokens minted with it; never the key itself.
    pub name: String,
    /// SHA-256 of the key; the key itself is never stored.
    pub sha256: [u8; 32],
    /// The tenant every request with this key is served as.
    pub tenant: String,
    /// The models this key may use; `None`: every model.
    pub models: Option<Vec<String>>,
    /// Requests per minute.
    pub rpm: Option<u32>,
    /// Tokens per minute: each request counts its estimated input tokens plus its
    /// `max_tokens` (see `transport::auth`).
    pub tpm: Option<u32>,
    /// Answers streaming at once.
    pub max_streams: Option<u32>,
    /// The highest tier this key's requests get (a header may only lower it).
    pub priority: Option<Priority>,
}

impl KeyConfig {
    pub fn may_use(&self, model: &str) -> bool {
        self.models.as_ref().is_none_or(|m| m.iter().any(|x| x == model))
    }
}

impl Config {
    /// Is serving on `addr` refused? Without `[auth]` anyone who reaches the server spends
    /// its provider keys, so only loopback is served unless `server.allow_unauthenticated`.
    pub fn refuses_listen(&self, addr: SocketAddr) -> bool {
        self.auth.is_none() && !self.server.allow_unauthenticated && !is_loopback(addr.ip())
    }
}

/// 127.0.0.0/8, ::1, and IPv4-mapped loopback.
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

/// Key names appear in logs and tokens: short, and plain characters only.
pub fn valid_key_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl Validator {
    pub(super) fn auth(
        &mut self,
        value: Option<&toml::Value>,
        tenants: &BTreeMap<String, TenantConfig>,
        models: &BTreeMap<String, ModelConfig>,
    ) -> Option<AuthConfig> {
        let value = value?;
        if !value.is_table() {
            self.problem("auth", "must be a table ([auth] with [[auth.keys]] entries)");
            return None;
        }
        let raw: RawAuth = self.section("auth", Some(value));
        let token_secret_env = raw.token_secret_env.filter(|v| {
            let ok = !v.trim().is_empty();
            if !ok {
                self.problem("auth.token_secret_env", "must name an environment variable");
            }
            ok
        });
        let entries = raw.keys.unwrap_or_default();
        if entries.is_empty() {
            self.problem(
                "auth.keys",
                "at least one [[auth.keys]] entry is required (make one with `tailcut keys new --tenant NAME`)",
            );
        }
        let mut keys = Vec::new();
        let mut names = BTreeSet::new();
        let mut hashes = BTreeSet::new();
        for (i, entry) in entries.iter().enumerate() {
            let path = format!("auth.keys[{i}]");
            let raw: RawKey = self.section(&path, Some(entry));
            let Some(key) = self.key(&path, raw, tenants, models) else {
                continue;
            };
            if !names.insert(key.name.clone()) {
                self.problem(format!("{path}.name"), format!("duplicate key name {:?}", key.name));
            }
            if !hashes.insert(key.sha256) {
                self.problem(format!("{path}.sha256"), "the same key is listed twice");
            }
            keys.push(key);
        }
        Some(AuthConfig { token_secret_env, keys })
    }

    fn key(
        &mut self,
        path: &str,
        raw: RawKey,
        tenants: &BTreeMap<String, TenantConfig>,
        models: &BTreeMap<String, ModelConfig>,
    ) -> Option<KeyConfig> {
        let name = match raw.name {
            Some(n) if valid_key_name(&n) => Some(n),
            Some(n) => {
                self.problem(
                    format!("{path}.name"),
                    format!("{n:?} is not a key name (1 to 64 letters, digits, '-', '_' or '.')"),
                );
                None
            }
            None => {
                self.problem(format!("{path}.name"), "is required");
                None
            }
        };
        let sha256 = match raw.sha256.as_deref().map(parse_sha256) {
            Some(Some(h)) => Some(h),
            Some(None) => {
                self.problem(
                    format!("{path}.sha256"),
                    "must be 64 hex characters: the SHA-256 of the key (`tailcut keys new` prints it)",
                );
                None
            }
            None => {
                self.problem(format!("{path}.sha256"), "is required");
                None
            }
        };
        let tenant = match raw.tenant {
            Some(t) if tenants.contains_key(&t) => Some(t),
            Some(t) => {
                self.problem(
                    format!("{path}.tenant"),
                    format!("no tenant named {t:?} ([tenants.{t}])"),
                );
                None
            }
            None => {
                self.problem(format!("{path}.tenant"), "is required: the key decides the tenant");
                None
            }
        };
        if let Some(list) = &raw.models {
            if list.is_empty() {
                self.problem(
                    format!("{path}.models"),
                    "must list at least one model (leave it out for every model)",
                );
            }
            for (j, m) in list.iter().enumerate() {
                if !models.contains_key(m) {
                    self.problem(format!("{path}.models[{j}]"), format!("no model named {m:?}"));
                }
            }
        }
        for (field, v) in [("rpm", raw.rpm), ("tpm", raw.tpm), ("max_streams", raw.max_streams)] {
            if v == Some(0) {
                self.problem(
                    format!("{path}.{field}"),
                    "must be at least 1 (leave it out for no limit)",
                );
            }
        }
        let priority = self.priority(path, raw.priority.as_deref());
        Some(KeyConfig {
            name: name?,
            sha256: sha256?,
            tenant: tenant?,
            models: raw.models,
            rpm: raw.rpm.filter(|v| *v > 0),
            tpm: raw.tpm.filter(|v| *v > 0),
            max_streams: raw.max_streams.filter(|v| *v > 0),
            priority,
        })
    }
}

fn parse_sha256(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{load_str, ConfigError};

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn with(extra: &str) -> Result<Config, ConfigError> {
        load_str(&format!(
            "[[routes]]\nname = \"a\"\nprovider = \"simulated\"\n[models.chat]\nroutes = [\"a\"]\n\
             [models.other]\nroutes = [\"a\"]\n[tenants.acme]\n{extra}"
        ))
    }

    fn problem_paths(extra: &str) -> Vec<String> {
        match with(extra) {
            Err(ConfigError::Invalid(problems)) => problems.into_iter().map(|p| p.path).collect(),
            Err(e) => panic!("a validation error, not {e}"),
            Ok(_) => Vec::new(),
        }
    }

    #[test]
    fn a_key_is_read_with_its_limits() {
        let cfg = with(&format!(
            "[auth]\ntoken_secret_env = \"SECRET\"\n[[auth.keys]]\nname = \"app\"\nsha256 = \"{HASH}\"\n\
             tenant = \"acme\"\nmodels = [\"chat\"]\nrpm = 60\ntpm = 1000\nmax_streams = 2\npriority = \"batch\"\n"
        ))
        .expect("valid");
        let auth = cfg.auth.expect("[auth] is on");
        assert_eq!(auth.token_secret_env.as_deref(), Some("SECRET"), "token secret env");
        let key = &auth.keys[0];
        assert_eq!(
            (key.name.as_str(), key.tenant.as_str()),
            ("app", "acme"),
            "name and tenant"
        );
        assert_eq!(hex::encode(key.sha256), HASH, "hash kept as bytes");
        assert_eq!(
            (key.rpm, key.tpm, key.max_streams),
            (Some(60), Some(1000), Some(2)),
            "limits"
        );
        assert_eq!(key.priority, Some(Priority::Batch), "priority cap");
        assert!(key.may_use("chat") && !key.may_use("other"), "the allowlist decides");
    }

    #[test]
    fn no_auth_section_means_no_auth() {
        let cfg = with("").expect("valid");
        assert!(cfg.auth.is_none(), "no [auth], no keys");
        let embedded = load_str(crate::config::DEFAULT_TOML).expect("default.toml");
        assert!(embedded.auth.is_none(), "the embedded default runs with no keys");
    }

    #[test]
    fn bad_keys_are_reported_with_their_path() {
        let bad = [
            (
                "name = \"a\"\nsha256 = \"abc\"\ntenant = \"acme\"\n".to_string(),
                "auth.keys[0].sha256",
            ),
            (
                format!("name = \"a\"\nsha256 = \"{}\"\ntenant = \"acme\"\n", "zz".repeat(32)),
                "auth.keys[0].sha256",
            ),
            (
                format!("name = \"a\"\nsha256 = \"{HASH}\"\ntenant = \"nobody\"\n"),
                "auth.keys[0].tenant",
            ),
            (format!("name = \"a\"\nsha256 = \"{HASH}\"\n"), "auth.keys[0].tenant"),
            (format!("sha256 = \"{HASH}\"\ntenant = \"acme\"\n"), "auth.keys[0].name"),
            (
                format!("name = \"a b\"\nsha256 = \"{HASH}\"\ntenant = \"acme\"\n"),
                "auth.keys[0].name",
            ),
            (
                format!("name = \"a\"\nsha256 = \"{HASH}\"\ntenant = \"acme\"\nmodels = [\"gpt-9\"]\n"),
                "auth.keys[0].models[0]",
            ),
            (
                format!("name = \"a\"\nsha256 = \"{HASH}\"\ntenant = \"acme\"\nmodels = []\n"),
                "auth.keys[0].models",
            ),
            (
                format!("name = \"a\"\nsha256 = \"{HASH}\"\ntenant = \"acme\"\nrpm = 0\n"),
                "auth.keys[0].rpm",
            ),
            (
                format!("name = \"a\"\nsha256 = \"{HASH}\"\ntenant = \"acme\"\npriority = \"urgent\"\n"),
                "auth.keys[0].priority",
            ),
            (
                format!("name = \"a\"\nsha256 = \"{HASH}\"\ntenant = \"acme\"\nkey = \"tc_x\"\n"),
                "auth.keys[0].key",
            ),
        ];
        for (entry, path) in bad {
            let paths = problem_paths(&format!("[auth]\n[[auth.keys]]\n{entry}"));
            assert!(
                paths.iter().any(|p| p == path),
                "{entry:?} is a problem at {path}: {paths:?}"
            );
        }
    }

    #[test]
    fn duplicates_and_an_empty_key_list_are_problems() {
        let twice = format!(
            "[auth]\n[[auth.keys]]\nname = \"a\"\nsha256 = \"{HASH}\"\ntenant = \"acme\"\n\
             [[auth.keys]]\nname = \"a\"\nsha256 = \"{HASH}\"\ntenant = \"acme\"\n"
        );
        let paths = problem_paths(&twice);
        assert!(
            paths.contains(&"auth.keys[1].name".to_string()),
            "duplicate name: {paths:?}"
        );
        assert!(
            paths.contains(&"auth.keys[1].sha256".to_string()),
            "duplicate hash: {paths:?}"
        );
        let paths = problem_paths("[auth]\ntoken_secret_env = \"\"\n");
        assert!(paths.contains(&"auth.keys".to_string()), "no keys: {paths:?}");
        assert!(
            paths.contains(&"auth.token_secret_env".to_string()),
            "empty env name: {paths:?}"
        );
        assert!(
            problem_paths("[auth]\nbogus = 1\n").contains(&"auth.bogus".to_string()),
            "unknown key"
        );
    }

    #[test]
    fn without_auth_only_loopback_is_served() {
        let open = with("").expect("valid");
        let any: SocketAddr = "0.0.0.0:8080".parse().expect("addr");
        assert!(open.refuses_listen(any), "0.0.0.0 without [auth] is refused");
        assert!(open.refuses_listen("[::]:8080".parse().expect("addr")), ":: is refused");
        for ok in ["127.0.0.1:8080", "127.1.2.3:1", "[::1]:8080", "[::ffff:127.0.0.1]:80"] {
            assert!(!open.refuses_listen(ok.parse().expect("addr")), "{ok} is loopback");
        }
        let allowed = with("[server]\nallow_unauthenticated = true\n").expect("valid");
        assert!(!allowed.refuses_listen(any), "allow_unauthenticated opts out");
        let authed = with(&format!(
            "[auth]\n[[auth.keys]]\nname = \"a\"\nsha256 = \"{HASH}\"\ntenant = \"acme\"\n"
        ))
        .expect("valid");
        assert!(!authed.refuses_listen(any), "with [auth] any address is served");
    }
}
