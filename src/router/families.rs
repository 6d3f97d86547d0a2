//! The model's rotation over its families: with `provider-only-before-model-change`, every
//! available route of a family before the next family. (Which family a route serves and
//! which layer a route change moved are config lookups: `Config::family_of`,
//! `Config::switch_layer`.)

use crate::config::{Config, Rotation};
use crate::types::RouteStatus;

/// Position of `route`'s family in `model`'s family order (`usize::MAX` when unknown).
fn family_index(config: &Config, model: &str, route: &str) -> usize {
    config
        .models
        .get(model)
        .and_then(|m| m.families.iter().position(|f| f.routes.iter().any(|r| r == route)))
        .unwrap_or(usize::MAX)
}

/// Reorders candidates already ranked by (availability, rung, lease, score) under the
/// model's rotation: with `provider-only-before-model-change`, a stable sort by
/// (availability, family position), so every available route of the first family comes
/// before any route of the next, each family keeping its ranked order. Routes that cannot
/// take traffic now still go last (the mux passes over them and may come back to them).
pub fn order<T>(config: &Config, model: &str, ranked: &mut [T], key: impl Fn(&T) -> (&str, RouteStatus)) {
    let rotation = config.models.get(model).map(|m| m.rotation).unwrap_or_default();
    if rotation == Rotation::Ladder {
        return;
    }
    ranked.sort_by_key(|item| {
        let (route, status) = key(item);
        (status != RouteStatus::Available, family_index(config, model, route))
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::time::Instant;

    use super::*;
    use crate::config::load_str;
    use crate::health::Health;
    use crate::router::testkit::request;
    use crate::router::{plan_with, Requirements};
    use crate::types::SwitchLayer;

    fn config(rotation: &str) -> Config {
        let route = |name: &str, model: &str, level: &str| {
            format!(
                "[[routes]]\nname = \"{name}\"\nprovider = \"simulated\"\nmodel = \"{model}\"\nlevel = \"{level}\"\n"
            )
        };
        let text = format!(
            "{}{}{}{}[models.chat]\nfamilies = [{{ name = \"gpt\", routes = [\"oa\", \"az\", \"oa-us\"] }}, {{ name = \"claude\", routes = [\"an\"] }}]\n{rotation}",
            route("oa", "gpt-4o", "L0"),
            route("az", "gpt-4o", "L1"),
            route("oa-us", "gpt-4o", "L0"),
            route("an", "claude", "L0"),
        );
        load_str(&text).unwrap_or_else(|e| panic!("test config: {e}"))
    }

    fn order_of(cfg: &Config, health: &Health, now: Instant) -> Vec<String> {
        let plan = plan_with(cfg, health, &request("hi"), &Requirements::default(), None, now).expect("plan");
        assert!(plan.ranking.iter().all(|s| s.family.is_some()), "{:?}", plan.ranking);
        plan.candidates.into_iter().map(|c| c.route).collect()
    }

    #[test]
    fn a_family_is_exhausted_before_the_next_and_keeps_its_ladder_inside() {
        let cfg = config("");
        let now = Instant::now();
        let health = Arc::new(Health::new(&cfg, now));
        assert_eq!(order_of(&cfg, &health, now), ["oa", "oa-us", "az", "an"]);
        health.force_open("oa", now);
        assert_eq!(
            order_of(&cfg, &health, now),
            ["oa-us", "az", "an", "oa"],
            "a route that cannot take traffic now still goes last"
        );
        let ladder = config("rotation = \"ladder\"\n");
        let health = Health::new(&ladder, now);
        assert_eq!(
            order_of(&ladder, &health, now),
            ["oa", "oa-us", "an", "az"],
            "rungs first"
        );
    }

    #[test]
    fn the_layer_is_a_provider_switch_within_a_family_and_a_model_switch_across() {
        let cfg = config("");
        assert_eq!(cfg.switch_layer("chat", "oa", "az"), Some(SwitchLayer::ProviderSwitch));
        assert_eq!(cfg.switch_layer("chat", "az", "an"), Some(SwitchLayer::ModelSwitch));
        assert_eq!(cfg.switch_layer("chat", "oa", "oa"), None, "a retry is no route change");
        assert_eq!(cfg.family_of("chat", "an"), Some("claude"));
        assert_eq!(cfg.family_of("other", "an"), None);
    }
}
