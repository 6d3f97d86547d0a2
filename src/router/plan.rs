//! The plan for one request: eligible routes in preference order with the reason for each
//! position, every exclusion with its reasons, and what happened to the session's lease.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::eligibility::{self, Eligibility, ExclusionCode};
use super::lease::{LeaseCandidate, LeaseTable};
use super::ranking::{self, RouteStatus, ScoreBreakdown};
use super::requirements::Requirements;
use crate::config::Config;
use crate::gateway::RequestCtx;
use crate::health::Health;
use crate::types::{ChatRequest, LeaseInfo, Level};

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub model: String,
    /// The task type the quality floor was checked for.
    pub task: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality_floor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// In preference order: available routes by rung, lease and score; then routes that are
    /// cooling or behind an open breaker (tried only if they recover in time).
    pub candidates: Vec<Candidate>,
    /// Why each candidate sits where it does, in the same order as `candidates`.
    pub ranking: Vec<CandidateScore>,
    pub excluded: Vec<Exclusion>,
    /// The session's lease as planning found it: `kept` (its route leads its rung) or
    /// `revoked` with a reason. `None` without a session or lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseInfo>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub route: String,
    pub level: Level,
}

/// One candidate's position explained, and the least deadline worth starting it with.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateScore {
    pub route: String,
    /// Do not start an attempt here with less deadline left than this: the route's
    /// `min_useful_ms`, else its live p50 TTFT; `None` when neither is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_useful_ms: Option<u64>,
    pub score: ScoreBreakdown,
}

impl Plan {
    /// The least remaining deadline worth starting an attempt on `route` with.
    pub fn min_useful(&self, route: &str) -> Option<Duration> {
        self.score(route)
            .and_then(|s| s.min_useful_ms)
            .map(Duration::from_millis)
    }

    pub fn score(&self, route: &str) -> Option<&CandidateScore> {
        self.ranking.iter().find(|s| s.route == route)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Exclusion {
    pub route: String,
    /// Every reason, joined for people.
    pub reason: String,
    /// Every reason's code, for metrics and tests.
    pub codes: Vec<ExclusionCode>,
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

/// A session's lease to resolve while planning.
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

/// Plans `req` under `needs`, resolving the session's lease when one is given: filter (never a
/// forbidden route, whatever health says), then rank.
pub fn plan_with(
    config: &Config,
    health: &Health,
    req: &ChatRequest,
    needs: &Requirements,
    lease: Option<LeaseLookup<'_>>,
    now: Instant,
) -> Result<Plan, RouteError> {
    let names = config
        .models
        .get(&req.model)
        .map(|m| m.routes.as_slice())
        .unwrap_or_default();
    let check = Eligibility::new(config, req, needs);
    let mut excluded = Vec::new();
    let mut eligible = Vec::new();
    for name in names {
        let Some(route) = config.route(name) else { continue };
        let reasons = check.check(route);
        if reasons.is_empty() {
            eligible.push((route, health.view(name, now)));
        } else {
            excluded.push(Exclusion {
                route: name.clone(),
                reason: eligibility::describe(&reasons),
                codes: reasons.iter().map(|r| r.code).collect(),
            });
        }
    }
    let (preferred, lease_info) = match lease {
        Some(LeaseLookup { table, session }) => {
            let seen: Vec<LeaseCandidate<'_>> = eligible
                .iter()
                .map(|(r, v)| LeaseCandidate {
                    route: &r.name,
                    level: r.level,
                    status: RouteStatus::of(v),
                })
                .collect();
            table.resolve(session, &seen, now)
        }
        None => (None, None),
    };
    if eligible.is_empty() {
        return Err(RouteError::NoneEligible(excluded));
    }
    let ranked = ranking::rank(eligible, preferred.as_deref(), &config.ranking);
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
            score: r.score,
        })
        .collect();
    Ok(Plan {
        model: req.model.clone(),
        task: check.task.clone(),
        quality_floor: check.floor,
        tenant: needs.tenant.clone(),
        candidates,
        ranking,
        excluded,
        lease: lease_info,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::LeaseConfig;
    use crate::gateway::{Dialect, Priority};
    use crate::provider::{ErrorClass, ProviderError};
    use crate::router::testkit::{config, request};

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
        permit.failure(now, &err);
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
}
