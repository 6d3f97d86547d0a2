//! Model families and their rotation, and `[eval]` scores: validation of `[models.*]`
//! `families` / `rotation` (or the flat `routes` form, read as one family per upstream model),
//! and the measured quality a `tailcut eval` scores file gives the routes.

use serde::Deserialize;

use super::routing::valid_task;
use super::validate::Validator;
use super::RouteConfig;
use crate::types::SwitchLayer;

/// `[models.NAME] families = [{ name = "gpt-4o", routes = [...] }, ...]`, as written.
#[derive(Debug, Default, Deserialize)]
pub struct RawFamily {
    pub name: Option<String>,
    pub routes: Option<Vec<String>>,
}

/// A model family: the provider endpoints (routes) that serve the same model, e.g. gpt-4o
/// on OpenAI, on Azure and in a second region. Routes stay the unit of health; the family
/// says which route changes are a change of provider and which a change of model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    pub name: String,
    pub routes: Vec<String>,
}

/// How a model's plan orders the routes of its families.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Rotation {
    /// `provider-only-before-model-change`: every eligible route of the current family is
    /// tried before the next family (within a family: the ladder, the lease, the score).
    #[default]
    ProviderOnlyBeforeModelChange,
    /// `ladder`: the ladder, the lease and the score across every family at once (what the
    /// flat `routes = [...]` form does unless it sets `rotation`).
    Ladder,
}

impl Rotation {
    pub fn as_str(self) -> &'static str {
        match self {
            Rotation::ProviderOnlyBeforeModelChange => "provider-only-before-model-change",
            Rotation::Ladder => "ladder",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "provider-only-before-model-change" => Some(Rotation::ProviderOnlyBeforeModelChange),
            "ladder" => Some(Rotation::Ladder),
            _ => None,
        }
    }
}

/// `[eval]`, as written.
#[derive(Debug, Default, Deserialize)]
pub struct RawEval {
    pub scores_file: Option<String>,
}

/// `[eval]`: measured equivalence scores (`tailcut eval --out FILE`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvalConfig {
    /// The scores file loaded into the routes' `quality`, if any.
    pub scores_file: Option<String>,
    /// (route, task) pairs whose quality is a measured pass rate.
    pub measured: Vec<(String, String)>,
}

impl super::ModelConfig {
    /// The family `route` serves in this model, if it is one of the model's routes.
    pub fn family_of(&self, route: &str) -> Option<&Family> {
        self.families.iter().find(|f| f.routes.iter().any(|r| r == route))
    }
}

impl super::Config {
    /// The name of the family `route` serves in `model`.
    pub fn family_of(&self, model: &str, route: &str) -> Option<&str> {
        Some(self.models.get(model)?.family_of(route)?.name.as_str())
    }

    /// Which layer moved when a request of `model` went from `from` to `to`: `None` for the
    /// same route (a retry or a repair is no route change), `ProviderSwitch` within a family,
    /// `ModelSwitch` across families (or when either route's family is unknown).
    pub fn switch_layer(&self, model: &str, from: &str, to: &str) -> Option<SwitchLayer> {
        if from == to {
            return None;
        }
        match (self.family_of(model, from), self.family_of(model, to)) {
            (Some(a), Some(b)) if a == b => Some(SwitchLayer::ProviderSwitch),
            _ => Some(SwitchLayer::ModelSwitch),
        }
    }
}

/// A family name: letters, digits and `_ - . : /`, at most 64 bytes (it is a metric label).
fn valid_family(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/'))
}

/// The flat form's families: one per upstream model id, in order of first appearance.
fn inferred_families(list: &[String], routes: &[RouteConfig]) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    for name in list {
        let Some(route) = routes.iter().find(|r| &r.name == name) else {
            continue;
        };
        match out.iter_mut().find(|f| f.name == route.model) {
            Some(f) => f.routes.push(name.clone()),
            None => out.push(Family {
                name: route.model.clone(),
                routes: vec![name.clone()],
            }),
        }
    }
    out
}

