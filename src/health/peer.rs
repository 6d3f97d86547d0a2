//! Health hints between instances: the outages this instance tells its peers, and the peers'
//! hints it takes on its own routes (advisory: see the `health` module doc).

use tokio::time::Instant;

use super::breaker::BreakerState;
use super::Health;

/// What a health hint says about a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HintKind {
    /// Its breaker opened.
    BreakerOpen,
    /// It answered 429 (or ran out of quota) and is cooling.
    Cooling,
}

impl HintKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HintKind::BreakerOpen => "breaker_open",
            HintKind::Cooling => "cooling",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "breaker_open" => Some(HintKind::BreakerOpen),
            "cooling" => Some(HintKind::Cooling),
            _ => None,
        }
    }
}

/// A route this instance itself sees down right now: what it tells its peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outage {
    pub route: String,
    pub kind: HintKind,
    pub until: Instant,
}

impl Health {
    /// The routes this instance itself sees down at `now` (breaker open, or cooling after a
    /// rate limit or quota failure), with when that ends. Peer hints are not included: an
    /// instance only ever tells what it observed.
    pub fn outages(&self, now: Instant) -> Vec<Outage> {
        let mut out = Vec::new();
        for r in &self.routes {
            let s = r.state.lock();
            if let BreakerState::Open { until } = s.breaker.state(now) {
                out.push(Outage {
                    route: r.name.clone(),
                    kind: HintKind::BreakerOpen,
                    until,
                });
            } else if let Some(until) = s.local_cooling(now) {
                out.push(Outage {
                    route: r.name.clone(),
                    kind: HintKind::Cooling,
                    until,
                });
            }
        }
        out
    }

    /// Takes a peer's hint that `name` is down until `until`: advisory (see the module doc).
    /// A later hint replaces an earlier one. False for an unknown route.
    pub fn peer_hint(&self, name: &str, kind: HintKind, until: Instant) -> bool {
        match self.route(name) {
            Some(r) => {
                r.state.lock().peer = Some((kind, until));
                true
            }
            None => false,
        }
    }

    /// The peer hint on `name` still live at `now`.
    pub fn live_peer_hint(&self, name: &str, now: Instant) -> Option<(HintKind, Instant)> {
        self.route(name)?.state.lock().peer.filter(|(_, until)| *until > now)
    }
}
