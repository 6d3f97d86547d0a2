//! Route leases: the table of session → route that the mux writes at commit and the gateway
//! copies one entry of before planning, and the pure rule for whether a lease stands.
//!
//! A session keeps the route that last served it, for a TTL after its last served request,
//! while that route stays healthy, eligible and on the best available rung. The table is
//! bounded, forgetting the least recently served session first, and takes `now`.
//!
//! Planning never writes here: [`decide`] turns a copied [`LeaseEntry`] and the plan's
//! eligible routes into a [`LeaseUpdate`]; the gateway [`apply`](LeaseTable::apply)s a
//! revocation right after planning, and the mux [`record`](LeaseTable::record)s the route
//! that served at commit (kept, or a new lease).

use std::collections::{BTreeMap, HashMap};

use tokio::time::Instant;

use crate::config::LeaseConfig;
use crate::types::{LeaseInfo, LeaseState, LeaseUpdate, Level, RevokeReason, RouteStatus};

/// Reason codes carried in `LeaseInfo::reason`.
pub mod reason {
    use crate::types::RevokeReason;

    pub const BREAKER_OPEN: &str = RevokeReason::BreakerOpen.as_str();
    pub const COOLING: &str = RevokeReason::Cooling.as_str();
    pub const INELIGIBLE: &str = RevokeReason::Ineligible.as_str();
    pub const EXPIRED: &str = RevokeReason::Expired.as_str();
    pub const HIGHER_RUNG: &str = RevokeReason::HigherRung.as_str();
    /// Another route served although the lease was kept (the leased route failed).
    pub const FAILOVER: &str = "failover";
}

/// `LeaseInfo::state` values.
pub const KEPT: &str = LeaseState::Kept.as_str();
pub const NEW: &str = LeaseState::New.as_str();
pub const REVOKED: &str = LeaseState::Revoked.as_str();

/// Longer session ids are not leased (they would let one client pin large keys in memory).
pub const MAX_SESSION_BYTES: usize = 256;

/// An eligible route as a lease sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseCandidate<'a> {
    pub route: &'a str,
    pub level: Level,
    pub status: RouteStatus,
}

/// One session's lease, copied out of the table for planning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEntry {
    pub route: String,
    pub expires: Instant,
    /// Which recording of the lease this is (the table's counter when it was last served).
    pub generation: u64,
}

#[derive(Debug, Clone)]
struct Lease {
    route: String,
    expires: Instant,
    /// Position in `order`: when the session was last served.
    tick: u64,
}

/// Session id → route, bounded to `max_sessions`.
#[derive(Debug)]
pub struct LeaseTable {
    ttl: std::time::Duration,
    max: usize,
    leases: HashMap<String, Lease>,
    /// Sessions by last served; with one TTL for all, also by expiry.
    order: BTreeMap<u64, String>,
    next_tick: u64,
}

fn info(route: &str, state: &str, why: Option<&str>) -> LeaseInfo {
    LeaseInfo {
        route: route.to_string(),
        state: state.to_string(),
        reason: why.map(str::to_string),
    }
}

