//! Preference among eligible routes, explained. Routes behind an open breaker or cooling
//! after a rate limit go last (tried only if they recover in time); the rest follow the
//! degradation ladder (L0 before L1 ...); within a rung the leased route comes first, then the
//! lowest score. The score is a penalty in seconds-equivalent of p95 TTFT:
//!
//! `total = latency_weight * p95_s + error_weight * error_rate + cost_weight * cost_per_1k`
//!
//! A route with too few samples for a p95 is scored at the mean p95 of the plan's routes that
//! have one (neutral: neither punished nor favoured for being new), and its error rate counts
//! only from `MIN_ERROR_VOLUME` attempts in the window on (one failure in one attempt is not a
//! 100% error rate worth reordering for; the breaker handles bursts). Ties keep config order.

use crate::config::{RankingConfig, RouteConfig};
use crate::health::RouteView;
use crate::types::{RouteStatus, ScoreBreakdown};

/// Attempts in the window before a route's error rate enters its score.
pub const MIN_ERROR_VOLUME: u64 = 10;

/// An eligible route with its health, in the order ranking decided.
#[derive(Debug, Clone)]
pub struct Ranked<'a> {
    pub route: &'a RouteConfig,
    pub view: RouteView,
    pub score: ScoreBreakdown,
}

/// Orders `eligible` (in config order) for one request; `leased` names the session's route.
pub fn rank<'a>(
    eligible: Vec<(&'a RouteConfig, RouteView)>,
    leased: Option<&str>,
    w: &RankingConfig,
) -> Vec<Ranked<'a>> {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    let known: Vec<f64> = eligible.iter().filter_map(|(_, v)| v.ttft_p95.map(ms)).collect();
    let neutral_ms = if known.is_empty() {
        0.0
    } else {
        known.iter().sum::<f64>() / known.len() as f64
    };
    let mut ranked: Vec<Ranked<'a>> = eligible
        .into_iter()
        .map(|(route, view)| {
            let status = view.status();
            let p95 = view.ttft_p95.map(ms);
            let used = p95.unwrap_or(neutral_ms);
            let latency = w.latency_weight * used / 1000.0;
            let counted = if view.error_volume >= MIN_ERROR_VOLUME {
                view.error_rate
            } else {
                0.0
            };
            let errors = w.error_weight * counted;
            let cost = w.cost_weight * route.cost_per_1k;
            let score = ScoreBreakdown {
                status,
                level: route.level,
                leased: leased == Some(route.name.as_str()) && status == RouteStatus::Available,
                ttft_p95_ms: p95,
                ttft_used_ms: used,
                latency,
                error_rate: view.error_rate,
                error_volume: view.error_volume,
                errors,
                cost_per_1k: route.cost_per_1k,
                cost,
                total: latency + errors + cost,
                recovers_in_ms: (status != RouteStatus::Available)
                    .then(|| view.unavailable_for.map(|d| d.as_millis() as u64))
                    .flatten(),
            };
            Ranked { route, view, score }
        })
        .collect();
    // Stable: config order breaks ties.
    ranked.sort_by(|a, b| {
        let (a, b) = (&a.score, &b.score);
        (a.status != RouteStatus::Available)
            .cmp(&(b.status != RouteStatus::Available))
            .then(a.level.cmp(&b.level))
            .then(b.leased.cmp(&a.leased))
            .then(a.total.total_cmp(&b.total))
    });
    ranked
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::router::testkit::config;

    fn view(p95_ms: Option<u64>, error_rate: f64) -> RouteView {
        RouteView {
            ttft_p95: p95_ms.map(Duration::from_millis),
            error_rate,
            error_volume: 100,
            ..RouteView::default()
        }
    }

    fn names(r: &[Ranked<'_>]) -> Vec<String> {
        r.iter().map(|r| r.route.name.clone()).collect()
    }

    #[test]
    fn lower_rung_first_then_lowest_score_within_a_rung() {
        let cfg = config("");
        let route = |n: &str| cfg.route(n).expect("route in the test config");
        // eu-a (L0) is slow, eu-fast (L0) is fast, eu-b (L1) is fastest: the ladder wins.
        let ranked = rank(
            vec![
                (route("eu-b"), view(Some(100), 0.0)),
                (route("eu-a"), view(Some(900), 0.0)),
                (route("eu-fast"), view(Some(300), 0.0)),
            ],
            None,
            &cfg.ranking,
        );
        assert_eq!(names(&ranked), ["eu-fast", "eu-a", "eu-b"], "L0 by score, then L1");
        let fast = &ranked[0].score;
        assert_eq!(fast.ttft_p95_ms, Some(300.0));
        assert!(
            (fast.latency - 0.3).abs() < 1e-9,
            "latency term is weight x p95 seconds: {fast:?}"
        );
        assert!(
            (fast.total - (fast.latency + fast.errors + fast.cost)).abs() < 1e-9,
            "total is the sum of its terms"
        );
    }

    #[test]
    fn error_rate_and_cost_add_to_the_score() {
        let cfg = config("");
        let route = |n: &str| cfg.route(n).expect("route");
        let ranked = rank(
            vec![
                (route("eu-a"), view(Some(300), 0.5)),
                (route("eu-fast"), view(Some(300), 0.0)),
            ],
            None,
            &cfg.ranking,
        );
        assert_eq!(
            names(&ranked),
            ["eu-fast", "eu-a"],
            "a route failing half its attempts ranks lower"
        );
        let a = &ranked[1].score;
        assert!(
            (a.errors - 2.0 * 0.5).abs() < 1e-9,
            "error term = error_weight x rate: {a:?}"
        );
        assert!(
            (a.cost - 10.0 * 0.002).abs() < 1e-9,
            "cost term = cost_weight x cost_per_1k: {a:?}"
        );
    }

    #[test]
    fn error_rate_counts_only_from_the_minimum_volume() {
        let cfg = config("");
        let route = |n: &str| cfg.route(n).expect("route");
        let one_failure = RouteView {
            error_volume: 1,
            ..view(None, 1.0)
        };
        let ranked = rank(
            vec![(route("eu-fast"), one_failure), (route("eu-a"), view(None, 0.0))],
            None,
            &cfg.ranking,
        );
        assert_eq!(
            names(&ranked),
            ["eu-fast", "eu-a"],
            "one failure in one attempt does not reorder"
        );
        assert_eq!(
            (ranked[0].score.error_rate, ranked[0].score.errors),
            (1.0, 0.0),
            "shown, not scored"
        );
    }

    #[test]
    fn open_breaker_and_cooling_routes_go_last_even_on_a_better_rung() {
        let cfg = config("");
        let route = |n: &str| cfg.route(n).expect("route");
        let open = RouteView {
            breaker_open: true,
            unavailable_for: Some(Duration::from_secs(4)),
            ..view(Some(50), 0.0)
        };
        let cooling = RouteView {
            cooling: true,
            ..view(Some(50), 0.0)
        };
        let ranked = rank(
            vec![
                (route("eu-a"), open),
                (route("eu-fast"), cooling),
                (route("eu-b"), view(Some(900), 0.0)),
            ],
            None,
            &cfg.ranking,
        );
        // Resting routes keep rung and score order among themselves (eu-a's cost puts it last).
        assert_eq!(
            names(&ranked),
            ["eu-b", "eu-fast", "eu-a"],
            "available L1 before resting L0s"
        );
        assert_eq!(ranked[1].score.status, RouteStatus::Cooling);
        assert_eq!(ranked[2].score.status, RouteStatus::BreakerOpen);
        assert_eq!(
            ranked[2].score.recovers_in_ms,
            Some(4_000),
            "the breaker's remaining cool-down is shown"
        );
    }

    #[test]
    fn leased_route_comes_first_within_its_rung() {
        let cfg = config("");
        let route = |n: &str| cfg.route(n).expect("route");
        let ranked = rank(
            vec![
                (route("eu-a"), view(Some(900), 0.0)),
                (route("eu-fast"), view(Some(100), 0.0)),
            ],
            Some("eu-a"),
            &cfg.ranking,
        );
        assert_eq!(
            names(&ranked),
            ["eu-a", "eu-fast"],
            "the lease outranks a faster route of the same rung"
        );
        assert!(ranked[0].score.leased);
    }

    #[test]
    fn route_without_samples_is_scored_at_the_plans_mean() {
        let cfg = config("");
        let route = |n: &str| cfg.route(n).expect("route");
        let ranked = rank(
            vec![
                (route("eu-a"), view(Some(200), 0.0)),
                (route("eu-fast"), view(None, 0.0)),
                (route("eu-b"), view(Some(600), 0.0)),
            ],
            None,
            &cfg.ranking,
        );
        let fresh = ranked.iter().find(|r| r.route.name == "eu-fast").expect("ranked");
        assert_eq!(fresh.score.ttft_p95_ms, None, "no live p95 is reported");
        assert!(
            (fresh.score.ttft_used_ms - 400.0).abs() < 1e-9,
            "neutral mean of 200 and 600: {:?}",
            fresh.score
        );
    }

    #[test]
    fn breakdown_serializes_for_the_decision_record() {
        let cfg = config("");
        let ranked = rank(
            vec![(cfg.route("eu-a").expect("route"), view(Some(250), 0.1))],
            None,
            &cfg.ranking,
        );
        let json = serde_json::to_value(&ranked[0].score).expect("serializable");
        assert_eq!(json["status"], "available");
        assert_eq!(json["level"], "L0");
        assert_eq!(json["ttft_p95_ms"], 250.0);
        assert!(
            json.get("recovers_in_ms").is_none(),
            "only resting routes say when they recover"
        );
    }
}
