//! What a request demands of a route (region, data terms, priority pool, quality floor for
//! its task), gathered from its headers, its tenant and its model.

use std::collections::BTreeMap;

use crate::config::{floor_for, Config, TenantConfig};
use crate::types::{Priority, RequestCtx};

/// The task type assumed when nothing names one.
pub const DEFAULT_TASK: &str = "chat";

/// The rules one request's routes must satisfy. Built from the request context, then narrowed
/// by the tenant; a tenant can only narrow what a request may use, never widen it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requirements {
    pub tenant: Option<String>,
    /// `x-tailcut-region`.
    pub request_region: Option<String>,
    /// The tenant's `region`.
    pub tenant_region: Option<String>,
    /// Every term must be among a route's `data_terms` (tenant's and request's together).
    pub data_terms: Vec<String>,
    pub priority: Priority,
    /// `x-tailcut-task`.
    pub task: Option<String>,
    pub tenant_task: Option<String>,
    /// The tenant's quality floors per task.
    pub tenant_floor: BTreeMap<String, f64>,
}

impl Requirements {
    /// The requirements a request context carries on its own (region header, priority).
    pub fn from_ctx(ctx: &RequestCtx) -> Self {
        Requirements {
            request_region: ctx.region.clone(),
            priority: ctx.priority,
            ..Requirements::default()
        }
    }

    /// Adds the tenant's rules.
    pub fn with_tenant(mut self, tenant: &TenantConfig) -> Self {
        self.tenant = Some(tenant.name.clone());
        self.tenant_region = tenant.region.clone();
        self.add_data_terms(tenant.data_terms.iter().cloned());
        self.tenant_task = tenant.task.clone();
        self.tenant_floor = tenant.quality_floor.clone();
        if let Some(p) = tenant.priority {
            self.priority = self.priority.min(p);
        }
        self
    }

    /// Sets the request's task type (`x-tailcut-task`); it wins over the tenant's and model's.
    pub fn with_task(mut self, task: Option<&str>) -> Self {
        self.task = task.map(str::to_string);
        self
    }

    /// Adds data terms the request itself demands.
    pub fn with_data_terms<I: IntoIterator<Item = String>>(mut self, terms: I) -> Self {
        self.add_data_terms(terms);
        self
    }

    fn add_data_terms<I: IntoIterator<Item = String>>(&mut self, terms: I) {
        for t in terms {
            if !self.data_terms.contains(&t) {
                self.data_terms.push(t);
            }
        }
    }

    /// The task the quality floor applies to: the request's, else the tenant's, else the
    /// model's, else `chat`.
    pub fn task_for(&self, config: &Config, model: &str) -> String {
        self.task
            .clone()
            .or_else(|| self.tenant_task.clone())
            .or_else(|| config.models.get(model).map(|m| m.task.clone()))
            .unwrap_or_else(|| DEFAULT_TASK.to_string())
    }

    /// The quality floor for `task`: the stricter of the model's and the tenant's. A task the
    /// request names (`x-tailcut-task`) may only raise it: the floor of the task that applies
    /// without the header holds too, so a header cannot lower what its tenant requires.
    pub fn floor_for(&self, config: &Config, model: &str, task: &str) -> Option<f64> {
        let floor = |task: &str| {
            let model_floor = config.models.get(model).and_then(|m| floor_for(&m.quality_floor, task));
            let tenant_floor = floor_for(&self.tenant_floor, task);
            match (model_floor, tenant_floor) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            }
        };
        let unnamed = self.task.is_some().then(|| {
            let without = Requirements {
                task: None,
                ..self.clone()
            };
            floor(&without.task_for(config, model))
        });
        match (floor(task), unnamed.flatten()) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The tenant named by `x-tailcut-tenant`, if configured.
pub fn tenant_defaults<'a>(config: &'a Config, name: &str) -> Option<&'a TenantConfig> {
    config.tenant(name)
}

/// Applies a tenant's defaults to a request context: a header's deadline and response type
/// win; priority is the lower of the two; a tenant with `hedge = false` turns hedging off.
pub fn apply_tenant(ctx: &mut RequestCtx, tenant: &TenantConfig) {
    ctx.deadline = ctx.deadline.or(tenant.deadline);
    ctx.response_type = ctx.response_type.or(tenant.response_type);
    if let Some(p) = tenant.priority {
        ctx.priority = ctx.priority.min(p);
    }
    if tenant.hedge == Some(false) {
        ctx.hedge_off = true;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::types::Dialect;
    use crate::types::ResponseType;

    fn tenant() -> TenantConfig {
        TenantConfig {
            name: "acme".into(),
            region: Some("eu".into()),
            data_terms: vec!["no_retention".into()],
            deadline: Some(Duration::from_secs(3)),
            priority: Some(Priority::Batch),
            hedge: Some(false),
            response_type: Some(ResponseType::Voice),
            task: Some("code".into()),
            quality_floor: BTreeMap::from([("*".into(), 0.6), ("code".into(), 0.8)]),
        }
    }

    #[test]
    fn tenant_defaults_fill_what_headers_left_unset() {
        let mut ctx = RequestCtx::new(Dialect::Native);
        ctx.deadline = Some(Duration::from_secs(1));
        apply_tenant(&mut ctx, &tenant());
        assert_eq!(ctx.deadline, Some(Duration::from_secs(1)), "the header's deadline wins");
        assert_eq!(
            ctx.response_type,
            Some(ResponseType::Voice),
            "tenant default fills the gap"
        );
        assert_eq!(
            ctx.priority,
            Priority::Batch,
            "a batch tenant cannot be raised to interactive"
        );
        assert!(ctx.hedge_off, "hedge = false turns hedging off");
    }

    #[test]
    fn a_task_header_may_raise_the_floor_but_never_lower_the_tenants() {
        let cfg = crate::router::testkit::config("");
        let needs = Requirements::default().with_tenant(&tenant());
        assert_eq!(
            needs.floor_for(&cfg, "chat", "code"),
            Some(0.8),
            "the tenant's own task"
        );
        let lowered = needs.clone().with_task(Some("chat"));
        let task = lowered.task_for(&cfg, "chat");
        assert_eq!(task, "chat", "the header names the task");
        assert_eq!(
            lowered.floor_for(&cfg, "chat", &task),
            Some(0.8),
            "its floor (0.6) cannot undercut the tenant's for its own task (0.8)"
        );
        let mut stricter = tenant();
        stricter.quality_floor.insert("math".into(), 0.9);
        let raised = Requirements::default().with_tenant(&stricter).with_task(Some("math"));
        assert_eq!(
            raised.floor_for(&cfg, "chat", "math"),
            Some(0.9),
            "a stricter task applies"
        );
    }

    #[test]
    fn tenant_narrows_region_terms_and_task() {
        let mut ctx = RequestCtx::new(Dialect::Native);
        ctx.region = Some("us".into());
        let needs = Requirements::from_ctx(&ctx)
            .with_tenant(&tenant())
            .with_data_terms(["zdr".to_string()]);
        assert_eq!(
            needs.request_region.as_deref(),
            Some("us"),
            "the request's own region is kept"
        );
        assert_eq!(
            needs.tenant_region.as_deref(),
            Some("eu"),
            "and the tenant's is checked too"
        );
        assert_eq!(needs.data_terms, vec!["no_retention".to_string(), "zdr".to_string()]);
        assert_eq!(needs.priority, Priority::Batch);
        assert_eq!(needs.tenant_task.as_deref(), Some("code"));
    }
}
