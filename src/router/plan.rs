//! The planner: one pure function from a [`Snapshot`] (config, route health, the session's
//! lease, `now`) and a request to a [`Plan`]: eligible routes in preference order with the
//! reason for each position, every exclusion with its reasons, and what should happen to the
//! session's lease. It reads nothing else, locks nothing and changes nothing; `plan` and
//! `plan_with` take the snapshot themselves, for tests and tools.

use tokio::time::Instant;

use super::eligibility::{self, count_prompt, Eligibility};
use super::requirements::Requirements;
use super::tokens::PromptTokens;
use super::{families, ranking};
use crate::config::{Config, RouteConfig};
use crate::health::lease::{self, LeaseCandidate, LeaseEntry, LeaseTable};
use crate::health::{Health, RouteViews};
use crate::types::{Candidate, CandidateScore, ChatRequest, Exclusion, Plan, RequestCtx};

/// Everything planning reads of the world, taken before it starts so that no lock is held
/// while it runs.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot<'a> {
    pub config: &'a Config,
    /// The views of the model's routes (`Health::views`).
    pub health: &'a RouteViews,
    /// The session's lease as the table held it (`LeaseTable::get`); `None` without a
    /// session, a lease, or with leases off.
    pub lease: Option<&'a LeaseEntry>,
    pub now: Instant,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum RouteError {
    #[error("no route is eligible for this request: {}", .0.iter().map(|e| format!("{} ({})", e.route, e.reason)).collect::<Vec<_>>().join("; "))]
    NoneEligible(Vec<Exclusion>),
}

impl RouteError {
    pub fn exclusions(&self) -> &[Exclusion] {
        match self {
            RouteError::NoneEligible(e) => e,
        }
    }
}

/// A session's lease to resolve while planning ([`plan_with`] only).
pub struct LeaseLookup<'a> {
    pub table: &'a mut LeaseTable,
    pub session: &'a str,
}

/// Plans `req` with what its context carries (region header, priority); no tenant, task or
/// lease. The caller checked that the model exists.
pub fn plan(
    config: &Config,
    health: &Health,
    req: &ChatRequest,
    ctx: &RequestCtx,
    now: Instant,
) -> Result<Plan, RouteError> {
    plan_with(config, health, req, &Requirements::from_ctx(ctx), None, now)
}

/// Takes the snapshot, plans `req` under `needs` with [`plan_over`], and applies the lease
/// update to the given table at once: the request path's steps in one call, for tests and
/// tools. The gateway does them apart, so that it holds no lock while planning.
pub fn plan_with(
    config: &Config,
    health: &Health,
    req: &ChatRequest,
    needs: &Requirements,
    lease: Option<LeaseLookup<'_>>,
    now: Instant,
) -> Result<Plan, RouteError> {
    let prompt = count_prompt(config, req);
    let views = health.views(model_routes(config, req).iter().map(String::as_str), now);
    let entry = lease.as_ref().and_then(|l| l.table.get(l.session));
    let snapshot = Snapshot {
        config,
        health: &views,
        lease: entry.as_ref(),
        now,
    };
    let planned = plan_over(&snapshot, req, needs, &prompt);
    if let (Some(LeaseLookup { table, session }), Ok(plan)) = (lease, &planned) {
        table.apply(session, &plan.lease_update);
    }
    planned
}

/// The routes behind `req`'s model, in config order (empty for an unknown model).
pub fn model_routes<'a>(config: &'a Config, req: &ChatRequest) -> &'a [String] {
    config
        .models
        .get(&req.model)
        .map(|m| m.routes.as_slice())
        .unwrap_or_default()
}

