//! The metric handles the request path records into, looked up once per model and route and
//! kept, instead of a lookup by name and labels (label strings allocated, the key built and
//! hashed, the registry searched under its lock) on every request.
//!
//! Only the common case has a handle: a request's own counters, its attempts by role, its
//! route's TTFT, and the counters of a `completed` answer. Any other outcome (an error class,
//! a truncation) is recorded through the `metrics` macros as before. The series are the same
//! either way: a handle is the registry's own entry for its name and labels, made on its first
//! use (so `/metrics` shows a series only once something was recorded in it, as before).
//!
//! A handle belongs to the recorder installed when it is made, so [`Handles::new`] installs
//! tailcut's (`telemetry::install`, once per process) first.

use std::collections::HashMap;
use std::sync::OnceLock;

use metrics::{Counter, Gauge, Histogram};

use super::rotation as rt;
use crate::config::Config;

/// The outcome whose counters have handles (the usual end of a request).
pub const COMPLETED: &str = "completed";

/// An attempt's role, as its `role` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptRole {
    Primary = 0,
    Failover = 1,
    Hedge = 2,
    Recovery = 3,
}

impl AttemptRole {
    pub fn label(self) -> &'static str {
        match self {
            AttemptRole::Primary => "primary",
            AttemptRole::Failover => "failover",
            AttemptRole::Hedge => "hedge",
            AttemptRole::Recovery => "recovery",
        }
    }
}

/// One route's handles, each made on first use.
pub struct RouteHandles {
    route: String,
    attempts: [OnceLock<Counter>; 4],
    ttft: OnceLock<Histogram>,
    answers_completed: OnceLock<Counter>,
    cost_completed: OnceLock<Counter>,
}

impl RouteHandles {
    pub fn new(route: &str) -> Self {
        RouteHandles {
            route: route.to_string(),
            attempts: Default::default(),
            ttft: OnceLock::new(),
            answers_completed: OnceLock::new(),
            cost_completed: OnceLock::new(),
        }
    }

    /// `tailcut_attempts_total{route, role}`.
    pub fn attempts(&self, role: AttemptRole) -> &Counter {
        self.attempts[role as usize].get_or_init(
            || metrics::counter!(super::ATTEMPTS_TOTAL, "route" => self.route.clone(), "role" => role.label()),
        )
    }

    /// `tailcut_ttft_seconds{route}`.
    pub fn ttft(&self) -> &Histogram {
        self.ttft
            .get_or_init(|| metrics::histogram!(super::TTFT_SECONDS, "route" => self.route.clone()))
    }

    /// `tailcut_answers_total{route, outcome="completed"}`.
    pub fn answers_completed(&self) -> &Counter {
        self.answers_completed
            .get_or_init(|| metrics::counter!(rt::ANSWERS_TOTAL, "route" => self.route.clone(), "outcome" => COMPLETED))
    }

    /// `tailcut_answer_cost_total{route, outcome="completed"}`.
    pub fn cost_completed(&self) -> &Counter {
        self.cost_completed.get_or_init(
            || metrics::counter!(rt::ANSWER_COST_TOTAL, "route" => self.route.clone(), "outcome" => COMPLETED),
        )
    }
}

/// One configured model's handles, each made on first use.
pub struct ModelHandles {
    model: String,
    requests: OnceLock<Counter>,
    completed: OnceLock<Counter>,
    cost_completed: OnceLock<Counter>,
}

impl ModelHandles {
    fn new(model: &str) -> Self {
        ModelHandles {
            model: model.to_string(),
            requests: OnceLock::new(),
            completed: OnceLock::new(),
            cost_completed: OnceLock::new(),
        }
    }

    /// `tailcut_requests_total{model}`.
    pub fn requests(&self) -> &Counter {
        self.requests
            .get_or_init(|| metrics::counter!(super::REQUESTS_TOTAL, "model" => self.model.clone()))
    }

    /// `tailcut_logical_requests_total{model, outcome="completed"}`.
    pub fn completed(&self) -> &Counter {
        self.completed.get_or_init(
            || metrics::counter!(rt::LOGICAL_REQUESTS_TOTAL, "model" => self.model.clone(), "outcome" => COMPLETED),
        )
    }

    /// `tailcut_model_cost_total{model, outcome="completed"}`.
    pub fn cost_completed(&self) -> &Counter {
        self.cost_completed.get_or_init(
            || metrics::counter!(rt::MODEL_COST_TOTAL, "model" => self.model.clone(), "outcome" => COMPLETED),
        )
    }
}

/// The request path's handles but the routes' own: the unlabelled ones and each configured
/// model's. (A route's, [`RouteHandles`], live with its health, `health::RouteHealth`.)
pub struct Handles {
    active_streams: OnceLock<Gauge>,
    client_ttft: OnceLock<Histogram>,
    attempts_per_request: OnceLock<Histogram>,
    models: HashMap<String, ModelHandles>,
}

impl Handles {
    /// The handles of `config`'s models, recording into tailcut's recorder.
    pub fn new(config: &Config) -> Self {
        let _ = super::install();
        Handles {
            active_streams: OnceLock::new(),
            client_ttft: OnceLock::new(),
            attempts_per_request: OnceLock::new(),
            models: config
                .models
                .keys()
                .map(|m| (m.clone(), ModelHandles::new(m)))
                .collect(),
        }
    }

    /// `tailcut_active_streams`.
    pub fn active_streams(&self) -> &Gauge {
        self.active_streams
            .get_or_init(|| metrics::gauge!(super::ACTIVE_STREAMS))
    }

    /// `tailcut_client_ttft_seconds`.
    pub fn client_ttft(&self) -> &Histogram {
        self.client_ttft
            .get_or_init(|| metrics::histogram!(super::CLIENT_TTFT_SECONDS))
    }

    /// `tailcut_attempts_per_request`.
    pub fn attempts_per_request(&self) -> &Histogram {
        self.attempts_per_request
            .get_or_init(|| metrics::histogram!(rt::ATTEMPTS_PER_REQUEST))
    }

    /// A configured model's handles.
    pub fn model(&self, model: &str) -> Option<&ModelHandles> {
        self.models.get(model)
    }
}
