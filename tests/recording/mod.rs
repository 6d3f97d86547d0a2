//! A recording front for the simulated upstream: routes point at it, it keeps every request
//! body each route was sent and forwards it to the simulator under a scripted scenario per
//! request (call n gets scenario n, the last repeats), streaming the answer back as is.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use parking_lot::Mutex;
use serde_json::Value;
use tailcut::sim::{Scenario, SimHandle};

pub struct Recording {
    pub sim: SimHandle,
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    sim: SocketAddr,
    /// Route -> the scenario of each call, in order (the last repeats).
    scripts: HashMap<String, Vec<String>>,
    /// Route -> the request bodies it was sent, in order.
    seen: Mutex<HashMap<String, Vec<Value>>>,
    client: reqwest::Client,
}

/// The front's own client to the simulator: plain HTTP on loopback, but reqwest wants a TLS
/// provider chosen before it builds.
fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .build()
        .expect("client")
}

impl Recording {
    /// Starts the simulator with `scenarios` (JSON, as `[sim.scenarios.*]` takes them) and the
    /// front with one script per route.
    pub async fn start(scenarios: Value, scripts: &[(&str, &[&str])]) -> Recording {
        let scenarios: BTreeMap<String, Scenario> =
            serde_json::from_value(scenarios).unwrap_or_else(|e| panic!("scenarios: {e}"));
        let sim = SimHandle::start(SocketAddr::from(([127, 0, 0, 1], 0)), scenarios)
            .await
            .expect("simulator starts");
        let shared = Arc::new(Shared {
            sim: sim.addr(),
            scripts: scripts
                .iter()
                .map(|(r, s)| (r.to_string(), s.iter().map(|x| x.to_string()).collect()))
                .collect(),
            seen: Mutex::default(),
            client: client(),
        });
        let app = axum::Router::new()
            .route("/r/{route}/{*rest}", axum::routing::post(forward))
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Recording { sim, addr, shared }
    }

    /// The base URL for `route` on the `openai` or `anthropic` wire.
    pub fn base_url(&self, route: &str, wire: &str) -> String {
        match wire {
            "openai" => format!("http://{}/r/{route}/v1", self.addr),
            _ => format!("http://{}/r/{route}", self.addr),
        }
    }

    /// Every request body `route` was sent, in order.
    pub fn seen(&self, route: &str) -> Vec<Value> {
        self.shared.seen.lock().get(route).cloned().unwrap_or_default()
    }
}

async fn forward(
    State(shared): State<Arc<Shared>>,
    Path((route, rest)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let n = {
        let mut seen = shared.seen.lock();
        let list = seen.entry(route.clone()).or_default();
        list.push(serde_json::from_slice(&body).unwrap_or(Value::Null));
        list.len() - 1
    };
    let script = shared.scripts.get(&route).cloned().unwrap_or_default();
    let Some(scenario) = script.get(n).or(script.last()) else {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Body::from("no script for this route"))
            .unwrap_or_default();
    };
    let url = format!("http://{}/s/{scenario}/{rest}", shared.sim);
    let mut req = shared.client.post(url).body(body);
    for (name, value) in &headers {
        if name != "host" && name != "content-length" {
            req = req.header(name, value);
        }
    }
    let upstream = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            return Response::builder()
                .status(StatusCode::BAD_GATEWAY)
                .body(Body::from(e.to_string()))
                .unwrap_or_default()
        }
    };
    let mut out = Response::builder().status(upstream.status().as_u16());
    for (name, value) in upstream.headers() {
        if name != "content-length" && name != "transfer-encoding" {
            out = out.header(name, value);
        }
    }
    out.body(Body::from_stream(upstream.bytes_stream())).unwrap_or_default()
}
