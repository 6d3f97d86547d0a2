//! `[[routes]]`: each route validated (provider and wire, URL, scenario, key variable, level,
//! capabilities, prefill convention, timeouts), every problem reported with its key path.

use std::collections::BTreeSet;
use std::time::Duration;

use super::raw::RawRoute;
use super::validate::Validator;
use super::{Capabilities, ProviderKind, RouteConfig, SimConfig, Wire};
use crate::sim;
use crate::types::{Level, ModelRules, PrefillConvention, TokenParameter};

impl Validator {
    pub(super) fn routes(&mut self, value: Option<&toml::Value>, sim: &SimConfig) -> Vec<RouteConfig> {
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
        let http2_prior_knowledge = r.http2_prior_knowledge.unwrap_or(false);
        if http2_prior_knowledge && r.base_url.as_deref().is_some_and(|u| u.starts_with("https://")) {
            self.problem(
                format!("{path}.http2_prior_knowledge"),
                "only for a plain http:// base_url; an https:// upstream negotiates HTTP/2 by ALPN",
            );
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
        let mut rules = ModelRules::for_model(wire, &model);
        if let Some(p) = r.token_parameter.as_deref() {
            match TokenParameter::parse(p) {
                Some(p) => rules.token_parameter = p,
                None => self.problem(
                    format!("{path}.token_parameter"),
                    format!("{p:?} is not max_tokens or max_completion_tokens"),
                ),
            }
        }
        if let Some(list) = r.drop_params {
            rules.drops = list.into_iter().map(String::into_boxed_str).collect();
        }
        if let Some(list) = r.refuse_params {
            rules.refuses = list.into_iter().map(String::into_boxed_str).collect();
        }
        Some(RouteConfig {
            name,
            provider,
            wire,
            base_url: r.base_url.map(|u| u.trim_end_matches('/').to_string()),
            http2_prior_knowledge,
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
            rules,
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
}

impl Wire {
    fn provider(self) -> ProviderKind {
        match self {
            Wire::OpenAi => ProviderKind::OpenAi,
            Wire::Anthropic => ProviderKind::Anthropic,
        }
    }
}