/// Plans `req` under `needs` over `snapshot`, with its prompt measured beforehand
/// ([`count_prompt`]): filter (never a forbidden route, whatever health says), decide the
/// lease, rank. Pure: the same arguments give the same plan, and nothing is written; the
/// lease decision comes back as `Plan::lease_update` for the table's owner to apply.
pub fn plan_over(
    snapshot: &Snapshot<'_>,
    req: &ChatRequest,
    needs: &Requirements,
    prompt: &PromptTokens,
) -> Result<Plan, RouteError> {
    let config = snapshot.config;
    let check = Eligibility::with_prompt(config, req, needs, *prompt);
    let mut excluded = Vec::new();
    let mut eligible = Vec::new();
    let names = model_routes(config, req);
    let routes = RouteLookup::new(config, names.len());
    for (i, name) in names.iter().enumerate() {
        let Some(route) = routes.get(name) else { continue };
        let reasons = check.check(route);
        if reasons.is_empty() {
            eligible.push((route, snapshot.health.get_at(i, name)));
        } else {
            excluded.push(Exclusion {
                route: name.clone(),
                reason: eligibility::describe(&reasons),
                codes: reasons.iter().map(|r| r.code).collect(),
            });
        }
    }
    let seen: Vec<LeaseCandidate<'_>> = eligible
        .iter()
        .map(|(r, v)| LeaseCandidate {
            route: &r.name,
            level: r.level,
            status: v.status(),
        })
        .collect();
    let lease_update = lease::decide(snapshot.lease, &seen, snapshot.now);
    if eligible.is_empty() {
        return Err(RouteError::NoneEligible(excluded));
    }
    let mut ranked = ranking::rank(eligible, lease_update.preferred(), &config.ranking);
    families::order(config, &req.model, &mut ranked, |r| {
        (r.route.name.as_str(), r.score.status)
    });
    let candidates = ranked
        .iter()
        .map(|r| Candidate {
            route: r.route.name.clone(),
            level: r.route.level,
        })
        .collect();
    let ranking = ranked
        .into_iter()
        .map(|r| CandidateScore {
            route: r.route.name.clone(),
            min_useful_ms: r.route.min_useful.or(r.view.ttft_p50).map(|d| d.as_millis() as u64),
            family: config.family_of(&req.model, &r.route.name).map(str::to_string),
            score: r.score,
        })
        .collect();
    Ok(Plan {
        model: req.model.clone(),
        rotation: config
            .models
            .get(&req.model)
            .map(|m| m.rotation)
            .unwrap_or_default()
            .as_str(),
        task: check.task.clone(),
        quality_floor: check.floor,
        tenant: needs.tenant.clone(),
        candidates,
        ranking,
        excluded,
        lease: lease_update.info(),
        lease_update,
    })
}

/// Routes by name for one plan. `Config::route` scans every route, so a model of hundreds of
/// routes made planning quadratic (1.5 ms at 500 routes); past a few routes one map is built
/// per plan instead, and small models keep the scan (cheaper than a map).
enum RouteLookup<'a> {
    Scan(&'a Config),
    Map(std::collections::HashMap<&'a str, &'a RouteConfig>),
}

/// Model sizes up to this are looked up by scanning.
const SCAN_UP_TO: usize = 8;

impl<'a> RouteLookup<'a> {
    fn new(config: &'a Config, wanted: usize) -> Self {
        if wanted <= SCAN_UP_TO {
            RouteLookup::Scan(config)
        } else {
            RouteLookup::Map(config.routes.iter().map(|r| (r.name.as_str(), r)).collect())
        }
    }

