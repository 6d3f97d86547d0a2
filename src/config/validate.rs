//! Turns TOML text into a validated `Config`, collecting every problem (with its key path)
//! instead of stopping at the first, so `tailcut check-config` can list them all at once.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use serde::de::DeserializeOwned;

use super::raw::{RawBreaker, RawCache, RawHedge, RawLeases, RawLimits, RawModel, RawRanking, RawServer, RawSim};
use super::{Config, ModelConfig, RouteConfig, SimConfig};
use crate::sim::Scenario;

/// One thing wrong with a config file, at a key path such as `routes[1].provider`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{} problem(s) in the configuration:\n{}", .0.len(), .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<ConfigProblem>),
}

pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    load_str(&read(path)?)
}

pub fn load_str(text: &str) -> Result<Config, ConfigError> {
    match build(text) {
        (Some(config), problems) if problems.is_empty() => Ok(config),
        (_, problems) => Err(ConfigError::Invalid(problems)),
    }
}

/// For `check-config`: every problem in the file, and the config as far as it could be
/// built (each broken key at its default), so the variables it names can be checked too
/// even when something else is wrong. `None` when the file is not TOML or its `extends`
/// cannot be resolved.
pub fn check_file(path: &Path) -> Result<(Option<Config>, Vec<ConfigProblem>), ConfigError> {
    Ok(build(&read(path)?))
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn build(text: &str) -> (Option<Config>, Vec<ConfigProblem>) {
    let mut v = Validator::default();
    let table: toml::Table = match toml::from_str(text) {
        Ok(t) => t,
        Err(e) => {
            v.problem("<file>", e.to_string().trim_end());
            return (None, v.problems);
        }
    };
    let table = match super::extends::resolve(table) {
        Ok(t) => t,
        Err(why) => {
            v.problem("extends", why);
            return (None, v.problems);
        }
    };
    let config = v.config(&table);
    (Some(config), v.problems)
}

#[derive(Default)]
pub(super) struct Validator {
    problems: Vec<ConfigProblem>,
}

const TOP_LEVEL: &[&str] = &[
    "server", "routes", "models", "tenants", "hedge", "policies", "limits", "breaker", "ranking", "leases", "cache",
    "sim", "auth", "extends", "eval", "state",
];

impl Validator {
    pub(super) fn problem(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(ConfigProblem {
            path: path.into(),
            message: message.into(),
        });
    }

    /// Deserializes one section, recording type errors and unknown keys under `path`.
    pub(super) fn section<T: DeserializeOwned + Default>(&mut self, path: &str, value: Option<&toml::Value>) -> T {
        let Some(value) = value else { return T::default() };
        self.section_opt(path, value).unwrap_or_default()
    }

    fn config(&mut self, table: &toml::Table) -> Config {
        for key in table.keys() {
            if !TOP_LEVEL.contains(&key.as_str()) {
                self.problem(key.as_str(), format!("unknown key (known: {})", TOP_LEVEL.join(", ")));
            }
        }
        let server: RawServer = self.section("server", table.get("server"));
        let hedge: RawHedge = self.section("hedge", table.get("hedge"));
        let limits: RawLimits = self.section("limits", table.get("limits"));
        let breaker: RawBreaker = self.section("breaker", table.get("breaker"));
        let ranking: RawRanking = self.section("ranking", table.get("ranking"));
        let leases: RawLeases = self.section("leases", table.get("leases"));
        let cache: RawCache = self.section("cache", table.get("cache"));
        let sim_raw: RawSim = self.section("sim", table.get("sim"));
        let sim = self.sim(sim_raw);
        let mut routes = self.routes(table.get("routes"), &sim);
        let eval_raw: super::families::RawEval = self.section("eval", table.get("eval"));
        let eval = self.eval_scores(eval_raw, &mut routes);
        let state_raw: super::state::RawState = self.section("state", table.get("state"));
        let state = self.state(state_raw);
        let models = self.models(table.get("models"), &routes);
        let tenants = self.tenants(table.get("tenants"), &routes);
        let policies = self.policies(table.get("policies"));
        let auth = self.auth(table.get("auth"), &tenants, &models);
        Config {
            server: self.server(server),
            routes,
            models,
            hedge: self.hedge(hedge),
            policies,
            limits: self.limits(limits),
            breaker: self.breaker(breaker),
            tenants,
            ranking: self.ranking(ranking),
            leases: self.leases(leases),
            cache: self.cache(cache),
            sim,
            auth,
            eval,
            state,
        }
    }

    /// A listen address: `IP:PORT`, or `HOST:PORT` with the host name resolved now
    /// (`localhost:8083`; an IPv4 address preferred when the name has both).
    pub(super) fn addr(&mut self, path: &str, value: Option<String>, default: &str) -> SocketAddr {
        let text = value.unwrap_or_else(|| default.to_string());
        match resolve_addr(&text) {
            Ok(a) => a,
            Err(why) => {
                self.problem(path, why);
                default.parse().unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)))
            }
        }
    }

    fn sim(&mut self, raw: RawSim) -> SimConfig {
        let listen = raw.listen.map(|l| self.addr("sim.listen", Some(l), "127.0.0.1:0"));
        let mut scenarios = BTreeMap::new();
        for (name, value) in raw.scenarios.unwrap_or_default() {
            let path = format!("sim.scenarios.{name}");
            let scenario: Option<Scenario> = self.section_opt(&path, &value);
            if let Some(s) = &scenario {
                for (key, why) in s.problems() {
                    self.problem(format!("{path}.{key}"), why);
                }
            }
            // A scenario that does not parse is still defined: routes naming it must not also
            // be told it is unknown (the config is refused for its own problems anyway).
            scenarios.insert(name, scenario.unwrap_or_default());
        }
        SimConfig { listen, scenarios }
    }

    /// Deserializes one section, recording unknown keys and a type error under their full
    /// key paths (`server.max_body_bytes`), each message on one line.
    fn section_opt<T: DeserializeOwned>(&mut self, path: &str, value: &toml::Value) -> Option<T> {
        let mut unknown = Vec::new();
        let result: Result<T, _> = {
            let mut note = |p: serde_ignored::Path<'_>| unknown.push(p.to_string());
            let ignored = serde_ignored::Deserializer::new(value.clone(), &mut note);
            serde_path_to_error::deserialize(ignored)
        };
        for key in unknown {
            self.problem(format!("{path}.{key}"), "unknown key");
        }
        match result {
            Ok(t) => Some(t),
            Err(e) => {
                let inner = e.path().to_string();
                let at = match inner.as_str() {
                    "" | "." => path.to_string(),
                    sub if sub.starts_with('[') => format!("{path}{sub}"),
                    sub => format!("{path}.{sub}"),
                };
                self.problem(at, one_line(&e.into_inner().to_string()));
                None
            }
        }
    }

    fn models(&mut self, value: Option<&toml::Value>, routes: &[RouteConfig]) -> BTreeMap<String, ModelConfig> {
        let mut out = BTreeMap::new();
        let Some(table) = value.and_then(|v| v.as_table()) else {
            if value.is_some() {
                self.problem("models", "must be a table of [models.NAME] entries");
            } else {
                self.problem("models", "at least one [models.NAME] entry is required");
            }
            return out;
        };
        for (name, v) in table {
            let path = format!("models.{name}");
            let raw: RawModel = self.section(&path, Some(v));
            // `families = [...]` or the flat `routes = [...]` (routing.rs).
            let (list, families, rotation) = self.families(&path, raw.routes, raw.families, raw.rotation, routes);
            let task = self
                .task(&format!("{path}.task"), raw.task)
                .unwrap_or_else(|| "chat".to_string());
            let quality_floor = self.floor(&format!("{path}.quality_floor"), raw.quality_floor);
            out.insert(
                name.clone(),
                ModelConfig {
                    routes: list,
                    families,
                    rotation,
                    hedge: raw.hedge.unwrap_or(true),
                    task,
                    quality_floor,
                },
            );
        }
        out
    }
}

