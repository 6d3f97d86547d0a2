//! Validation of the routing keys: per-route quality, pools and tokenizer, quality floors, tenants, ranking weights, leases, the answer cache and
//! the fleet-wide budgets.

use std::collections::BTreeMap;
use std::time::Duration;

use super::raw::{RawCache, RawFloor, RawLeases, RawLimits, RawRanking, RawTenant};
use super::validate::Validator;
use super::{CacheConfig, LeaseConfig, LimitsConfig, Pools, RankingConfig, RouteConfig, TenantConfig, TokenizerChoice};
use crate::types::{Priority, ResponseType};

/// A task name: `*` (every task) or letters, digits, `_` and `-`.
pub(super) fn valid_task(name: &str) -> bool {
    name == "*"
        || (!name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
}

impl Validator {
    /// Quality scores (or floors) per task: each in [0, 1], task names well formed.
    pub(super) fn scores(&mut self, path: &str, table: BTreeMap<String, f64>) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (task, score) in table {
            if !valid_task(&task) {
                self.problem(
                    format!("{path}.{task}"),
                    "task names are letters, digits, _ and - (or \"*\" for every task)",
                );
            } else if !(0.0..=1.0).contains(&score) {
                self.problem(format!("{path}.{task}"), format!("{score} is not in [0, 1]"));
            } else {
                out.insert(task, score);
            }
        }
        out
    }

    pub(super) fn floor(&mut self, path: &str, raw: Option<RawFloor>) -> BTreeMap<String, f64> {
        match raw {
            None => BTreeMap::new(),
            Some(RawFloor::All(f)) => self.scores(path, BTreeMap::from([("*".to_string(), f)])),
            Some(RawFloor::PerTask(t)) => self.scores(path, t),
        }
    }

    pub(super) fn task(&mut self, path: &str, raw: Option<String>) -> Option<String> {
        let task = raw?;
        if task == "*" || !valid_task(&task) {
            self.problem(path, format!("{task:?} is not a task name (letters, digits, _ and -)"));
            return None;
        }
        Some(task)
    }

    pub(super) fn pools(&mut self, path: &str, raw: Option<Vec<String>>) -> Pools {
        let Some(list) = raw else { return Pools::default() };
        let mut pools = Pools {
            interactive: false,
            batch: false,
        };
        for p in &list {
            match p.as_str() {
                "interactive" => pools.interactive = true,
                "batch" => pools.batch = true,
                other => self.problem(
                    format!("{path}.pools"),
                    format!("{other:?} is not interactive or batch"),
                ),
            }
        }
        if list.is_empty() {
            self.problem(
                format!("{path}.pools"),
                "a route in no pool can serve nothing; list interactive and/or batch",
            );
        }
        pools
    }

    pub(super) fn tokenizer(&mut self, path: &str, raw: Option<&str>) -> TokenizerChoice {
        match raw {
            None | Some("auto") => TokenizerChoice::Auto,
            Some("o200k") => TokenizerChoice::O200k,
            Some("cl100k") => TokenizerChoice::Cl100k,
            Some("estimate") => TokenizerChoice::Estimate,
            Some(other) => {
                self.problem(
                    format!("{path}.tokenizer"),
                    format!("{other:?} is not one of auto, o200k, cl100k, estimate"),
                );
                TokenizerChoice::Auto
            }
        }
    }

    pub(super) fn tenants(
        &mut self,
        value: Option<&toml::Value>,
        routes: &[RouteConfig],
    ) -> BTreeMap<String, TenantConfig> {
        let mut out = BTreeMap::new();
        let Some(value) = value else { return out };
        let Some(table) = value.as_table() else {
            self.problem("tenants", "must be a table of [tenants.NAME] entries");
            return out;
        };
        for (name, v) in table {
            let path = format!("tenants.{name}");
            let raw: RawTenant = self.section(&path, Some(v));
            let tenant = self.tenant(&path, name, raw);
            let servable = routes.iter().any(|r| {
                tenant
                    .region
                    .as_ref()
                    .is_none_or(|want| r.region.eq_ignore_ascii_case(want))
                    && tenant.data_terms.iter().all(|t| r.data_terms.contains(t))
            });
            if !servable && !routes.is_empty() {
                self.problem(
                    &path,
                    format!(
                        "no route is in region {} with data terms [{}]: every request of this tenant would be refused",
                        tenant.region.as_deref().unwrap_or("(any)"),
                        tenant.data_terms.join(", ")
                    ),
                );
            }
            out.insert(name.clone(), tenant);
        }
        out
    }

    /// `priority = "interactive" | "batch"` under `path`.
    pub(super) fn priority(&mut self, path: &str, raw: Option<&str>) -> Option<Priority> {
        match raw {
            None => None,
            Some("interactive") => Some(Priority::Interactive),
            Some("batch") => Some(Priority::Batch),
            Some(other) => {
                self.problem(
                    format!("{path}.priority"),
                    format!("{other:?} is not interactive or batch"),
                );
                None
            }
        }
    }

    fn tenant(&mut self, path: &str, name: &str, raw: RawTenant) -> TenantConfig {
        let deadline = match raw.deadline_ms {
            Some(0) => {
                self.problem(format!("{path}.deadline_ms"), "must be positive");
                None
            }
            ms => ms.map(Duration::from_millis),
        };
        let priority = self.priority(path, raw.priority.as_deref());
        let response_type = raw.response_type.as_deref().and_then(|t| {
            let parsed = ResponseType::parse(t);
            if parsed.is_none() {
                self.problem(
                    format!("{path}.response_type"),
                    format!("{t:?} is not prose, structured, tool or voice"),
                );
            }
            parsed
        });
        TenantConfig {
            name: name.to_string(),
            region: raw.region.filter(|r| !r.trim().is_empty()),
            data_terms: raw.data_terms.unwrap_or_default(),
            deadline,
            priority,
            hedge: raw.hedge,
            response_type,
            task: self.task(&format!("{path}.task"), raw.task),
            quality_floor: self.floor(&format!("{path}.quality_floor"), raw.quality_floor),
        }
    }

    fn weight(&mut self, path: &str, value: Option<f64>, default: f64) -> f64 {
        let w = value.unwrap_or(default);
        if !w.is_finite() || w < 0.0 {
            self.problem(path, "must be a non-negative number");
            return default;
        }
        w
    }

    pub(super) fn ranking(&mut self, r: RawRanking) -> RankingConfig {
        let d = RankingConfig::default();
        RankingConfig {
            latency_weight: self.weight("ranking.latency_weight", r.latency_weight, d.latency_weight),
            error_weight: self.weight("ranking.error_weight", r.error_weight, d.error_weight),
            cost_weight: self.weight("ranking.cost_weight", r.cost_weight, d.cost_weight),
        }
    }

    pub(super) fn leases(&mut self, l: RawLeases) -> LeaseConfig {
        let d = LeaseConfig::default();
        if l.ttl_secs == Some(0) {
            self.problem(
                "leases.ttl_secs",
                "must be at least 1 (set enabled = false to turn leases off)",
            );
        }
        if l.max_sessions == Some(0) {
            self.problem(
                "leases.max_sessions",
                "must be at least 1 (set enabled = false to turn leases off)",
            );
        }
        LeaseConfig {
            enabled: l.enabled.unwrap_or(d.enabled),
            ttl: l.ttl_secs.map_or(d.ttl, |s| Duration::from_secs(s.max(1))),
            max_sessions: l.max_sessions.unwrap_or(d.max_sessions).max(1),
        }
    }

    pub(super) fn cache(&mut self, c: RawCache) -> CacheConfig {
        let d = CacheConfig::default();
        for (key, zero) in [
            ("max_entries", c.max_entries == Some(0)),
            ("ttl_secs", c.ttl_secs == Some(0)),
            ("max_answer_bytes", c.max_answer_bytes == Some(0)),
        ] {
            if zero {
                self.problem(
                    format!("cache.{key}"),
                    "must be at least 1 (set enabled = false to turn the cache off)",
                );
            }
        }
        CacheConfig {
            enabled: c.enabled.unwrap_or(d.enabled),
            max_entries: c.max_entries.unwrap_or(d.max_entries).max(1),
            ttl: c.ttl_secs.map_or(d.ttl, |s| Duration::from_secs(s.max(1))),
            max_answer_bytes: c.max_answer_bytes.unwrap_or(d.max_answer_bytes).max(1),
        }
    }

    pub(super) fn limits(&mut self, l: RawLimits) -> LimitsConfig {
        let ratio = l.retry_budget_ratio.unwrap_or(0.2);
        if !(0.0..=1.0).contains(&ratio) {
            self.problem("limits.retry_budget_ratio", "must be in [0, 1]");
        }
        if l.retry_budget_window_secs == Some(0) {
            self.problem("limits.retry_budget_window_secs", "must be at least 1");
        }
        let shadow_share = l.shadow_share.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&shadow_share) {
            self.problem("limits.shadow_share", "must be in [0, 1]");
        }
        LimitsConfig {
            shadow_share: shadow_share.clamp(0.0, 1.0),
            shadow_max_in_flight: l.shadow_max_in_flight.unwrap_or(8),
            max_attempts: l.max_attempts.unwrap_or(4).max(1),
            max_midstream_recoveries: l.max_midstream_recoveries.unwrap_or(2),
            retry_budget_ratio: ratio.clamp(0.0, 1.0),
            retry_budget_floor_per_sec: self.weight(
                "limits.retry_budget_floor_per_sec",
                l.retry_budget_floor_per_sec,
                1.0,
            ),
            retry_budget_window: Duration::from_secs(l.retry_budget_window_secs.unwrap_or(10).max(1)),
            blast_radius: self.weight("limits.blast_radius", l.blast_radius, 0.5),
            blast_radius_floor_per_sec: self.weight(
                "limits.blast_radius_floor_per_sec",
                l.blast_radius_floor_per_sec,
                1.0,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{load_str, ConfigError, Family, Rotation};
    use super::*;

    const ROUTE: &str =
        "[[routes]]\nname = \"a\"\nprovider = \"simulated\"\nregion = \"eu\"\ndata_terms = [\"no_retention\"]\n";

    fn problems(text: &str) -> Vec<(String, String)> {
        match load_str(text) {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid(p)) => p.into_iter().map(|p| (p.path, p.message)).collect(),
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    fn paths(text: &str) -> Vec<String> {
        problems(text).into_iter().map(|(p, _)| p).collect()
    }

    #[test]
    fn routing_keys_mean_what_they_say() {
        let text = format!(
            r#"{ROUTE}quality = {{ chat = 0.9, "*" = 0.5 }}
            pools = ["batch"]
            tokenizer = "cl100k"
            min_useful_ms = 250
            [models.chat]
            routes = ["a"]
            task = "code"
            quality_floor = {{ code = 0.8 }}
            [tenants.acme]
            region = "eu"
            data_terms = ["no_retention"]
            deadline_ms = 8000
            priority = "batch"
            hedge = false
            response_type = "voice"
            task = "chat"
            quality_floor = 0.6
            [ranking]
            latency_weight = 2.0
            error_weight = 3.0
            cost_weight = 0.0
            [leases]
            enabled = false
            ttl_secs = 30
            max_sessions = 5
            [cache]
            enabled = true
            max_entries = 7
            ttl_secs = 9
            max_answer_bytes = 100
            [limits]
            retry_budget_ratio = 0.3
            retry_budget_floor_per_sec = 2.0
            retry_budget_window_secs = 20
            blast_radius = 1.5
            blast_radius_floor_per_sec = 0.5
            "#
        );
        let c = load_str(&text).expect("valid");
        let r = &c.routes[0];
        assert_eq!(r.quality.get("chat"), Some(&0.9));
        assert_eq!(r.quality.get("*"), Some(&0.5));
        assert_eq!(
            r.pools,
            Pools {
                interactive: false,
                batch: true
            }
        );
        assert_eq!(r.tokenizer, TokenizerChoice::Cl100k);
        assert_eq!(r.min_useful, Some(Duration::from_millis(250)));
        let m = &c.models["chat"];
        assert_eq!((m.task.as_str(), m.quality_floor.get("code")), ("code", Some(&0.8)));
        let t = c.tenant("acme").expect("tenant");
        assert_eq!(t.region.as_deref(), Some("eu"));
        assert_eq!(t.data_terms, ["no_retention"]);
        assert_eq!(t.deadline, Some(Duration::from_millis(8000)));
        assert_eq!(t.priority, Some(Priority::Batch));
        assert_eq!(t.hedge, Some(false));
        assert_eq!(t.response_type, Some(ResponseType::Voice));
        assert_eq!(t.task.as_deref(), Some("chat"));
        assert_eq!(
            t.quality_floor.get("*"),
            Some(&0.6),
            "a bare number applies to every task"
        );
        assert_eq!(
            c.ranking,
            RankingConfig {
                latency_weight: 2.0,
                error_weight: 3.0,
                cost_weight: 0.0
            }
        );
        assert_eq!(
            c.leases,
            LeaseConfig {
                enabled: false,
                ttl: Duration::from_secs(30),
                max_sessions: 5
            }
        );
        assert_eq!(
            c.cache,
            CacheConfig {
                enabled: true,
                max_entries: 7,
                ttl: Duration::from_secs(9),
                max_answer_bytes: 100
            }
        );
        let l = &c.limits;
        assert_eq!((l.retry_budget_ratio, l.retry_budget_floor_per_sec), (0.3, 2.0));
        assert_eq!(l.retry_budget_window, Duration::from_secs(20));
        assert_eq!((l.blast_radius, l.blast_radius_floor_per_sec), (1.5, 0.5));
    }

    #[test]
    fn routing_keys_default_when_absent() {
        let c = load_str(&format!("{ROUTE}[models.chat]\nroutes = [\"a\"]\n")).expect("valid");
        let r = &c.routes[0];
        assert!(r.quality.is_empty() && r.min_useful.is_none());
        assert_eq!((r.pools, r.tokenizer), (Pools::default(), TokenizerChoice::Auto));
        assert_eq!(c.models["chat"].task, "chat");
        assert!(c.models["chat"].quality_floor.is_empty() && c.tenants.is_empty());
        assert_eq!(c.ranking, RankingConfig::default());
        assert_eq!(c.leases, LeaseConfig::default());
        assert_eq!(c.cache, CacheConfig::default());
        assert!(!c.cache.enabled, "the answer cache is opt-in");
        let l = &c.limits;
        assert_eq!(
            (l.retry_budget_ratio, l.retry_budget_floor_per_sec, l.blast_radius),
            (0.2, 1.0, 0.5)
        );
    }

    #[test]
    fn every_bad_routing_value_is_reported_with_its_path() {
        let text = format!(
            r#"{ROUTE}quality = {{ chat = 1.5, "bad task" = 0.5 }}
            pools = []
            tokenizer = "llama"
            [[routes]]
            name = "b"
            provider = "simulated"
            pools = ["vip"]
            [models.chat]
            routes = ["a", "b"]
            task = "*"
            quality_floor = 2.0
            [tenants.acme]
            region = "apac"
            deadline_ms = 0
            priority = "urgent"
            response_type = "song"
            colour = "red"
            [ranking]
            error_weight = -1.0
            [leases]
            ttl_secs = 0
            [cache]
            max_entries = 0
            [limits]
            retry_budget_ratio = 1.5
            "#
        );
        let got = paths(&text);
        for expected in [
            "routes[0].quality.chat",
            "routes[0].quality.bad task",
            "routes[0].pools",
            "routes[0].tokenizer",
            "routes[1].pools",
            "models.chat.task",
            "models.chat.quality_floor.*",
            "tenants.acme",
            "tenants.acme.deadline_ms",
            "tenants.acme.priority",
            "tenants.acme.response_type",
            "tenants.acme.colour",
            "ranking.error_weight",
            "leases.ttl_secs",
            "cache.max_entries",
            "limits.retry_budget_ratio",
        ] {
            assert!(
                got.iter().any(|p| p == expected),
                "expected a problem at {expected}; got {got:?}"
            );
        }
    }

    #[test]
    fn tenant_no_route_can_serve_is_an_error() {
        let text =
            format!("{ROUTE}[models.chat]\nroutes = [\"a\"]\n[tenants.t]\nregion = \"eu\"\ndata_terms = [\"zdr\"]\n");
        let got = problems(&text);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, "tenants.t");
        assert!(
            got[0].1.contains("no route is in region eu with data terms [zdr]"),
            "{}",
            got[0].1
        );
    }

    const TWO_MODELS: &str = "[[routes]]\nname = \"oa\"\nprovider = \"simulated\"\nmodel = \"gpt-4o\"\n\
        [[routes]]\nname = \"az\"\nprovider = \"simulated\"\nmodel = \"gpt-4o\"\n\
        [[routes]]\nname = \"an\"\nprovider = \"simulated\"\nmodel = \"claude\"\n";

    fn family(name: &str, routes: &[&str]) -> Family {
        Family {
            name: name.into(),
            routes: routes.iter().map(|r| r.to_string()).collect(),
        }
    }

    #[test]
    fn families_list_their_routes_in_order_and_rotate_providers_first_by_default() {
        let c = load_str(&format!(
            "{TWO_MODELS}[models.chat]\nfamilies = [{{ name = \"gpt-4o\", routes = [\"oa\", \"az\"] }}, {{ name = \"claude\", routes = [\"an\"] }}]\n"
        ))
        .expect("valid");
        let m = &c.models["chat"];
        assert_eq!(m.routes, ["oa", "az", "an"], "the model's routes, family by family");
        assert_eq!(m.families, [family("gpt-4o", &["oa", "az"]), family("claude", &["an"])]);
        assert_eq!(m.rotation, Rotation::ProviderOnlyBeforeModelChange);
    }

    #[test]
    fn the_flat_form_infers_one_family_per_upstream_model_and_keeps_the_ladder() {
        let c = load_str(&format!(
            "{TWO_MODELS}[models.chat]\nroutes = [\"oa\", \"an\", \"az\"]\n"
        ))
        .expect("valid");
        let m = &c.models["chat"];
        assert_eq!(m.routes, ["oa", "an", "az"], "config order kept");
        assert_eq!(m.families, [family("gpt-4o", &["oa", "az"]), family("claude", &["an"])]);
        assert_eq!(m.rotation, Rotation::Ladder, "a flat list keeps its ladder order");
        let c = load_str(&format!(
            "{TWO_MODELS}[models.chat]\nroutes = [\"oa\", \"an\"]\nrotation = \"provider-only-before-model-change\"\n"
        ))
        .expect("valid");
        assert_eq!(c.models["chat"].rotation, Rotation::ProviderOnlyBeforeModelChange);
    }

    #[test]
    fn every_bad_family_value_is_reported_with_its_path() {
        let got = paths(&format!(
            "{TWO_MODELS}[models.chat]\nfamilies = [{{ routes = [\"oa\", \"ghost\"] }}, {{ name = \"x\", routes = [\"oa\"] }}, {{ name = \"x\", routes = [] }}, {{ name = \"y\", routes = [\"an\"], weight = 1 }}]\nrotation = \"random\"\n\
             [models.both]\nroutes = [\"oa\"]\nfamilies = [{{ name = \"z\", routes = [\"az\"] }}]\n\
             [models.none]\nfamilies = []\n"
        ));
        for expected in [
            "models.chat.families[0].name",
            "models.chat.families[0].routes[1]",
            "models.chat.families[1].routes[0]",
            "models.chat.families[2].name",
            "models.chat.families[2].routes",
            "models.chat.rotation",
            "models.both.families",
            "models.none.families",
        ] {
            assert!(got.iter().any(|p| p == expected), "expected {expected}; got {got:?}");
        }
        assert!(
            got.iter()
                .any(|p| p.starts_with("models.chat.families") && p.ends_with("3.weight")),
            "an unknown key in a family is reported: {got:?}"
        );
    }

    #[test]
    fn unknown_keys_in_new_sections_are_errors() {
        let text = format!(
            "{ROUTE}qualty = {{}}\n[models.chat]\nroutes = [\"a\"]\nfloor = 1\n[ranking]\nspeed = 1\n[leases]\nttl = 1\n[cache]\nsize = 1\n"
        );
        let got = paths(&text);
        for expected in [
            "routes[0].qualty",
            "models.chat.floor",
            "ranking.speed",
            "leases.ttl",
            "cache.size",
        ] {
            assert!(got.iter().any(|p| p == expected), "expected {expected}; got {got:?}");
        }
    }
}
