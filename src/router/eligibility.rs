//! Eligibility before preference: may this route serve this request at all? Every "no"
//! carries a code and a reason that end up in the decision record, and in the error when
//! nothing fits. Nothing here looks at health: an unhealthy route is still eligible (ranking
//! puts it last), a forbidden one never is.

use serde::Serialize;

use super::fidelity::CrossWire;
use super::requirements::Requirements;
use super::tokens::{Counter, PromptSize, PromptTokens};
use crate::config::{floor_for, Config, RouteConfig, Wire};
use crate::types::{ChatRequest, ExclusionCode, Priority, ResponseFormat};

/// Output tokens reserved in the window when the client sets no `max_tokens` on a route
/// whose wire format does not require one: room for at least a short answer.
pub const DEFAULT_OUTPUT_RESERVE: u32 = 256;

/// One reason a route cannot serve a request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ineligible {
    pub code: ExclusionCode,
    pub detail: String,
}

impl Ineligible {
    fn new(code: ExclusionCode, detail: String) -> Self {
        Ineligible { code, detail }
    }
}

/// Measures `req`'s prompt for every route of its model, as the context check will ask:
/// the one costly step of planning (tokenizing), done before it and outside any lock.
pub fn count_prompt(config: &Config, req: &ChatRequest) -> PromptTokens {
    let names = config
        .models
        .get(&req.model)
        .map(|m| m.routes.as_slice())
        .unwrap_or_default();
    PromptSize::new(req).count(
        names
            .iter()
            .filter_map(|n| config.route(n))
            .map(|r| (Counter::for_route(r), Window::of(r, req).budget)),
    )
}

/// A route's context window as one request may fill it.
struct Window {
    /// Output tokens kept free for the answer.
    reserve: u32,
    window: u64,
    /// Prompt tokens that fit: the window minus the reserve.
    budget: u64,
}

impl Window {
    fn of(route: &RouteConfig, req: &ChatRequest) -> Window {
        let reserve = match (req.max_tokens, route.wire) {
            (Some(m), _) => m,
            (None, Wire::Anthropic) => crate::provider::anthropic::DEFAULT_MAX_TOKENS,
            (None, Wire::OpenAi) => DEFAULT_OUTPUT_RESERVE,
        }
        .min(route.max_output);
        let window = u64::from(route.context_window);
        Window {
            reserve,
            window,
            budget: window.saturating_sub(u64::from(reserve)),
        }
    }
}

/// Eligibility of routes for one request, over its prompt measured once before planning.
pub struct Eligibility<'a> {
    req: &'a ChatRequest,
    needs: &'a Requirements,
    prompt: PromptTokens,
    /// The task the quality floor applies to.
    pub task: String,
    pub floor: Option<f64>,
    /// What a route of another wire would lose of the request.
    cross: CrossWire,
}

impl<'a> Eligibility<'a> {
    /// Counts the prompt itself (see [`count_prompt`]); planning passes its count in instead.
    pub fn new(config: &Config, req: &'a ChatRequest, needs: &'a Requirements) -> Self {
        Self::with_prompt(config, req, needs, count_prompt(config, req))
    }

    pub fn with_prompt(config: &Config, req: &'a ChatRequest, needs: &'a Requirements, prompt: PromptTokens) -> Self {
        let task = needs.task_for(config, &req.model);
        let floor = needs.floor_for(config, &req.model, &task);
        Eligibility {
            req,
            needs,
            prompt,
            task,
            floor,
            cross: CrossWire::of(req),
        }
    }

    /// Every reason `route` cannot serve the request; empty when it can.
    pub fn check(&self, route: &RouteConfig) -> Vec<Ineligible> {
        let mut out = Vec::new();
        self.residency(route, &mut out);
        self.pool(route, &mut out);
        self.capabilities(route, &mut out);
        if let Some(why) = self.cross.refusal(route.wire) {
            out.push(Ineligible::new(ExclusionCode::Fidelity, why));
        }
        if let Some(field) = self.cross.refused_by(self.req, route.wire, &route.rules) {
            out.push(Ineligible::new(
                ExclusionCode::Fidelity,
                format!("its model {} refuses {field}", route.model),
            ));
        }
        self.size(route, &mut out);
        self.quality(route, &mut out);
        out
    }

