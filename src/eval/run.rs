//! Running an eval set against every route: one single-route model per route (no hedge, no
//! failover, so each score is that route's own), bounded concurrency, a progress bar, and
//! the per-route, per-task scores with their table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use serde::Serialize;
use tokio::time::Instant;

use super::{judge, request, Answer, Check, EvalItem};
use crate::config::{Config, Family, ModelConfig, Rotation};
use crate::gateway::Gateway;
use crate::sim::SimHandle;
use crate::types::{Dialect, ErrorClass, FinishReason, RequestCtx, StreamEvent};

/// One route's scores for one task.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TaskScore {
    pub items: u32,
    /// Share of items whose check passed.
    pub pass_rate: f64,
    /// Share of `json_schema` items whose answer was valid against its schema (`None`
    /// without such items).
    pub schema_validity_rate: Option<f64>,
    /// Share of items the route refused.
    pub refusal_rate: f64,
    /// Share of items that got no answer at all (an upstream error).
    pub error_rate: f64,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    /// `cost_per_1k` x tokens / 1000 over the task's items (answers that reported usage).
    pub cost: f64,
}

/// Every route's scores, by task: what `--out` writes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Scores {
    pub version: u32,
    pub routes: BTreeMap<String, BTreeMap<String, TaskScore>>,
}

/// One item's result on one route.
struct Outcome {
    route: String,
    task: String,
    passed: bool,
    schema_valid: Option<bool>,
    refused: bool,
    failed: bool,
    ttft_ms: Option<f64>,
    tokens: u64,
}

/// The model name the eval serves `route` under.
fn eval_model(route: &str) -> String {
    format!("eval:{route}")
}

/// Runs `items` against every route of `config`, `concurrency` requests at a time, with a
/// progress bar on stderr when `progress`.
pub async fn run(mut config: Config, items: &[EvalItem], concurrency: usize, progress: bool) -> Result<Scores, String> {
    for route in &config.routes {
        config.models.insert(
            eval_model(&route.name),
            ModelConfig {
                routes: vec![route.name.clone()],
                families: vec![Family {
                    name: route.model.clone(),
                    routes: vec![route.name.clone()],
                }],
                rotation: Rotation::Ladder,
                hedge: false,
                task: "chat".into(),
                quality_floor: BTreeMap::new(),
            },
        );
    }
    let sim = if config.needs_sim() {
        let listen = config.sim.listen.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
        Some(
            SimHandle::start(listen, config.sim.scenarios.clone())
                .await
                .map_err(|e| format!("simulated upstream: {e}"))?,
        )
    } else {
        None
    };
    let config = Arc::new(config);
    let gateway = Arc::new(Gateway::new(Arc::clone(&config), sim.as_ref()).map_err(|e| e.to_string())?);
    let total = (config.routes.len() * items.len()) as u64;
    let bar = if progress {
        indicatif::ProgressBar::new(total)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} answers ({elapsed})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let jobs = config.routes.iter().flat_map(|route| {
        items.iter().map(|item| {
            let gateway = Arc::clone(&gateway);
            let route = route.name.clone();
            async move { ask(&gateway, route, item).await }
        })
    });
    let mut outcomes = Vec::new();
    let mut results = futures::stream::iter(jobs).buffer_unordered(concurrency.max(1));
    while let Some(outcome) = results.next().await {
        bar.inc(1);
        outcomes.push(outcome);
    }
    bar.finish_and_clear();
    if let Some(sim) = &sim {
        sim.shutdown();
    }
    Ok(aggregate(&config, outcomes))
}