impl Validator {
    /// `[eval] scores_file`: a `tailcut eval` scores file whose per-route, per-task pass rates
    /// become the routes' `quality` for those tasks (a measured score replaces a configured
    /// one), so quality floors judge measured scores. Routes the file names but the config
    /// does not have are ignored.
    pub(super) fn eval_scores(&mut self, raw: RawEval, routes: &mut [RouteConfig]) -> EvalConfig {
        let mut eval = EvalConfig {
            scores_file: raw.scores_file.clone(),
            measured: Vec::new(),
        };
        let Some(path) = raw.scores_file else { return eval };
        let parsed = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {path:?}: {e}"))
            .and_then(|text| {
                serde_json::from_str::<serde_json::Value>(&text).map_err(|e| format!("{path:?} is not JSON: {e}"))
            });
        let scores = match parsed {
            Ok(v) => v,
            Err(e) => {
                self.problem("eval.scores_file", e);
                return eval;
            }
        };
        let Some(by_route) = scores.get("routes").and_then(|r| r.as_object()) else {
            self.problem(
                "eval.scores_file",
                format!("{path:?} has no \"routes\" object (write it with tailcut eval --out)"),
            );
            return eval;
        };
        for route in routes.iter_mut() {
            let Some(tasks) = by_route.get(&route.name).and_then(|t| t.as_object()) else {
                continue;
            };
            for (task, score) in tasks {
                let rate = score.get("pass_rate").and_then(serde_json::Value::as_f64);
                match rate {
                    Some(r) if valid_task(task) && (0.0..=1.0).contains(&r) => {
                        route.quality.insert(task.clone(), r);
                        eval.measured.push((route.name.clone(), task.clone()));
                    }
                    _ => self.problem(
                        "eval.scores_file",
                        format!(
                            "{path:?}: routes.{}.{task}.pass_rate must be a number in [0, 1]",
                            route.name
                        ),
                    ),
                }
            }
        }
        eval
    }

    /// A model's routes, families and rotation under `path` (`models.NAME`): either the flat
    /// `routes = [...]` (families inferred from the routes' upstream model ids, `ladder` order
    /// unless `rotation` says otherwise) or `families = [...]` (their routes in order,
    /// `provider-only-before-model-change` unless `rotation` says otherwise). Every route
    /// must exist and appear once.
    pub(super) fn families(
        &mut self,
        path: &str,
        flat: Option<Vec<String>>,
        raw: Option<Vec<RawFamily>>,
        rotation: Option<String>,
        routes: &[RouteConfig],
    ) -> (Vec<String>, Vec<Family>, Rotation) {
        let declared = raw.is_some();
        let mut list = Vec::new();
        let mut families = Vec::new();
        let check = |v: &mut Validator, at: String, r: &String, list: &[String]| {
            if !routes.iter().any(|route| &route.name == r) {
                v.problem(&at, format!("no route named {r:?}"));
            }
            if list.contains(r) {
                v.problem(&at, format!("{r:?} is listed twice"));
            }
        };
        match (flat, raw) {
            (Some(_), Some(_)) => {
                self.problem(
                    format!("{path}.families"),
                    "give either routes or families, not both (families list their own routes)",
                );
            }
            (flat, None) => {
                let flat = flat.unwrap_or_default();
                if flat.is_empty() {
                    self.problem(format!("{path}.routes"), "must list at least one route");
                }
                for (i, r) in flat.iter().enumerate() {
                    check(self, format!("{path}.routes[{i}]"), r, &flat[..i]);
                }
                families = inferred_families(&flat, routes);
                list = flat;
            }
            (None, Some(raw)) => {
                if raw.is_empty() {
                    self.problem(format!("{path}.families"), "must list at least one family");
                }
                for (i, f) in raw.into_iter().enumerate() {
                    let at = format!("{path}.families[{i}]");
                    let name = f.name.unwrap_or_default();
                    if !valid_family(&name) {
                        self.problem(
                            format!("{at}.name"),
                            "required: letters, digits and _ - . : / (at most 64), e.g. \"gpt-4o\"",
                        );
                    } else if families.iter().any(|g: &Family| g.name == name) {
                        self.problem(format!("{at}.name"), format!("family {name:?} is listed twice"));
                    }
                    let members = f.routes.unwrap_or_default();
                    if members.is_empty() {
                        self.problem(format!("{at}.routes"), "must list at least one route");
                    }
                    for (j, r) in members.iter().enumerate() {
                        check(self, format!("{at}.routes[{j}]"), r, &list);
                        list.push(r.clone());
                    }
                    families.push(Family { name, routes: members });
                }
            }
        }
        let rotation = match rotation.as_deref() {
            None if declared => Rotation::ProviderOnlyBeforeModelChange,
            None => Rotation::Ladder,
            Some(text) => Rotation::parse(text).unwrap_or_else(|| {
                self.problem(
                    format!("{path}.rotation"),
                    format!("{text:?} is not provider-only-before-model-change or ladder"),
                );
                Rotation::default()
            }),
        };
        (list, families, rotation)
    }
}