    fn residency(&self, route: &RouteConfig, out: &mut Vec<Ineligible>) {
        let needs = self.needs;
        for (want, whose) in [
            (&needs.request_region, "the request"),
            (&needs.tenant_region, "the tenant"),
        ] {
            if let Some(want) = want {
                if !route.region.eq_ignore_ascii_case(want) {
                    out.push(Ineligible::new(
                        ExclusionCode::Region,
                        format!("region {} is not {want}, required by {whose}", route.region),
                    ));
                }
            }
        }
        let missing: Vec<&str> = needs
            .data_terms
            .iter()
            .filter(|t| !route.data_terms.contains(t))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            out.push(Ineligible::new(
                ExclusionCode::DataTerms,
                format!("lacks data terms {}", missing.join(", ")),
            ));
        }
    }

    fn pool(&self, route: &RouteConfig, out: &mut Vec<Ineligible>) {
        if !route.pools.admits(self.needs.priority) {
            let tier = match self.needs.priority {
                Priority::Interactive => "interactive",
                Priority::Batch => "batch",
            };
            out.push(Ineligible::new(ExclusionCode::Pool, format!("not in the {tier} pool")));
        }
    }

    fn capabilities(&self, route: &RouteConfig, out: &mut Vec<Ineligible>) {
        let req = self.req;
        let caps = &route.capabilities;
        let mut lacking = Vec::new();
        if !req.tools.is_empty() && !caps.tools {
            lacking.push("tools");
        }
        if req.messages.iter().any(|m| m.has_images()) && !caps.vision {
            lacking.push("vision");
        }
        // Structured output is never silently dropped: a route without native JSON output
        // (e.g. Anthropic's Messages API) is not eligible for json_object or json_schema.
        if matches!(
            req.response_format,
            Some(ResponseFormat::JsonSchema { .. } | ResponseFormat::JsonObject)
        ) && !caps.json_schema
        {
            lacking.push("json_schema");
        }
        if !lacking.is_empty() {
            out.push(Ineligible::new(
                ExclusionCode::Capability,
                format!("lacks {}", lacking.join(", ")),
            ));
        }
    }

    fn size(&self, route: &RouteConfig, out: &mut Vec<Ineligible>) {
        if let Some(asked) = self.req.max_tokens.filter(|m| *m > route.max_output) {
            out.push(Ineligible::new(
                ExclusionCode::MaxOutput,
                format!("max_tokens {asked} exceeds the route's max output {}", route.max_output),
            ));
        }
        let Window {
            reserve,
            window,
            budget,
        } = Window::of(route, self.req);
        let (prompt, how) = self.prompt.measure(Counter::for_route(route), budget);
        if prompt > budget {
            out.push(Ineligible::new(
                ExclusionCode::ContextLength,
                format!(
                    "needs {prompt} prompt tokens ({}) + {reserve} output, window is {window}",
                    how.describe()
                ),
            ));
        }
    }

    fn quality(&self, route: &RouteConfig, out: &mut Vec<Ineligible>) {
        let Some(floor) = self.floor else { return };
        let task = &self.task;
        match floor_for(&route.quality, task) {
            Some(q) if q >= floor => {}
            Some(q) => out.push(Ineligible::new(
                ExclusionCode::QualityFloor,
                format!("quality {q} for task {task} is below the floor {floor}"),
            )),
            None => out.push(Ineligible::new(
                ExclusionCode::QualityFloor,
                format!("no quality score for task {task} (floor {floor})"),
            )),
        }
    }
}