/// Resolves `IP:PORT` or `HOST:PORT` to one socket address, preferring IPv4.
pub fn resolve_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    if text
        .rsplit_once(':')
        .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
    {
        return Err(format!(
            "{text:?} is not an address like 127.0.0.1:8080 or localhost:8080"
        ));
    }
    let found: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(text)
        .map_err(|e| format!("{text:?}: the host name does not resolve ({e})"))?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| format!("{text:?}: the host name resolves to no address"))
}

/// An error message on one line (toml's messages carry line breaks).
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::PrefillConvention;

    #[test]
    fn embedded_default_config_is_valid() {
        let config = load_str(crate::config::DEFAULT_TOML).expect("default.toml must validate");
        assert!(config.needs_sim(), "the default serves simulated routes");
        assert!(config.models.contains_key("chat"), "the default has a `chat` model");
    }

    #[test]
    fn every_problem_is_reported_at_once_with_its_path() {
        let text = r#"
            bogus = 1
            [server]
            listen = "nowhere"
            colour = "blue"
            [[routes]]
            name = "a"
            provider = "openia"
            [[routes]]
            name = "b"
            provider = "openai"
            model = "gpt-4o-mini"
            level = "L9"
            [[routes]]
            name = "a"
            provider = "simulated"
            scenario = "no-such-profile"
            [models.chat]
            routes = ["a", "missing"]
            [hedge]
            percentile = 1.5
            [policies]
            tool = ["continue"]
        "#;
        let Err(ConfigError::Invalid(problems)) = load_str(text) else {
            panic!("a broken config must be rejected")
        };
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        for expected in [
            "bogus",
            "server.listen",
            "server.colour",
            "routes[0].provider",
            "routes[1].base_url",
            "routes[1].level",
            "routes[2].name",
            "routes[2].scenario",
            "models.chat.routes[1]",
            "hedge.percentile",
            "policies.tool",
        ] {
            assert!(
                paths.contains(&expected),
                "expected a problem at {expected}; got {paths:?}"
            );
        }
    }

    #[test]
    fn http2_prior_knowledge_is_for_plain_http_upstreams_only() {
        let route = |url: &str| {
            format!(
                "[[routes]]\nname = \"a\"\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"{url}\"\nhttp2_prior_knowledge = true\n[models.chat]\nroutes = [\"a\"]\n"
            )
        };
        let config = load_str(&route("http://envoy.internal:8080/v1")).expect("h2c to a plain-http upstream");
        assert!(config.routes[0].http2_prior_knowledge);
        let Err(ConfigError::Invalid(problems)) = load_str(&route("https://api.openai.com/v1")) else {
            panic!("prior knowledge over TLS must be refused")
        };
        assert_eq!(
            problems.iter().map(|p| p.path.as_str()).collect::<Vec<_>>(),
            ["routes[0].http2_prior_knowledge"],
            "{problems:?}"
        );
        let simulated = "[[routes]]\nname = \"a\"\nprovider = \"simulated\"\nhttp2_prior_knowledge = true\n[models.chat]\nroutes = [\"a\"]\n";
        assert!(load_str(simulated).expect("the simulator speaks h2c").routes[0].http2_prior_knowledge);
        let plain = load_str(&route("http://h").replace("http2_prior_knowledge = true\n", "")).expect("valid");
        assert!(!plain.routes[0].http2_prior_knowledge, "off unless asked for");
    }

    #[test]
    fn a_scenario_out_of_range_is_refused_key_by_key_and_a_broken_one_is_still_defined() {
        let text = r#"
            [[routes]]
            name = "a"
            provider = "simulated"
            scenario = "big"
            [[routes]]
            name = "b"
            provider = "simulated"
            scenario = "typo"
            [models.chat]
            routes = ["a", "b"]
            [sim.scenarios.big]
            tokens = 200000
            inter_token_ms = -5
            chunk_split = 0
            ttft = { median_ms = 50.0, stall_prob = 1.5 }
            brownout = { period_ms = 1000, duty = 2.0, extra_ms = 10.0 }
            [sim.scenarios.big.failure]
            status = 99
            status_rate = 2.0
            drop_rate = -1.0
            [[sim.scenarios.big.phases]]
            ms = 100
            failure = { status = 700 }
            [sim.scenarios.typo]
            tokenz = 3
        "#;
        let Err(ConfigError::Invalid(problems)) = load_str(text) else {
            panic!("out-of-range scenario values must be rejected")
        };
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        for expected in [
            "sim.scenarios.big.tokens",
            "sim.scenarios.big.inter_token_ms",
            "sim.scenarios.big.chunk_split",
            "sim.scenarios.big.ttft.stall_prob",
            "sim.scenarios.big.brownout.duty",
            "sim.scenarios.big.failure.status",
            "sim.scenarios.big.failure.status_rate",
            "sim.scenarios.big.failure.drop_rate",
            "sim.scenarios.big.phases[0].failure.status",
            "sim.scenarios.typo.tokenz",
        ] {
            assert!(
                paths.contains(&expected),
                "expected a problem at {expected}; got {paths:?}"
            );
        }
        assert!(
            !paths.contains(&"routes[1].scenario"),
            "a scenario that does not parse is not also unknown: {paths:?}"
        );
        assert_eq!(paths.len(), 10, "nothing else: {paths:?}");
    }

    #[test]
    fn a_route_listed_twice_in_a_model_is_an_error() {
        let text = r#"
            [[routes]]
            name = "a"
            provider = "simulated"
            [models.chat]
            routes = ["a", "a"]
        "#;
        let err = load_str(text).expect_err("a duplicate must be refused");
        assert!(
            err.to_string().contains("models.chat.routes[1]"),
            "the problem names the duplicate's path: {err}"
        );
    }

    #[test]
    fn prefill_convention_is_validated_per_wire() {
        let text = r#"
            [[routes]]
            name = "a"
            provider = "simulated"
            prefill = "vllm"
            [[routes]]
            name = "b"
            provider = "simulated"
            wire = "anthropic"
            prefill = "prefix"
            [[routes]]
            name = "c"
            provider = "simulated"
            prefill = "sometimes"
            [models.chat]
            routes = ["a", "b", "c"]
        "#;
        let err = load_str(text).expect_err("bad conventions must be refused").to_string();
        assert!(
            err.contains("routes[1].prefill"),
            "an OpenAI convention on the anthropic wire: {err}"
        );
        assert!(err.contains("routes[2].prefill"), "an unknown convention: {err}");
        assert!(
            !err.contains("routes[0].prefill"),
            "vllm on the OpenAI wire is fine: {err}"
        );
        let ok = load_str(
            r#"
            [[routes]]
            name = "a"
            provider = "simulated"
            prefill = "vllm"
            [[routes]]
            name = "o"
            provider = "openai"
            base_url = "http://127.0.0.1:1/v1"
            model = "m"
            [models.chat]
            routes = ["a", "o"]
        "#,
        )
        .expect("valid");
        assert_eq!(ok.routes[0].prefill, PrefillConvention::Vllm);
        assert!(
            ok.routes[0].capabilities.prefill,
            "a convention means the route can continue"
        );
        assert_eq!(
            ok.routes[1].prefill,
            PrefillConvention::None,
            "api.openai.com treats a final assistant message as history: no prefill by default"
        );
    }

    #[test]
    fn unknown_route_key_is_an_error() {
        let text = r#"
            [[routes]]
            name = "a"
            provider = "simulated"
            modle = "x"
            [models.chat]
            routes = ["a"]
        "#;
        let Err(ConfigError::Invalid(problems)) = load_str(text) else {
            panic!("typo must be rejected")
        };
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].path, "routes[0].modle");
    }

    #[test]
    fn toml_syntax_error_is_reported() {
        let Err(ConfigError::Invalid(problems)) = load_str("[server\nlisten=") else {
            panic!("must fail")
        };
        assert_eq!(problems.len(), 1);
    }
}
