//! `tailcut-bench hedge`: the same workload with hedging off and on, in one run, over two
//! simulated routes (`spiky` by default: lognormal TTFT median 550 ms, sigma 0.65, plus 2% stalls
//! of 3-12 s). Prints TTFT percentiles for both, the extra upstream requests, and the loser
//! cancel latency measured by the simulated upstream (winner's first token -> loser's close);
//! writes the figures as JSON and the two TTFT CCDFs (log y axis) as an SVG.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use tailcut::config;
use tailcut::server;
use tailcut::sim::SimRecord;

#[derive(Debug, Clone, clap::Args)]
pub struct HedgeArgs {
    /// Requests per run (each run: hedging off, then on).
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// The simulated scenario both routes use (e.g. spiky, correlated-brownout).
    #[arg(long, default_value = "spiky")]
    pub scenario: String,
    /// The TTFT percentile that sets the hedge delay.
    #[arg(long, default_value_t = 0.95)]
    pub percentile: f64,
    /// Hedges allowed as a share of requests.
    #[arg(long, default_value_t = 0.1)]
    pub budget_ratio: f64,
    /// Where the JSON figures and the SVG plot go.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct RunFigures {
    pub hedging: bool,
    pub requests: usize,
    pub errors: usize,
    pub ttft_ms: Percentiles,
    pub upstream_requests: usize,
    pub extra_upstream_pct: f64,
    pub hedges: usize,
    pub loser_cancel_ms: Option<Percentiles>,
    #[serde(skip)]
    pub ttft_sorted: Vec<f64>,
}

#[derive(Debug, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    fn of(sorted: &[f64]) -> Option<Self> {
        if sorted.is_empty() {
            return None;
        }
        let at = |q: f64| sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1];
        Some(Percentiles {
            p50: at(0.5),
            p95: at(0.95),
            p99: at(0.99),
            p999: at(0.999),
            max: at(1.0),
        })
    }
}

pub async fn hedge(args: HedgeArgs) -> Result<(), String> {
    if args.requests == 0 || args.concurrency == 0 {
        return Err("--requests and --concurrency must be positive".into());
    }
    let off = run(&args, false).await?;
    let on = run(&args, true).await?;
    print_table(&args, &off, &on);
    std::fs::create_dir_all(&args.out).map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let json = serde_json::json!({
        "scenario": args.scenario,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "percentile": args.percentile,
        "budget_ratio": args.budget_ratio,
        "off": off,
        "on": on,
        "p99_ratio": off.ttft_ms.p99 / on.ttft_ms.p99.max(f64::EPSILON),
        "p999_ratio": off.ttft_ms.p999 / on.ttft_ms.p999.max(f64::EPSILON),
    });
    let json_path = args.out.join(format!("hedge-{}.json", args.scenario));
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&json_path, text).map_err(|e| format!("cannot write {}: {e}", json_path.display()))?;
    let svg_path = args.out.join(format!("hedge-{}-ttft-ccdf.svg", args.scenario));
    crate::plot::ttft_ccdf(&svg_path, &args.scenario, &off.ttft_sorted, &on.ttft_sorted)?;
    println!("wrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}

fn config_text(args: &HedgeArgs, hedging: bool) -> String {
    let (scenario, percentile, ratio) = (&args.scenario, args.percentile, args.budget_ratio);
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
max_streams = 100000
[sim]
listen = "127.0.0.1:0"
[hedge]
enabled = {hedging}
percentile = {percentile}
budget_ratio = {ratio}
[[routes]]
name = "primary"
provider = "simulated"
scenario = "{scenario}"
[[routes]]
name = "secondary"
provider = "simulated"
scenario = "{scenario}"
[models.chat]
routes = ["primary", "secondary"]
"#
    )
}