/// One line for all of a route's reasons.
pub fn describe(reasons: &[Ineligible]) -> String {
    reasons.iter().map(|r| r.detail.as_str()).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::testkit::{config, request};
    use crate::types::{ContentPart, Message, Role, ToolSpec};

    /// The codes `route` is excluded for under `needs`.
    fn codes(cfg: &Config, req: &ChatRequest, needs: &Requirements, route: &str) -> Vec<ExclusionCode> {
        let r = cfg.route(route).expect("route in the test config");
        Eligibility::new(cfg, req, needs)
            .check(r)
            .into_iter()
            .map(|i| i.code)
            .collect()
    }

    #[test]
    fn route_outside_the_requested_region_is_excluded() {
        let cfg = config("");
        let needs = Requirements {
            request_region: Some("EU".into()),
            ..Requirements::default()
        };
        assert_eq!(codes(&cfg, &request("hi"), &needs, "us-c"), [ExclusionCode::Region]);
        assert!(
            codes(&cfg, &request("hi"), &needs, "eu-a").is_empty(),
            "regions compare case-insensitively"
        );
    }

    #[test]
    fn tenant_region_and_data_terms_are_both_required() {
        let cfg = config("");
        let needs = Requirements::default().with_tenant(cfg.tenant("acme").expect("tenant"));
        assert_eq!(
            codes(&cfg, &request("hi"), &needs, "eu-b"),
            [ExclusionCode::DataTerms],
            "EU but keeps data"
        );
        assert_eq!(
            codes(&cfg, &request("hi"), &needs, "us-c"),
            [ExclusionCode::Region, ExclusionCode::DataTerms],
            "every reason is reported, not just the first"
        );
        let detail = describe(&Eligibility::new(&cfg, &request("hi"), &needs).check(cfg.route("us-c").expect("route")));
        assert!(
            detail.contains("region us is not eu, required by the tenant"),
            "{detail}"
        );
        assert!(detail.contains("lacks data terms no_retention"), "{detail}");
    }

    #[test]
    fn batch_only_route_refuses_interactive_requests() {
        let cfg = config("");
        let interactive = Requirements::default();
        assert_eq!(
            codes(&cfg, &request("hi"), &interactive, "eu-batch"),
            [ExclusionCode::Pool]
        );
        let batch = Requirements {
            priority: Priority::Batch,
            ..Requirements::default()
        };
        assert!(
            codes(&cfg, &request("hi"), &batch, "eu-batch").is_empty(),
            "batch requests may use it"
        );
    }

    #[test]
    fn missing_capabilities_are_named() {
        let cfg = config("");
        let mut req = request("look");
        req.tools.push(ToolSpec {
            name: "f".into(),
            description: None,
            parameters: serde_json::json!({}),
        });
        req.messages.push(Message {
            content: vec![ContentPart::ImageUrl {
                url: "data:image/png;base64,AA".into(),
            }],
            ..Message::text(Role::User, "")
        });
        req.response_format = Some(ResponseFormat::JsonSchema {
            name: "x".into(),
            schema: serde_json::json!({}),
            strict: None,
        });
        let reasons = Eligibility::new(&cfg, &req, &Requirements::default()).check(cfg.route("us-c").expect("route"));
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert_eq!(reasons[0].code, ExclusionCode::Capability);
        assert_eq!(reasons[0].detail, "lacks tools, vision, json_schema");
    }

    #[test]
    fn max_tokens_above_the_routes_max_output_is_excluded() {
        let cfg = config("");
        let mut req = request("hi");
        req.max_tokens = Some(3_000);
        assert_eq!(
            codes(&cfg, &req, &Requirements::default(), "eu-a"),
            [ExclusionCode::MaxOutput],
            "eu-a caps at 2000"
        );
        assert!(
            codes(&cfg, &req, &Requirements::default(), "eu-fast").is_empty(),
            "eu-fast allows 4096"
        );
    }

    #[test]
    fn prompt_plus_output_beyond_the_window_is_excluded() {
        let cfg = config("");
        // ~9,000 estimated tokens against eu-a's 8,000 window.
        let req = request(&"word ".repeat(6_500));
        let reasons = Eligibility::new(&cfg, &req, &Requirements::default()).check(cfg.route("eu-a").expect("route"));
        assert_eq!(
            reasons.iter().map(|r| r.code).collect::<Vec<_>>(),
            [ExclusionCode::ContextLength]
        );
        assert!(
            reasons[0].detail.contains("estimated"),
            "the method is stated: {}",
            reasons[0].detail
        );
        assert!(reasons[0].detail.contains("window is 8000"), "{}", reasons[0].detail);
        assert!(
            codes(&cfg, &req, &Requirements::default(), "eu-fast").is_empty(),
            "128k window fits"
        );
    }

    #[test]
    fn openai_family_routes_are_counted_with_their_tokenizer() {
        let mut cfg = config("");
        let route = cfg.routes.iter_mut().find(|r| r.name == "eu-a").expect("route");
        route.model = "gpt-4o-mini".into();
        // 32,500 bytes: over the 7,744-token budget in bytes, but only ~6,500 o200k tokens.
        let req = request(&"word ".repeat(6_500));
        assert!(
            codes(&cfg, &req, &Requirements::default(), "eu-a").is_empty(),
            "counted exactly, it fits"
        );
        let long = request(&"word ".repeat(9_000));
        let reasons = Eligibility::new(&cfg, &long, &Requirements::default()).check(cfg.route("eu-a").expect("route"));
        assert!(reasons[0].detail.contains("counted, o200k"), "{}", reasons[0].detail);
    }

    #[test]
    fn route_below_the_quality_floor_or_without_a_score_is_excluded() {
        let cfg = config("quality_floor = 0.7");
        let chat = Requirements::default();
        assert_eq!(
            codes(&cfg, &request("hi"), &chat, "us-c"),
            [ExclusionCode::QualityFloor],
            "0.6 < 0.7"
        );
        assert!(codes(&cfg, &request("hi"), &chat, "eu-b").is_empty(), "0.8 passes");
        let code = Requirements::default().with_task(Some("code"));
        assert_eq!(
            codes(&cfg, &request("hi"), &code, "eu-b"),
            [ExclusionCode::QualityFloor],
            "no code score"
        );
        assert!(
            codes(&cfg, &request("hi"), &code, "eu-a").is_empty(),
            "0.8 for code passes 0.7"
        );
    }

    #[test]
    fn the_stricter_of_model_and_tenant_floor_applies() {
        let mut cfg = config("quality_floor = 0.5");
        let tenant = crate::config::TenantConfig {
            name: "picky".into(),
            quality_floor: [("chat".to_string(), 0.88)].into(),
            ..crate::config::TenantConfig::default()
        };
        cfg.tenants.insert("picky".into(), tenant.clone());
        let needs = Requirements::default().with_tenant(&tenant);
        let req = request("hi");
        assert_eq!(Eligibility::new(&cfg, &req, &needs).floor, Some(0.88));
        assert_eq!(
            codes(&cfg, &request("hi"), &needs, "eu-fast"),
            [ExclusionCode::QualityFloor],
            "0.85 < 0.88"
        );
    }
}