    fn get(&self, name: &str) -> Option<&'a RouteConfig> {
        match self {
            RouteLookup::Scan(config) => config.route(name),
            RouteLookup::Map(map) => map.get(name).copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::config::LeaseConfig;
    use crate::provider::ProviderError;
    use crate::router::testkit::{config, request};
    use crate::types::{Dialect, ErrorClass, ExclusionCode, LeaseUpdate, Priority, RevokeReason, RouteStatus};

    #[test]
    fn the_map_lookup_finds_what_the_scan_finds() {
        let cfg = config("");
        let scan = RouteLookup::new(&cfg, 1);
        let map = RouteLookup::new(&cfg, SCAN_UP_TO + 1);
        assert!(matches!(map, RouteLookup::Map(_)), "large models use the map");
        for r in &cfg.routes {
            let (a, b) = (scan.get(&r.name), map.get(&r.name));
            assert_eq!(a.map(|r| &r.name), Some(&r.name));
            assert_eq!(b.map(|r| &r.name), Some(&r.name));
        }
        assert!(scan.get("nowhere").is_none() && map.get("nowhere").is_none());
    }

    fn routes(plan: &Plan) -> Vec<&str> {
        plan.candidates.iter().map(|c| c.route.as_str()).collect()
    }

    fn eu_only() -> Requirements {
        let cfg = config("");
        Requirements::default().with_tenant(cfg.tenant("acme").expect("tenant acme"))
    }

    #[test]
    fn eu_only_request_never_gets_a_non_eu_route_even_when_every_eu_route_is_down() {
        let cfg = config("");
        let now = Instant::now();
        let health = Arc::new(Health::new(&cfg, now));
        for r in ["eu-a", "eu-fast", "eu-b"] {
            health.force_open(r, now);
        }
        let plan = plan_with(&cfg, &health, &request("hi"), &eu_only(), None, now).expect("EU routes are eligible");
        assert_eq!(
            routes(&plan),
            ["eu-fast", "eu-a"],
            "only EU routes with no_retention, resting, by score"
        );
        assert!(
            plan.ranking.iter().all(|c| c.score.status == RouteStatus::BreakerOpen),
            "{:?}",
            plan.ranking
        );
        let us = plan
            .excluded
            .iter()
            .find(|e| e.route == "us-c")
            .expect("us-c is excluded");
        assert!(us.codes.contains(&ExclusionCode::Region), "{us:?}");
        assert!(
            us.codes.contains(&ExclusionCode::DataTerms),
            "every reason is listed: {us:?}"
        );
    }

    #[test]
    fn nothing_eligible_is_an_error_naming_every_reason() {
        let cfg = config("");
        let now = Instant::now();
        let health = Health::new(&cfg, now);
        let mut ctx = RequestCtx::new(Dialect::Native);
        ctx.region = Some("apac".into());
        let Err(err) = plan(&cfg, &health, &request("hi"), &ctx, now) else {
            panic!("no route is in apac")
        };
        assert_eq!(err.exclusions().len(), 5, "every route of the model is named: {err}");
        let text = err.to_string();
        for route in ["eu-a", "eu-fast", "eu-b", "us-c", "eu-batch"] {
            assert!(text.contains(route), "{route} missing from: {text}");
        }
        assert!(text.contains("is not apac"), "the reason is spelled out: {text}");
    }

    #[test]
    fn plan_orders_by_rung_then_score_and_explains_each_position() {
        let cfg = config("");
        let now = Instant::now();
        let health = Health::new(&cfg, now);
        for _ in 0..10 {
            health.record_ttft("eu-a", now, Duration::from_millis(800));
            health.record_ttft("eu-fast", now, Duration::from_millis(200));
        }
        let plan = plan(&cfg, &health, &request("hi"), &RequestCtx::new(Dialect::Native), now).expect("plan");
        assert_eq!(
            routes(&plan),
            ["eu-fast", "eu-a", "eu-b", "us-c"],
            "L0 by p95, then L1, then L2"
        );
        assert_eq!(plan.ranking[0].score.ttft_p95_ms.map(|v| v.round()), Some(200.0));
        assert_eq!(
            plan.min_useful("eu-fast"),
            Some(Duration::from_millis(200)),
            "min useful time defaults to the live p50"
        );
        assert_eq!(
            plan.min_useful("eu-b"),
            Some(Duration::from_millis(1500)),
            "a configured min_useful_ms wins"
        );
        assert_eq!(plan.min_useful("us-c"), None, "unknown without samples or config");
        assert_eq!(
            plan.excluded.len(),
            1,
            "eu-batch serves only batch: {:?}",
            plan.excluded
        );
        assert_eq!(plan.excluded[0].codes, vec![ExclusionCode::Pool]);
        let json = serde_json::to_value(&plan).expect("the plan is part of the decision record");
        assert_eq!(json["ranking"][0]["score"]["status"], "available");
    }

    #[test]
    fn cooling_route_goes_last() {
        let cfg = config("");
        let now = Instant::now();
        let health = Arc::new(Health::new(&cfg, now));
        let permit = health
            .acquire("eu-a", now, Priority::Interactive)
            .expect("fresh route admits");
        let mut err = ProviderError::new(ErrorClass::RateLimited, "slow down");
        err.retry_after = Some(Duration::from_secs(2));
        permit.failure(now, err.class, err.retry_after, err.transport);
        let plan = plan(&cfg, &health, &request("hi"), &RequestCtx::new(Dialect::Native), now).expect("plan");
        assert_eq!(routes(&plan).last(), Some(&"eu-a"), "cooling after a 429: tried last");
        assert_eq!(plan.ranking.last().map(|c| c.score.status), Some(RouteStatus::Cooling));
        let later = now + Duration::from_secs(3);
        let plan = plan_with(&cfg, &health, &request("hi"), &Requirements::default(), None, later).expect("plan");
        assert_eq!(
            plan.score("eu-a").map(|s| s.score.status),
            Some(RouteStatus::Available),
            "cool-down over"
        );
        assert_eq!(
            routes(&plan)[..2],
            ["eu-fast", "eu-a"],
            "back among the L0 routes, ranked by score"
        );
    }

    #[test]
    fn lease_keeps_the_session_on_its_route_until_the_breaker_opens() {
        let cfg = config("");
        let now = Instant::now();
        let health = Health::new(&cfg, now);
        let mut table = LeaseTable::new(&LeaseConfig::default());
        table.record("s1", "eu-fast", now);
        let lookup = |t: &mut LeaseTable, at| {
            plan_with(
                &cfg,
                &health,
                &request("hi"),
                &Requirements::default(),
                Some(LeaseLookup {
                    table: t,
                    session: "s1",
                }),
                at,
            )
            .expect("plan")
        };
        let kept = lookup(&mut table, now);
        assert_eq!(routes(&kept)[0], "eu-fast", "the leased route leads its rung");
        assert_eq!(kept.lease.as_ref().map(|l| l.state.as_str()), Some("kept"));
        health.force_open("eu-fast", now);
        let revoked = lookup(&mut table, now);
        assert_eq!(routes(&revoked)[0], "eu-a", "the session moves");
        let lease = revoked.lease.expect("lease reported");
        assert_eq!(
            (lease.state.as_str(), lease.reason.as_deref()),
            ("revoked", Some("breaker_open"))
        );
    }

    #[test]
    fn quality_floor_of_the_model_applies_to_the_requests_task() {
        let cfg = config("quality_floor = { chat = 0.7, code = 0.85 }");
        let now = Instant::now();
        let health = Health::new(&cfg, now);
        let plan = plan(&cfg, &health, &request("hi"), &RequestCtx::new(Dialect::Native), now).expect("plan");
        assert_eq!(plan.task, "chat", "the model's default task");
        assert!(
            !routes(&plan).contains(&"us-c"),
            "us-c scores 0.6 for chat: below the floor"
        );
        let needs = Requirements::default().with_task(Some("code"));
        let Err(err) = plan_with(&cfg, &health, &request("hi"), &needs, None, now) else {
            panic!("no route reaches 0.85 for code")
        };
        assert!(
            err.exclusions()
                .iter()
                .all(|e| e.codes.contains(&ExclusionCode::QualityFloor)),
            "{err}"
        );
    }

    /// The views of every route of model `chat` at `now`.
    fn views(cfg: &Config, health: &Health, now: Instant) -> RouteViews {
        health.views(model_routes(cfg, &request("")).iter().map(String::as_str), now)
    }

    #[test]
    fn same_snapshot_and_request_give_the_same_plan_whatever_health_does_meanwhile() {
        let cfg = config("");
        let now = Instant::now();
        let health = Health::new(&cfg, now);
        for _ in 0..10 {
            health.record_ttft("eu-a", now, Duration::from_millis(300));
            health.record_ttft("eu-fast", now, Duration::from_millis(900));
        }
        let mut table = LeaseTable::new(&LeaseConfig::default());
        table.record("s1", "eu-fast", now);
        let entry = table.get("s1");
        let snapshot_views = views(&cfg, &health, now);
        let snapshot = Snapshot {
            config: &cfg,
            health: &snapshot_views,
            lease: entry.as_ref(),
            now,
        };
        let req = request("hi");
        let prompt = count_prompt(&cfg, &req);
        let needs = Requirements::default();
        let first = plan_over(&snapshot, &req, &needs, &prompt).expect("plan");
        health.force_open("eu-fast", now);
        health.record_ttft("eu-b", now, Duration::from_millis(50));
        let second = plan_over(&snapshot, &req, &needs, &prompt).expect("plan");
        assert_eq!(first, second, "the plan is a function of the snapshot and the request");
        assert_eq!(routes(&first)[0], "eu-fast", "the lease leads its rung in the snapshot");
        assert_eq!(
            first.lease_update,
            LeaseUpdate::Keep {
                route: "eu-fast".into()
            }
        );
        let live = Snapshot {
            health: &views(&cfg, &health, now),
            ..snapshot
        };
        let moved = plan_over(&live, &req, &needs, &prompt).expect("plan");
        assert_eq!(routes(&moved)[0], "eu-a", "a fresh snapshot sees the open breaker");
    }

    #[test]
    fn planning_leaves_the_lease_table_and_health_unchanged_until_the_update_is_applied() {
        let cfg = config("");
        let now = Instant::now();
        let health = Health::new(&cfg, now);
        let mut table = LeaseTable::new(&LeaseConfig::default());
        table.record("s1", "eu-fast", now);
        health.force_open("eu-fast", now);
        let entry = table.get("s1").expect("leased");
        let before = views(&cfg, &health, now);
        let snapshot = Snapshot {
            config: &cfg,
            health: &before,
            lease: Some(&entry),
            now,
        };
        let req = request("hi");
        let plan = plan_over(&snapshot, &req, &Requirements::default(), &count_prompt(&cfg, &req)).expect("plan");
        let LeaseUpdate::Revoke { route, reason, .. } = &plan.lease_update else {
            panic!("an open breaker revokes the lease: {:?}", plan.lease_update)
        };
        assert_eq!((route.as_str(), *reason), ("eu-fast", RevokeReason::BreakerOpen));
        assert_eq!(
            plan.lease,
            plan.lease_update.info(),
            "the envelope's lease is the same decision"
        );
        assert_eq!(table.get("s1"), Some(entry), "planning wrote nothing to the table");
        assert_eq!(views(&cfg, &health, now), before, "nor to health");
        table.apply("s1", &plan.lease_update);
        assert!(
            table.get("s1").is_none(),
            "the table changes when the update is applied"
        );
    }

    #[test]
    fn the_prompt_is_counted_before_planning_and_read_as_given() {
        let cfg = config("");
        let now = Instant::now();
        let health = Health::new(&cfg, now);
        let views = views(&cfg, &health, now);
        let snapshot = Snapshot {
            config: &cfg,
            health: &views,
            lease: None,
            now,
        };
        // ~9,000 estimated tokens: too many for eu-a's 8,000 window.
        let long = count_prompt(&cfg, &request(&"word ".repeat(6_500)));
        let plan = plan_over(&snapshot, &request("hi"), &Requirements::default(), &long).expect("plan");
        let a = plan
            .excluded
            .iter()
            .find(|e| e.route == "eu-a")
            .expect("eu-a is excluded");
        assert_eq!(
            a.codes,
            [ExclusionCode::ContextLength],
            "the planner sizes the prompt by the count it is given, not by tokenizing"
        );
    }
}