/// Does `lease` stand for a request whose eligible routes are `eligible`? Kept, or revoked
/// with a reason; `LeaseUpdate::None` without a lease. Pure: reads only its arguments.
pub fn decide(lease: Option<&LeaseEntry>, eligible: &[LeaseCandidate<'_>], now: Instant) -> LeaseUpdate {
    let Some(lease) = lease else {
        return LeaseUpdate::None;
    };
    let route = &lease.route;
    let why = if lease.expires <= now {
        Some(RevokeReason::Expired)
    } else {
        match eligible.iter().find(|c| c.route == route) {
            None => Some(RevokeReason::Ineligible),
            Some(c) if c.status == RouteStatus::BreakerOpen => Some(RevokeReason::BreakerOpen),
            Some(c) if c.status == RouteStatus::Cooling => Some(RevokeReason::Cooling),
            Some(c) => eligible
                .iter()
                .any(|o| o.status == RouteStatus::Available && o.level < c.level)
                .then_some(RevokeReason::HigherRung),
        }
    };
    match why {
        None => LeaseUpdate::Keep { route: route.clone() },
        Some(reason) => LeaseUpdate::Revoke {
            route: route.clone(),
            reason,
            generation: lease.generation,
        },
    }
}

impl LeaseTable {
    pub fn new(cfg: &LeaseConfig) -> Self {
        LeaseTable {
            ttl: cfg.ttl,
            max: cfg.max_sessions.max(1),
            leases: HashMap::new(),
            order: BTreeMap::new(),
            next_tick: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// A copy of `session`'s lease, expired or not (planning judges expiry).
    pub fn get(&self, session: &str) -> Option<LeaseEntry> {
        self.leases.get(session).map(|l| LeaseEntry {
            route: l.route.clone(),
            expires: l.expires,
            generation: l.tick,
        })
    }

    /// Applies what planning decided: a revocation forgets the lease, unless the session was
    /// served again since the entry planning saw. `Keep` and `None` change nothing (the
    /// commit's [`record`](Self::record) refreshes a kept lease).
    pub fn apply(&mut self, session: &str, update: &LeaseUpdate) {
        if let LeaseUpdate::Revoke { route, generation, .. } = update {
            let same = self
                .leases
                .get(session)
                .is_some_and(|l| l.tick == *generation && l.route == *route);
            if same {
                self.remove(session);
            }
        }
    }

    /// [`decide`] and [`apply`](Self::apply) in one step, under one borrow: the route
    /// `session` should prefer now, and what happened to its lease. `(None, None)` when the
    /// session has no lease. The request path does the two steps apart, planning unlocked.
    pub fn resolve(
        &mut self,
        session: &str,
        eligible: &[LeaseCandidate<'_>],
        now: Instant,
    ) -> (Option<String>, Option<LeaseInfo>) {
        let update = decide(self.get(session).as_ref(), eligible, now);
        self.apply(session, &update);
        (update.preferred().map(str::to_string), update.info())
    }

    /// `route` served `session` at `now`: keep or (re)start its lease. `None` for session ids
    /// too long to lease.
    pub fn record(&mut self, session: &str, route: &str, now: Instant) -> Option<LeaseInfo> {
        if session.is_empty() || session.len() > MAX_SESSION_BYTES {
            return None;
        }
        self.sweep(now);
        let tick = self.next_tick;
        self.next_tick += 1;
        let expires = now + self.ttl;
        let result = match self.leases.get_mut(session) {
            Some(lease) => {
                self.order.remove(&lease.tick);
                lease.expires = expires;
                lease.tick = tick;
                if lease.route == route {
                    info(route, KEPT, None)
                } else {
                    lease.route = route.to_string();
                    info(route, NEW, Some(reason::FAILOVER))
                }
            }
            None => {
                self.leases.insert(
                    session.to_string(),
                    Lease {
                        route: route.to_string(),
                        expires,
                        tick,
                    },
                );
                info(route, NEW, None)
            }
        };
        self.order.insert(tick, session.to_string());
        while self.leases.len() > self.max {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.leases.remove(&oldest);
        }
        Some(result)
    }

    fn remove(&mut self, session: &str) {
        if let Some(lease) = self.leases.remove(session) {
            self.order.remove(&lease.tick);
        }
    }

    /// Forgets expired leases from the oldest end.
    fn sweep(&mut self, now: Instant) {
        while let Some((&tick, session)) = self.order.first_key_value() {
            if self.leases.get(session).is_some_and(|l| l.expires > now) {
                break;
            }
            if let Some(session) = self.order.remove(&tick) {
                self.leases.remove(&session);
            }
        }
    }
}

/// The lease to show in the envelope: a revocation found while planning (it explains why the
/// session moved), else what `record` said at commit.
pub fn envelope_lease(planned: Option<&LeaseInfo>, recorded: Option<LeaseInfo>) -> Option<LeaseInfo> {
    match planned {
        Some(p) if p.state == REVOKED => Some(p.clone()),
        _ => recorded.or_else(|| planned.cloned()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn table(max: usize) -> LeaseTable {
        LeaseTable::new(&LeaseConfig {
            enabled: true,
            ttl: Duration::from_secs(60),
            max_sessions: max,
        })
    }

    fn cand(route: &str, level: Level, status: RouteStatus) -> LeaseCandidate<'_> {
        LeaseCandidate { route, level, status }
    }

    const UP: RouteStatus = RouteStatus::Available;

    #[test]
    fn lease_is_kept_across_requests_of_one_session() {
        let mut t = table(10);
        let now = Instant::now();
        assert_eq!(
            t.record("s1", "a", now).map(|i| i.state),
            Some(NEW.into()),
            "first commit starts a lease"
        );
        let eligible = [cand("b", Level::L0, UP), cand("a", Level::L0, UP)];
        let (preferred, info) = t.resolve("s1", &eligible, now + Duration::from_secs(5));
        assert_eq!(preferred.as_deref(), Some("a"), "the session keeps its route");
        assert_eq!(info.map(|i| i.state), Some(KEPT.into()));
        let again = t.record("s1", "a", now + Duration::from_secs(5)).expect("leasable");
        assert_eq!(
            (again.state.as_str(), again.reason),
            (KEPT, None),
            "serving it again keeps the lease"
        );
    }

    #[test]
    fn lease_is_revoked_when_the_breaker_opens() {
        let mut t = table(10);
        let now = Instant::now();
        t.record("s1", "a", now);
        let eligible = [cand("a", Level::L0, RouteStatus::BreakerOpen), cand("b", Level::L0, UP)];
        let (preferred, info) = t.resolve("s1", &eligible, now);
        assert_eq!(preferred, None, "an open breaker is not preferred");
        let info = info.expect("a revocation is reported");
        assert_eq!((info.route.as_str(), info.state.as_str()), ("a", REVOKED));
        assert_eq!(info.reason.as_deref(), Some(reason::BREAKER_OPEN));
        assert!(t.is_empty(), "a revoked lease is forgotten");
    }

    #[test]
    fn lease_is_revoked_when_the_route_is_no_longer_eligible() {
        let mut t = table(10);
        let now = Instant::now();
        t.record("s1", "a", now);
        let (preferred, info) = t.resolve("s1", &[cand("b", Level::L0, UP)], now);
        assert_eq!(preferred, None);
        assert_eq!(
            info.and_then(|i| i.reason).as_deref(),
            Some(reason::INELIGIBLE),
            "policy change revokes"
        );
    }

    #[test]
    fn lease_is_revoked_while_the_route_cools_or_a_better_rung_is_back() {
        let mut t = table(10);
        let now = Instant::now();
        t.record("s1", "a", now);
        let (_, info) = t.resolve("s1", &[cand("a", Level::L0, RouteStatus::Cooling)], now);
        assert_eq!(info.and_then(|i| i.reason).as_deref(), Some(reason::COOLING));
        t.record("s2", "l1", now);
        let (preferred, info) = t.resolve("s2", &[cand("l0", Level::L0, UP), cand("l1", Level::L1, UP)], now);
        assert_eq!(preferred, None, "the ladder wins over affinity");
        assert_eq!(info.and_then(|i| i.reason).as_deref(), Some(reason::HIGHER_RUNG));
    }

    #[test]
    fn lease_expires_after_its_ttl() {
        let mut t = table(10);
        let now = Instant::now();
        t.record("s1", "a", now);
        let later = now + Duration::from_secs(61);
        let (preferred, info) = t.resolve("s1", &[cand("a", Level::L0, UP)], later);
        assert_eq!(preferred, None, "an idle session's lease lapses");
        assert_eq!(info.and_then(|i| i.reason).as_deref(), Some(reason::EXPIRED));
        assert_eq!(
            t.resolve("s1", &[cand("a", Level::L0, UP)], later),
            (None, None),
            "and is gone"
        );
    }

    #[test]
    fn table_is_bounded_and_forgets_the_least_recently_served() {
        let mut t = table(2);
        let now = Instant::now();
        t.record("s1", "a", now);
        t.record("s2", "a", now);
        t.record("s1", "a", now);
        t.record("s3", "a", now);
        assert_eq!(t.len(), 2, "never more than max_sessions");
        assert_eq!(
            t.resolve("s2", &[cand("a", Level::L0, UP)], now),
            (None, None),
            "s2 was least recently served"
        );
        assert!(
            t.resolve("s1", &[cand("a", Level::L0, UP)], now).0.is_some(),
            "s1 was refreshed and kept"
        );
    }

    #[test]
    fn expired_leases_are_swept_when_recording() {
        let mut t = table(10);
        let now = Instant::now();
        t.record("s1", "a", now);
        t.record("s2", "a", now + Duration::from_secs(61));
        assert_eq!(t.len(), 1, "s1's lapsed lease was dropped");
    }

    #[test]
    fn serving_from_another_route_moves_the_lease() {
        let mut t = table(10);
        let now = Instant::now();
        t.record("s1", "a", now);
        let moved = t.record("s1", "b", now).expect("leasable");
        assert_eq!((moved.route.as_str(), moved.state.as_str()), ("b", NEW));
        assert_eq!(moved.reason.as_deref(), Some(reason::FAILOVER));
        assert!(
            t.record(&"x".repeat(MAX_SESSION_BYTES + 1), "a", now).is_none(),
            "oversized ids are not leased"
        );
    }

    #[test]
    fn envelope_shows_a_revocation_over_the_new_lease() {
        let revoked = info("a", REVOKED, Some(reason::BREAKER_OPEN));
        let shown = envelope_lease(Some(&revoked), Some(info("b", NEW, None)));
        assert_eq!(shown, Some(revoked), "the revocation explains why the session moved");
        let kept = info("a", KEPT, None);
        assert_eq!(envelope_lease(Some(&kept), Some(kept.clone())), Some(kept));
    }

    #[test]
    fn deciding_reads_a_copy_and_changes_nothing() {
        let mut t = table(10);
        let now = Instant::now();
        t.record("s1", "a", now);
        let entry = t.get("s1").expect("leased");
        let eligible = [cand("a", Level::L0, RouteStatus::BreakerOpen)];
        let update = decide(Some(&entry), &eligible, now);
        assert_eq!(
            update,
            decide(Some(&entry), &eligible, now),
            "same input, same decision"
        );
        assert!(
            matches!(
                update,
                LeaseUpdate::Revoke {
                    reason: RevokeReason::BreakerOpen,
                    ..
                }
            ),
            "{update:?}"
        );
        assert_eq!(t.get("s1"), Some(entry), "the table still holds the lease");
        assert_eq!(
            decide(None, &eligible, now),
            LeaseUpdate::None,
            "no lease, nothing to do"
        );
    }

    #[test]
    fn a_revocation_planned_on_an_older_lease_leaves_a_newer_one() {
        let mut t = table(10);
        let now = Instant::now();
        t.record("s1", "a", now);
        let seen = t.get("s1").expect("leased");
        let update = decide(Some(&seen), &[cand("a", Level::L0, RouteStatus::Cooling)], now);
        // Between planning and applying, another request of the session committed on `b`.
        t.record("s1", "b", now);
        t.apply("s1", &update);
        assert_eq!(
            t.get("s1").map(|e| e.route),
            Some("b".into()),
            "the newer lease is not revoked"
        );
        let seen = t.get("s1").expect("leased");
        t.apply("s1", &decide(Some(&seen), &[cand("b", Level::L0, UP)], now));
        assert!(t.get("s1").is_some(), "a kept lease stays");
        t.apply("s1", &decide(Some(&seen), &[], now));
        assert!(t.is_empty(), "the lease planning saw is revoked");
    }
}
