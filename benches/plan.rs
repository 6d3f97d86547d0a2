//! Micro-benchmark of the request path's planning: measure the prompt, copy the model's route
//! health (one view per route) and plan over the copies, for a model of 5, 50 and 500 routes
//! with warm latency windows (what `Gateway::chat` does before the mux starts).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tailcut::config::{load_str, Config};
use tailcut::health::Health;
use tailcut::router::{count_prompt, model_routes, plan_over, Requirements, Snapshot};
use tailcut::types::{ChatRequest, Dialect, Message, RequestCtx, Role};
use tokio::time::Instant;

fn config(routes: usize) -> Config {
    let mut text = String::from("[hedge]\nenabled = true\n");
    for i in 0..routes {
        let level = ["L0", "L1", "L2"][i % 3];
        let region = ["eu", "us"][i % 2];
        text += &format!(
            "[[routes]]\nname = \"route-{i}\"\nprovider = \"simulated\"\nlevel = \"{level}\"\nregion = \"{region}\"\n\
             cost_per_1k = 0.00{}\nquality = {{ chat = 0.9 }}\n",
            i % 9 + 1
        );
    }
    let names: Vec<String> = (0..routes).map(|i| format!("\"route-{i}\"")).collect();
    text += &format!("[models.chat]\nroutes = [{}]\n", names.join(", "));
    match load_str(&text) {
        Ok(c) => c,
        Err(e) => panic!("the benchmark's config must validate: {e}"),
    }
}

fn planning(c: &mut Criterion) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    };
    let _entered = runtime.enter();
    let req = ChatRequest {
        model: "chat".into(),
        messages: vec![
            Message::text(Role::System, "Answer briefly."),
            Message::text(Role::User, "What is the tail latency of a hedged request?"),
        ],
        ..ChatRequest::default()
    };
    let needs = Requirements::from_ctx(&RequestCtx::new(Dialect::OpenAi));
    let mut group = c.benchmark_group("plan");
    for routes in [5, 50, 500] {
        let cfg = config(routes);
        let now = Instant::now();
        let health = Health::new(&cfg, now);
        // Warm windows: every route has first tokens and outcomes to rank on.
        for (i, name) in model_routes(&cfg, &req).iter().enumerate() {
            for k in 0..50u64 {
                health.record_ttft(
                    name,
                    now,
                    std::time::Duration::from_millis(100 + (i as u64 * 7 + k) % 400),
                );
            }
        }
        group.bench_with_input(BenchmarkId::new("views_and_plan", routes), &routes, |b, _| {
            b.iter(|| {
                let prompt = count_prompt(&cfg, &req);
                let names = model_routes(&cfg, &req);
                let views = health.views(names.iter().map(String::as_str), now);
                let snapshot = Snapshot {
                    config: &cfg,
                    health: &views,
                    lease: None,
                    now,
                };
                black_box(plan_over(&snapshot, black_box(&req), &needs, &prompt).is_ok())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, planning);
criterion_main!(benches);
