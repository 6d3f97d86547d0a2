//! The plan for one request: eligible routes in preference order, and every exclusion with
//! its reason.

use tokio::time::Instant;

use super::eligibility;
use crate::config::Config;
use crate::gateway::RequestCtx;
use crate::health::Health;
use crate::types::{ChatRequest, Level};

#[derive(Debug, Clone)]
pub struct Plan {
    pub model: String,
    /// In preference order: available routes first (config order within a level), then
    /// routes that are cooling or behind an open breaker (tried only if they recover in time).
    pub candidates: Vec<Candidate>,
    pub excluded: Vec<Exclusion>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub route: String,
    pub level: Level,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Exclusion {
    pub route: String,
    pub reason: String,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum RouteError {
    #[error("no route is eligible for this request: {}", .0.iter().map(|e| format!("{} ({})", e.route, e.reason)).collect::<Vec<_>>().join("; "))]
    NoneEligible(Vec<Exclusion>),
}

/// Plans `req` for the model it names (the caller checked that the model exists).
pub fn plan(config: &Config, health: &Health, req: &ChatRequest, ctx: &RequestCtx, now: Instant) -> Result<Plan, RouteError> {
    let names = config.models.get(&req.model).map(|m| m.routes.as_slice()).unwrap_or_default();
    let mut excluded = Vec::new();
    let mut available = Vec::new();
    let mut resting = Vec::new();
    for name in names {
        let Some(route) = config.route(name) else { continue };
        if let Err(reason) = eligibility::check(route, req, ctx) {
            excluded.push(Exclusion { route: name.clone(), reason });
            continue;
        }
        let candidate = Candidate { route: name.clone(), level: route.level };
        match health.availability(name, now) {
            Ok(()) => available.push(candidate),
            Err(_) => resting.push(candidate),
        }
    }
    if available.is_empty() && resting.is_empty() {
        return Err(RouteError::NoneEligible(excluded));
    }
    // Stable: config order is the preference within a level.
    available.sort_by_key(|c| c.level);
    resting.sort_by_key(|c| c.level);
    available.extend(resting);
    Ok(Plan { model: req.model.clone(), candidates: available, excluded })
}
