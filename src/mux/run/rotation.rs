//! Route changes within one request: which failed route the request moved from, to which
//! route, which layer moved (`provider_switch` within a family, `model_switch` across), and
//! how the new attempt ended; plus the request's rotation metrics when its outcome is decided.

use std::sync::Arc;

use super::Run;
use crate::telemetry::handles::COMPLETED;
use crate::telemetry::rotation as rt;
use crate::types::RouteChange;

/// The request's moves between routes.
#[derive(Debug, Default)]
pub(super) struct Moves {
    /// Routes that failed and that the request has not moved away from yet.
    pending: Vec<Arc<str>>,
    /// Each route tried and its first attempt's place in the request's launch order (a
    /// handful).
    first_launch: Vec<(Arc<str>, u32)>,
    /// `env.route_changes` positions whose new attempt has not ended yet.
    open: Vec<usize>,
}

impl Run {
    /// An attempt on `route` was launched `seq`-th.
    pub(super) fn launched(&mut self, route: &Arc<str>, seq: u32) {
        if !self.moves.first_launch.iter().any(|(r, _)| r == route) {
            self.moves.first_launch.push((Arc::clone(route), seq));
        }
    }

    /// An attempt on `route` failed: the next route started moves away from it, and a move
    /// to `route` ended badly.
    pub(super) fn moved_route_failed(&mut self, route: &Arc<str>) {
        self.resolve_moves(route, "failed");
        if !self.moves.pending.contains(route) {
            self.moves.pending.push(Arc::clone(route));
        }
    }

    /// An attempt starts on `to` after failures: one route change per failed route left
    /// behind (none for the same route: a retry or a repair is no route change).
    pub(super) fn moving_to(&mut self, to: &str) {
        let phase = if self.env.route.is_none() {
            "failover"
        } else {
            "recovery"
        };
        for from in std::mem::take(&mut self.moves.pending) {
            let Some(layer) = self.mux.config.switch_layer(&self.req.model, &from, to) else {
                continue;
            };
            self.moves.open.push(self.env.route_changes.len());
            self.env.route_changes.push(RouteChange {
                from: from.to_string(),
                to: to.to_string(),
                layer,
                phase: phase.to_string(),
            });
        }
    }

    /// `winner` committed: moves to it were served, moves to the losers were cancelled, and a
    /// failed route still pending that was first tried before the winner (a hedge won after
    /// its primary failed, even if the primary was retried meanwhile) moved to the winner. One
    /// first tried after it (a hedge that failed while its primary went on) was never left:
    /// the request stayed. Launch order decides, not time: a zero hedge delay starts both at
    /// once.
    pub(super) fn moves_committed(&mut self, winner: &str) {
        let launches = &self.moves.first_launch;
        let seq = first_launch(launches, winner);
        self.moves.pending.retain(|failed| first_launch(launches, failed) < seq);
        self.moving_to(winner);
        self.resolve_moves(winner, "served");
        for i in std::mem::take(&mut self.moves.open) {
            self.count_move(i, "cancelled");
        }
        self.env.family = self.mux.config.family_of(&self.req.model, winner).map(Box::from);
        let leased = self.plan.lease.as_ref().map(|l| l.route.as_str());
        if self.ctx.session.is_some() && leased.is_some_and(|r| r != winner) {
            metrics::counter!(rt::ROUTE_CHANGES_TOTAL, "model" => self.req.model.clone()).increment(1);
        }
    }

    fn resolve_moves(&mut self, to: &str, result: &'static str) {
        let (done, open): (Vec<usize>, Vec<usize>) = std::mem::take(&mut self.moves.open)
            .into_iter()
            .partition(|&i| self.env.route_changes.get(i).is_some_and(|c| c.to == to));
        self.moves.open = open;
        for i in done {
            self.count_move(i, result);
        }
    }

    fn count_move(&self, i: usize, result: &'static str) {
        if let Some(c) = self.env.route_changes.get(i) {
            metrics::counter!(
                rt::FAILOVERS_TOTAL,
                "from" => c.from.clone(),
                "to" => c.to.clone(),
                "layer" => c.layer.as_str(),
                "result" => result
            )
            .increment(1);
        }
    }

    /// The request's rotation metrics, once, where its outcome is decided.
    /// `outcome` is `completed`, `truncated`, `served_from_cache`, `diverged` or an error
    /// class (`ErrorClass::as_str`): a fixed set.
    pub(super) fn rotation_outcome(&self, outcome: &str) {
        let ended = matches!(outcome, "completed" | "truncated" | "served_from_cache" | "diverged");
        let model = self.mux.metrics.model(&self.req.model);
        match model.filter(|_| outcome == COMPLETED) {
            Some(m) => m.completed().increment(1),
            None => {
                let label = outcome.to_string();
                metrics::counter!(rt::LOGICAL_REQUESTS_TOTAL, "model" => self.req.model.clone(), "outcome" => label)
                    .increment(1);
            }
        }
        self.mux.metrics.attempts_per_request().record(f64::from(self.attempts));
        for &i in &self.moves.open {
            self.count_move(i, "cancelled");
        }
        match &self.env.route {
            None if !ended && rt::is_outage(outcome) => {
                let reason = if self.env.fell_back_from.is_empty() {
                    "none_reachable"
                } else {
                    "all_failed"
                };
                metrics::counter!(rt::UNROUTABLE_TOTAL, "reason" => reason).increment(1);
            }
            Some(route) => {
                let micros = self.billed_micros();
                let handles = model.zip(self.mux.health.route(route)).filter(|_| outcome == COMPLETED);
                match handles {
                    Some((m, r)) => rt::completed(m, &r.metrics, micros),
                    None => rt::answered(&self.req.model, route, outcome, micros),
                }
            }
            None => {}
        }
    }
}

/// `route`'s first attempt's place in the launch order (0 if it never launched).
fn first_launch(launches: &[(Arc<str>, u32)], route: &str) -> u32 {
    launches.iter().find(|(r, _)| &**r == route).map_or(0, |(_, seq)| *seq)
}
