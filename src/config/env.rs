//! The environment a config names: every `*_env` key's variable, checked the way `serve`
//! will read it, so `check-config` finds every missing secret at once instead of `serve`
//! stopping at the first.

use super::validate::ConfigProblem;
use super::Config;

/// How much a missing variable matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// `serve` cannot start without it (a route's `api_key_env`).
    Error,
    /// A feature stays off without it (admin writes, browser tokens).
    Warning,
}

/// Every `*_env` variable the config names that is unset or empty, under its key path.
/// Only the variable's name is reported, never a value.
pub fn missing_env(config: &Config) -> Vec<(Severity, ConfigProblem)> {
    let mut out = Vec::new();
    let mut check = |severity, path: String, var: &str, without: &str| {
        if std::env::var(var).map_or(true, |v| v.is_empty()) {
            out.push((
                severity,
                ConfigProblem {
                    path,
                    message: format!("environment variable {var} is not set ({without})"),
                },
            ));
        }
    };
    for (i, route) in config.routes.iter().enumerate() {
        if let Some(var) = &route.api_key_env {
            let path = format!("routes[{i}].api_key_env");
            check(Severity::Error, path, var, "serve cannot start");
        }
    }
    if let Some(var) = &config.server.admin_token_env {
        check(
            Severity::Warning,
            "server.admin_token_env".into(),
            var,
            "admin writes stay off",
        );
    }
    if let Some(var) = config.auth.as_ref().and_then(|a| a.token_secret_env.as_ref()) {
        check(
            Severity::Warning,
            "auth.token_secret_env".into(),
            var,
            "browser tokens stay off",
        );
    }
    if let Some(var) = &config.state.redis_url_env {
        check(
            Severity::Warning,
            "state.redis_url_env".into(),
            var,
            "state stays local to this instance",
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unset_variable_is_reported_with_its_key_path() {
        let text = r#"
            [server]
            admin_token_env = "TAILCUT_TEST_ENV_UNSET_ADMIN"
            [[routes]]
            name = "a"
            provider = "openai"
            base_url = "http://127.0.0.1:1/v1"
            model = "m"
            api_key_env = "TAILCUT_TEST_ENV_UNSET_A"
            [[routes]]
            name = "b"
            provider = "openai"
            base_url = "http://127.0.0.1:1/v1"
            model = "m"
            api_key_env = "TAILCUT_TEST_ENV_UNSET_B"
            [models.chat]
            routes = ["a", "b"]
        "#;
        let config = crate::config::load_str(text).expect("valid");
        let missing = missing_env(&config);
        let paths: Vec<(Severity, &str)> = missing.iter().map(|(s, p)| (*s, p.path.as_str())).collect();
        assert_eq!(
            paths,
            [
                (Severity::Error, "routes[0].api_key_env"),
                (Severity::Error, "routes[1].api_key_env"),
                (Severity::Warning, "server.admin_token_env"),
            ],
            "all of them, not the first: {missing:?}"
        );
    }
}