/// Sends one item to one route and judges the answer.
async fn ask(gateway: &Gateway, route: String, item: &EvalItem) -> Outcome {
    let started = Instant::now();
    let mut answer = Answer::default();
    let mut ttft_ms = None;
    let mut tokens = 0u64;
    match gateway.chat(request(item, &eval_model(&route)), RequestCtx::new(Dialect::Native)) {
        Err(e) => answer.error = Some(e.to_string()),
        Ok(mut stream) => {
            while let Some(event) = stream.next().await {
                match event {
                    StreamEvent::Start(_) => {
                        ttft_ms = Some(started.elapsed().as_secs_f64() * 1000.0);
                    }
                    StreamEvent::TextDelta(t) => answer.text.push_str(&t),
                    StreamEvent::Reset { .. } => answer.text.clear(),
                    StreamEvent::ToolCall(call) => answer.tool_calls.push(call.name),
                    StreamEvent::Usage(u) => tokens = u64::from(u.input_tokens) + u64::from(u.output_tokens),
                    StreamEvent::Finish { reason, .. } => {
                        answer.refused |= matches!(reason, FinishReason::Refusal | FinishReason::ContentFilter);
                    }
                    StreamEvent::Error(e) if e.class == ErrorClass::Refusal => answer.refused = true,
                    StreamEvent::Error(e) => answer.error = Some(e.message.clone()),
                    StreamEvent::RouteSwitch { .. } | StreamEvent::Thinking(_) | StreamEvent::Extra(_) => {}
                }
            }
        }
    }
    let (passed, schema_valid) = judge(&item.check, &answer);
    Outcome {
        route,
        task: item.task.clone(),
        passed,
        schema_valid,
        refused: answer.refused,
        failed: answer.error.is_some() && !matches!(item.check, Check::Refusal),
        ttft_ms,
        tokens,
    }
}

/// The nearest-rank `q` quantile of sorted `values`.
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn aggregate(config: &Config, outcomes: Vec<Outcome>) -> Scores {
    let mut grouped: BTreeMap<(String, String), Vec<Outcome>> = BTreeMap::new();
    for o in outcomes {
        grouped.entry((o.route.clone(), o.task.clone())).or_default().push(o);
    }
    let mut scores = Scores {
        version: 1,
        routes: BTreeMap::new(),
    };
    for ((route, task), list) in grouped {
        let n = list.len() as f64;
        let share = |f: &dyn Fn(&Outcome) -> bool| list.iter().filter(|o| f(o)).count() as f64 / n;
        let schema: Vec<bool> = list.iter().filter_map(|o| o.schema_valid).collect();
        let mut ttfts: Vec<f64> = list.iter().filter_map(|o| o.ttft_ms).collect();
        ttfts.sort_by(f64::total_cmp);
        let per_1k = config.route(&route).map_or(0.0, |r| r.cost_per_1k);
        let score = TaskScore {
            items: list.len() as u32,
            pass_rate: share(&|o| o.passed),
            schema_validity_rate: (!schema.is_empty())
                .then(|| schema.iter().filter(|v| **v).count() as f64 / schema.len() as f64),
            refusal_rate: share(&|o| o.refused),
            error_rate: share(&|o| o.failed),
            ttft_p50_ms: quantile(&ttfts, 0.5),
            ttft_p95_ms: quantile(&ttfts, 0.95),
            cost: list.iter().map(|o| o.tokens as f64 * per_1k / 1000.0).sum(),
        };
        scores.routes.entry(route).or_default().insert(task, score);
    }
    scores
}

