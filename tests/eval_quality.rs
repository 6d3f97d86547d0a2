//! Equivalence scores against simulated models of different quality: the default eval set
//! run over a strong and a weak simulated route scores them apart, and once the scores are
//! loaded the quality floor excludes the weak route, with the reason in the plan the
//! decision record logs.

use tailcut::config::load_str;
use tailcut::eval::{parse_set, run};
use tailcut::types::{Dialect, RequestCtx};

const EVAL_SET: &str = include_str!("../eval/default.jsonl");

fn config(extra: &str) -> String {
    format!(
        r#"
        [sim]
        listen = "127.0.0.1:0"
        [sim.scenarios.strong]
        ttft = {{ median_ms = 5.0, sigma = 0.0 }}
        inter_token_ms = 1.0
        quality = "strong"
        [sim.scenarios.weak]
        ttft = {{ median_ms = 5.0, sigma = 0.0 }}
        inter_token_ms = 1.0
        quality = {{ wrong_answer_rate = 1.0, invalid_json_rate = 1.0, invalid_tool_args_rate = 1.0, missed_refusal_rate = 1.0 }}
        [[routes]]
        name = "strong"
        provider = "simulated"
        scenario = "strong"
        [[routes]]
        name = "weak"
        provider = "simulated"
        scenario = "weak"
        [models.chat]
        routes = ["weak", "strong"]
        {extra}
        "#
    )
}

#[tokio::test]
async fn a_weak_simulated_model_scores_lower_and_the_floor_excludes_it() {
    let items = parse_set(EVAL_SET).expect("the default eval set parses");
    let scores = run(load_str(&config("")).expect("config"), &items, 8, false)
        .await
        .expect("eval ran");
    let (strong, weak) = (&scores.routes["strong"], &scores.routes["weak"]);
    for task in ["chat", "code"] {
        assert_eq!(
            strong[task].pass_rate, 1.0,
            "a strong model passes every {task} item: {scores:?}"
        );
        assert_eq!(
            weak[task].pass_rate, 0.0,
            "a model wrong at every rate passes none: {scores:?}"
        );
    }
    assert_eq!(strong["code"].schema_validity_rate, Some(1.0), "{scores:?}");
    assert_eq!(weak["code"].schema_validity_rate, Some(0.0), "{scores:?}");
    assert!(
        strong["chat"].refusal_rate > 0.0,
        "the refusal items are refused: {scores:?}"
    );
    assert_eq!(weak["chat"].refusal_rate, 0.0, "{scores:?}");

    // The scores loaded into the routes' quality: the floor excludes the weak route.
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), serde_json::to_vec(&scores).expect("json")).expect("write");
    let text = config(&format!(
        "quality_floor = 0.5\n[eval]\nscores_file = {:?}\n",
        file.path().display().to_string()
    ));
    let config = load_str(&text).expect("config with scores");
    let now = tokio::time::Instant::now();
    let health = tailcut::health::Health::new(&config, now);
    let req = tailcut::eval::request(&items[0], "chat");
    let plan = tailcut::router::plan(&config, &health, &req, &RequestCtx::new(Dialect::Native), now)
        .expect("the strong route is eligible");
    let served: Vec<&str> = plan.candidates.iter().map(|c| c.route.as_str()).collect();
    assert_eq!(served, ["strong"], "{plan:?}");
    let excluded = plan
        .excluded
        .iter()
        .find(|e| e.route == "weak")
        .expect("weak is excluded");
    assert!(
        excluded
            .reason
            .contains("quality 0 for task chat is below the floor 0.5"),
        "the reason the decision record logs: {excluded:?}"
    );
    let record = serde_json::to_string(&plan).expect("plan json");
    assert!(record.contains("below the floor"), "{record}");
}