async fn run(args: &HedgeArgs, hedging: bool) -> Result<RunFigures, String> {
    let config = config::load_str(&config_text(args, hedging)).map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let running = server::start(config, listener).await.map_err(|e| e.to_string())?;
    let url = running.url("/v1/chat/completions");
    let client = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(args.concurrency)
        .build()
        .map_err(|e| e.to_string())?;
    let gate = Arc::new(Semaphore::new(args.concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    let label = if hedging { "on" } else { "off" };
    eprintln!(
        "hedging {label}: {} requests, concurrency {}",
        args.requests, args.concurrency
    );
    for i in 0..args.requests {
        let permit = Arc::clone(&gate).acquire_owned().await.map_err(|e| e.to_string())?;
        let (client, url) = (client.clone(), url.clone());
        tasks.spawn(async move {
            let result = one_request(&client, &url, &format!("bench-{label}-{i}")).await;
            drop(permit);
            result
        });
    }
    let mut ttft = Vec::with_capacity(args.requests);
    let mut errors = 0;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Some(ms)) => ttft.push(ms),
            _ => errors += 1,
        }
    }
    ttft.sort_by(f64::total_cmp);
    // Let the simulated upstream see the last cancellations before reading its log.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = running.sim.as_ref().map(|s| s.log()).unwrap_or_default();
    running.shutdown().await;
    let (hedges, mut cancel) = loser_cancel_latencies(&log);
    cancel.sort_by(f64::total_cmp);
    Ok(RunFigures {
        hedging,
        requests: args.requests,
        errors,
        ttft_ms: Percentiles::of(&ttft).ok_or("no request succeeded")?,
        upstream_requests: log.len(),
        extra_upstream_pct: (log.len() as f64 - args.requests as f64) / args.requests as f64 * 100.0,
        hedges,
        loser_cancel_ms: Percentiles::of(&cancel),
        ttft_sorted: ttft,
    })
}

/// Time to the first content chunk at the client, in ms; `None` on any failure.
async fn one_request(client: &reqwest::Client, url: &str, id: &str) -> Option<f64> {
    let body = serde_json::json!({
        "model": "chat", "stream": true,
        "messages": [{"role": "user", "content": "Tell me something."}],
    });
    let start = Instant::now();
    let resp = client
        .post(url)
        .header("x-request-id", id)
        .json(&body)
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let mut stream = resp.bytes_stream();
    let mut ttft = None;
    let mut complete = false;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.ok()?;
        let text = String::from_utf8_lossy(&chunk);
        if ttft.is_none() && text.contains("\"content\":\"") && !text.contains("\"content\":\"\"") {
            ttft = Some(start.elapsed().as_secs_f64() * 1000.0);
        }
        complete |= text.contains("[DONE]");
    }
    ttft.filter(|_| complete)
}

/// Pairs each hedged request's attempts (same request id before the attempt suffix) and
/// measures, on the simulated upstream's clock, the winner's first token to the loser's close.
fn loser_cancel_latencies(log: &[SimRecord]) -> (usize, Vec<f64>) {
    let mut by_request: HashMap<&str, Vec<&SimRecord>> = HashMap::new();
    for r in log {
        let Some(id) = r.request_id.as_deref() else { continue };
        let key = id.rsplit_once('-').map_or(id, |(head, _)| head);
        by_request.entry(key).or_default().push(r);
    }
    let mut hedges = 0;
    let mut out = Vec::new();
    for attempts in by_request.values().filter(|a| a.len() > 1) {
        hedges += 1;
        let Some(first) = attempts.iter().filter_map(|r| r.first_token_at).min() else {
            continue;
        };
        for loser in attempts.iter().filter(|r| r.first_token_at.is_none()) {
            if let Some(closed) = loser.ended_at {
                out.push(closed.saturating_duration_since(first).as_secs_f64() * 1000.0);
            }
        }
    }
    (hedges, out)
}

fn print_table(args: &HedgeArgs, off: &RunFigures, on: &RunFigures) {
    println!(
        "\nhedge benchmark: scenario {}, {} requests per run, concurrency {}, hedge at p{} TTFT, budget {}%",
        args.scenario,
        args.requests,
        args.concurrency,
        args.percentile * 100.0,
        args.budget_ratio * 100.0
    );
    println!(
        "{:<12}{:>10}{:>10}{:>10}{:>10}{:>10}{:>12}{:>8}",
        "hedging", "p50 ms", "p95 ms", "p99 ms", "p99.9 ms", "max ms", "extra req %", "errors"
    );
    for f in [off, on] {
        let t = &f.ttft_ms;
        println!(
            "{:<12}{:>10.0}{:>10.0}{:>10.0}{:>10.0}{:>10.0}{:>12.2}{:>8}",
            if f.hedging { "on" } else { "off" },
            t.p50,
            t.p95,
            t.p99,
            t.p999,
            t.max,
            f.extra_upstream_pct,
            f.errors
        );
    }
    println!(
        "p99 cut {:.2}x, p99.9 cut {:.2}x; hedges {}",
        off.ttft_ms.p99 / on.ttft_ms.p99.max(f64::EPSILON),
        off.ttft_ms.p999 / on.ttft_ms.p999.max(f64::EPSILON),
        on.hedges
    );
    match &on.loser_cancel_ms {
        Some(c) => println!(
            "loser cancel (winner first token -> loser closed, upstream clock): p50 {:.3} ms, p99 {:.3} ms",
            c.p50, c.p99
        ),
        None => println!("loser cancel: no hedge had a loser"),
    }
}
