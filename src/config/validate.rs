//! Turns TOML text into a validated `Config`, collecting every problem (with its key path)
//! instead of stopping at the first, so `tailcut check-config` can list them all at once.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::raw::{
    RawBreaker, RawCache, RawHedge, RawLeases, RawLimits, RawModel, RawRanking, RawRoute, RawServer, RawSim,
};
use super::{Capabilities, Config, ModelConfig, ProviderKind, RouteConfig, SimConfig, Wire};
use crate::sim::{self, Scenario};
use crate::types::{Level, PrefillConvention};

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
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    load_str(&text)
}

pub fn load_str(text: &str) -> Result<Config, ConfigError> {
    let mut v = Validator::default();
    let table: toml::Table = match toml::from_str(text) {
        Ok(t) => t,
        Err(e) => {
            v.problem("<file>", e.to_string().trim_end());
            return Err(ConfigError::Invalid(v.problems));
        }
    };
    let config = v.config(&table);
    if v.problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid(v.problems))
    }
}

#[derive(Default)]
pub(super) struct Validator {
    problems: Vec<ConfigProblem>,
}

const TOP_LEVEL: &[&str] = &[
    "server", "routes", "models", "tenants", "hedge", "policies", "limits", "breaker", "ranking", "leases", "cache",
    "sim",
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
        let mut unknown = Vec::new();
        let result: Result<T, _> = serde_ignored::deserialize(value.clone(), |p| unknown.push(p.to_string()));
        for key in unknown {
            self.problem(format!("{path}.{key}"), "unknown key");
        }
        match result {
            Ok(t) => t,
            Err(e) => {
                self.problem(path, e.to_string().trim_end());
                T::default()
            }
        }
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
        let routes = self.routes(table.get("routes"), &sim);
        let models = self.models(table.get("models"), &routes);
        let tenants = self.tenants(table.get("tenants"), &routes);
        let policies = self.policies(table.get("policies"));
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
        }
    }

    pub(super) fn addr(&mut self, path: &str, value: Option<String>, default: &str) -> SocketAddr {
        let text = value.unwrap_or_else(|| default.to_string());
        match text.parse() {
            Ok(a) => a,
            Err(_) => {
                self.problem(path, format!("{text:?} is not an address like 127.0.0.1:8080"));
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
            if let Some(s) = scenario {
                scenarios.insert(name, s);
            }
        }
        SimConfig { listen, scenarios }
    }

    fn section_opt<T: DeserializeOwned>(&mut self, path: &str, value: &toml::Value) -> Option<T> {
        let mut unknown = Vec::new();
        let result: Result<T, _> = serde_ignored::deserialize(value.clone(), |p| unknown.push(p.to_string()));
        for key in unknown {
            self.problem(format!("{path}.{key}"), "unknown key");
        }
        match result {
            Ok(t) => Some(t),
            Err(e) => {
                self.problem(path, e.to_string().trim_end());
                None
            }
        }
    }

    fn routes(&mut self, value: Option<&toml::Value>, sim: &SimConfig) -> Vec<RouteConfig> {
        let Some(value) = value else {
            self.problem("routes", "at least one [[routes]] entry is required");
            return Vec::new();
        };
        let Some(entries) = value.as_array() else {
            self.problem("routes", "must be an array of tables ([[routes]])");
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, entry) in entries.iter().enumerate() {
            let path = format!("routes[{i}]");
            let raw: RawRoute = self.section(&path, Some(entry));
            if let Some(route) = self.route(&path, raw, sim) {
                if !seen.insert(route.name.clone()) {
                    self.problem(format!("{path}.name"), format!("duplicate route name {:?}", route.name));
                }
                out.push(route);
            }
        }
        out
    }

    fn route(&mut self, path: &str, r: RawRoute, sim: &SimConfig) -> Option<RouteConfig> {
        let name = match r.name {
            Some(n) if !n.trim().is_empty() => n,
            _ => {
                self.problem(format!("{path}.name"), "required");
                String::from("?")
            }
        };
        let provider = match r.provider.as_deref() {
            Some("openai") => ProviderKind::OpenAi,
            Some("anthropic") => ProviderKind::Anthropic,
            Some("simulated") => ProviderKind::Simulated,
            Some(other) => {
                self.problem(
                    format!("{path}.provider"),
                    format!("{other:?} is not one of openai, anthropic, simulated"),
                );
                ProviderKind::Simulated
            }
            None => {
                self.problem(format!("{path}.provider"), "required (openai, anthropic or simulated)");
                ProviderKind::Simulated
            }
        };
        let wire = match (provider, r.wire.as_deref()) {
            (ProviderKind::Anthropic, None) | (_, Some("anthropic")) => Wire::Anthropic,
            (_, None) | (_, Some("openai")) => Wire::OpenAi,
            (_, Some(other)) => {
                self.problem(format!("{path}.wire"), format!("{other:?} is not openai or anthropic"));
                Wire::OpenAi
            }
        };
        if provider != ProviderKind::Simulated && r.wire.is_some() && wire.provider() != provider {
            self.problem(format!("{path}.wire"), "only simulated routes choose their wire format");
        }
        match (&r.base_url, provider) {
            (None, ProviderKind::OpenAi | ProviderKind::Anthropic) => {
                self.problem(format!("{path}.base_url"), "required for real providers");
            }
            (Some(url), _) if !(url.starts_with("http://") || url.starts_with("https://")) => {
                self.problem(
                    format!("{path}.base_url"),
                    format!("{url:?} must start with http:// or https://"),
                );
            }
            _ => {}
        }
        let scenario = if provider == ProviderKind::Simulated {
            let s = r.scenario.clone().unwrap_or_else(|| "fast-stable".to_string());
            if sim::profile(&s).is_none() && !sim.scenarios.contains_key(&s) {
                self.problem(
                    format!("{path}.scenario"),
                    format!(
                        "unknown scenario {s:?} (built-in: {}; or define [sim.scenarios.{s}])",
                        sim::profile_names().join(", ")
                    ),
                );
            }
            Some(s)
        } else {
            if r.scenario.is_some() {
                self.problem(format!("{path}.scenario"), "only simulated routes have a scenario");
            }
            None
        };
        if let Some(env) = &r.api_key_env {
            if env.is_empty() || env.contains(char::is_whitespace) || env.starts_with("sk-") {
                self.problem(
                    format!("{path}.api_key_env"),
                    "must name an environment variable, never hold a key",
                );
            }
        }
        let level = match r.level.as_deref() {
            None => Level::L0,
            Some(l) => match Level::parse(l) {
                Some(level) if level <= Level::L3 => level,
                _ => {
                    self.problem(format!("{path}.level"), format!("{l:?} is not one of L0, L1, L2, L3"));
                    Level::L0
                }
            },
        };
        let mut capabilities = self.capabilities(path, provider, r.capabilities);
        let prefill = self.prefill(path, wire, &capabilities, r.prefill.as_deref());
        capabilities.prefill = prefill.can_continue();
        let quality = self.scores(&format!("{path}.quality"), r.quality.unwrap_or_default());
        let pools = self.pools(path, r.pools);
        let tokenizer = self.tokenizer(path, r.tokenizer.as_deref());
        let model = r.model.unwrap_or_else(|| {
            if provider != ProviderKind::Simulated {
                self.problem(format!("{path}.model"), "required");
            }
            format!("sim-{name}")
        });
        Some(RouteConfig {
            name,
            provider,
            wire,
            base_url: r.base_url.map(|u| u.trim_end_matches('/').to_string()),
            model,
            api_key_env: r.api_key_env,
            region: r.region.unwrap_or_else(|| "any".to_string()),
            data_terms: r.data_terms.unwrap_or_default(),
            level,
            capabilities,
            prefill,
            context_window: r.context_window.unwrap_or(128_000),
            max_output: r.max_output.unwrap_or(4_096),
            cost_per_1k: r.cost_per_1k.unwrap_or(0.0),
            scenario,
            hedge: r.hedge.unwrap_or(true),
            hedge_percentile: r.hedge_percentile.filter(|p| {
                let ok = (0.5..1.0).contains(p);
                if !ok {
                    self.problem(format!("{path}.hedge_percentile"), "must be in [0.5, 1.0)");
                }
                ok
            }),
            hedge_floor: r.hedge_floor_ms.map(Duration::from_millis),
            latency_slo: r.latency_slo_ms.map(Duration::from_millis),
            first_token_timeout: Duration::from_millis(r.first_token_timeout_ms.unwrap_or(30_000).max(1)),
            hedge_ceiling: r.hedge_ceiling_ms.map(Duration::from_millis),
            side_effecting: r.side_effecting.unwrap_or(false),
            stall_timeout: Duration::from_millis(r.stall_timeout_ms.unwrap_or(10_000)),
            connect_timeout: Duration::from_millis(r.connect_timeout_ms.unwrap_or(5_000)),
            concurrency: r.concurrency.unwrap_or(256).max(1),
            quality,
            pools,
            tokenizer,
            min_useful: r.min_useful_ms.map(Duration::from_millis),
        })
    }

    /// The route's continuation convention: `prefill = "..."`, else what its wire does when
    /// it has the `prefill` capability (Anthropic: native prefill; OpenAI wire: a plain final
    /// assistant message), else none.
    fn prefill(&mut self, path: &str, wire: Wire, caps: &Capabilities, raw: Option<&str>) -> PrefillConvention {
        match raw {
            Some(s) => match PrefillConvention::parse(s) {
                Some(PrefillConvention::Anthropic) if wire != Wire::Anthropic => {
                    self.problem(format!("{path}.prefill"), "\"anthropic\" needs the anthropic wire");
                    PrefillConvention::None
                }
                Some(c) if c != PrefillConvention::Anthropic && c.can_continue() && wire == Wire::Anthropic => {
                    self.problem(
                        format!("{path}.prefill"),
                        format!("{s:?} is an OpenAI-wire convention; Anthropic routes use \"anthropic\" or \"none\""),
                    );
                    PrefillConvention::None
                }
                Some(c) => c,
                None => {
                    self.problem(
                        format!("{path}.prefill"),
                        format!("{s:?} is not one of none, anthropic, assistant, prefix, vllm"),
                    );
                    PrefillConvention::None
                }
            },
            None if !caps.prefill => PrefillConvention::None,
            None if wire == Wire::Anthropic => PrefillConvention::Anthropic,
            None => PrefillConvention::Assistant,
        }
    }

    fn capabilities(&mut self, path: &str, provider: ProviderKind, list: Option<Vec<String>>) -> Capabilities {
        let Some(list) = list else {
            return match provider {
                ProviderKind::OpenAi => Capabilities {
                    tools: true,
                    vision: true,
                    json_schema: true,
                    prefill: false,
                    streaming: true,
                },
                ProviderKind::Anthropic => Capabilities {
                    tools: true,
                    vision: true,
                    json_schema: false,
                    prefill: true,
                    streaming: true,
                },
                ProviderKind::Simulated => Capabilities {
                    tools: true,
                    vision: true,
                    json_schema: true,
                    prefill: true,
                    streaming: true,
                },
            };
        };
        let mut caps = Capabilities::default();
        for c in list {
            match c.as_str() {
                "tools" => caps.tools = true,
                "vision" => caps.vision = true,
                "json_schema" => caps.json_schema = true,
                "prefill" => caps.prefill = true,
                "streaming" => caps.streaming = true,
                other => self.problem(
                    format!("{path}.capabilities"),
                    format!("unknown capability {other:?} (tools, vision, json_schema, prefill, streaming)"),
                ),
            }
        }
        caps
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
            let list = raw.routes.unwrap_or_default();
            if list.is_empty() {
                self.problem(format!("{path}.routes"), "must list at least one route");
            }
            for (i, r) in list.iter().enumerate() {
                if !routes.iter().any(|route| &route.name == r) {
                    self.problem(format!("{path}.routes[{i}]"), format!("no route named {r:?}"));
                }
                if list[..i].contains(r) {
                    self.problem(format!("{path}.routes[{i}]"), format!("{r:?} is listed twice"));
                }
            }
            let task = self
                .task(&format!("{path}.task"), raw.task)
                .unwrap_or_else(|| "chat".to_string());
            let quality_floor = self.floor(&format!("{path}.quality_floor"), raw.quality_floor);
            out.insert(
                name.clone(),
                ModelConfig {
                    routes: list,
                    hedge: raw.hedge.unwrap_or(true),
                    task,
                    quality_floor,
                },
            );
        }
        out
    }
}

impl Wire {
    fn provider(self) -> ProviderKind {
        match self {
            Wire::OpenAi => ProviderKind::OpenAi,
            Wire::Anthropic => ProviderKind::Anthropic,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