impl Scores {
    /// The scores as a plain-text table, one row per route and task.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<24} {:<10} {:>5} {:>6} {:>7} {:>8} {:>6} {:>9} {:>9} {:>10}\n",
            "route", "task", "items", "pass", "schema", "refusal", "errors", "p50 ms", "p95 ms", "cost"
        );
        let pct = |v: f64| format!("{:.0}%", v * 100.0);
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
        for (route, tasks) in &self.routes {
            for (task, s) in tasks {
                let _ = writeln!(
                    out,
                    "{:<24} {:<10} {:>5} {:>6} {:>7} {:>8} {:>6} {:>9} {:>9} {:>10.4}",
                    route,
                    task,
                    s.items,
                    pct(s.pass_rate),
                    s.schema_validity_rate.map_or("-".to_string(), pct),
                    pct(s.refusal_rate),
                    pct(s.error_rate),
                    ms(s.ttft_p50_ms),
                    ms(s.ttft_p95_ms),
                    s.cost,
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_str;
    use crate::eval::parse_set;

    #[test]
    fn nearest_rank_quantiles() {
        let v = [10.0, 20.0, 30.0, 40.0];
        assert_eq!(quantile(&v, 0.5), Some(20.0));
        assert_eq!(quantile(&v, 0.95), Some(40.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[tokio::test]
    async fn every_route_is_scored_per_task_against_the_simulated_upstream() {
        let config = load_str(
            r#"
            [sim]
            listen = "127.0.0.1:0"
            [sim.scenarios.paris]
            text = "It is Paris."
            ttft = { median_ms = 5.0, sigma = 0.0 }
            inter_token_ms = 1.0
            [sim.scenarios.json]
            text = "{\"city\": \"Paris\"}"
            ttft = { median_ms = 5.0, sigma = 0.0 }
            inter_token_ms = 1.0
            [sim.scenarios.down]
            failure = { status = 503 }
            [[routes]]
            name = "good"
            provider = "simulated"
            scenario = "paris"
            cost_per_1k = 1.0
            [[routes]]
            name = "json"
            provider = "simulated"
            scenario = "json"
            [[routes]]
            name = "down"
            provider = "simulated"
            scenario = "down"
            [models.chat]
            routes = ["good", "json", "down"]
            "#,
        )
        .expect("config");
        let items = parse_set(
            r#"{"prompt": "Capital of France?", "check": {"type": "contains", "value": "paris"}}
            {"task": "extract", "prompt": "As JSON", "check": {"type": "json_schema", "schema": {"type": "object", "required": ["city"]}}}"#,
        )
        .expect("set");
        let scores = run(config, &items, 4, false).await.expect("ran");
        let good = &scores.routes["good"];
        assert_eq!(good["chat"].pass_rate, 1.0, "{scores:?}");
        assert_eq!(good["extract"].schema_validity_rate, Some(0.0), "prose is not JSON");
        assert!(
            good["chat"].ttft_p50_ms.is_some() && good["chat"].cost > 0.0,
            "{good:?}"
        );
        let json = &scores.routes["json"];
        assert_eq!(json["extract"].pass_rate, 1.0, "{json:?}");
        assert_eq!(json["extract"].schema_validity_rate, Some(1.0));
        let down = &scores.routes["down"];
        assert_eq!(
            (down["chat"].pass_rate, down["chat"].error_rate),
            (0.0, 1.0),
            "{down:?}"
        );
        assert_eq!(down["chat"].ttft_p50_ms, None);
        let table = scores.table();
        assert!(table.contains("good") && table.contains("extract"), "{table}");

        // The server loads the scores: a route measured below the floor is excluded, and the
        // plan says why.
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), serde_json::to_vec(&scores).expect("json")).expect("write");
        let text = format!(
            "[eval]\nscores_file = {:?}\n[[routes]]\nname = \"good\"\nprovider = \"simulated\"\n\
             [[routes]]\nname = \"down\"\nprovider = \"simulated\"\nquality = {{ chat = 0.9 }}\n\
             [models.chat]\nroutes = [\"good\", \"down\"]\nquality_floor = 0.5\n",
            file.path().display().to_string()
        );
        let config = load_str(&text).expect("config with scores");
        let down = config.route("down").expect("route");
        assert_eq!(
            down.quality.get("chat"),
            Some(&0.0),
            "the measured score replaces the configured 0.9"
        );
        assert!(config
            .eval
            .measured
            .contains(&("good".to_string(), "extract".to_string())));
        let now = Instant::now();
        let health = crate::health::Health::new(&config, now);
        let req = request(&items[0], "chat");
        let ctx = RequestCtx::new(Dialect::Native);
        let plan = crate::router::plan(&config, &health, &req, &ctx, now).expect("good is eligible");
        assert_eq!(plan.candidates.len(), 1, "{plan:?}");
        assert_eq!(plan.candidates[0].route, "good");
        let excluded = &plan.excluded[0];
        assert_eq!(excluded.route, "down");
        assert!(
            excluded
                .reason
                .contains("quality 0 for task chat is below the floor 0.5"),
            "{excluded:?}"
        );
    }

    #[test]
    fn a_scores_file_that_cannot_be_read_is_a_config_problem() {
        let err = load_str(
            "[eval]\nscores_file = \"/nonexistent/scores.json\"\n[[routes]]\nname = \"a\"\nprovider = \"simulated\"\n[models.chat]\nroutes = [\"a\"]\n",
        )
        .expect_err("unreadable");
        assert!(err.to_string().contains("eval.scores_file"), "{err}");
    }
}
