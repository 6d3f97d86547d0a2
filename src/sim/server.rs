//! The simulator's HTTP server: the axum routes, the scenario registry, and `SimHandle`, the
//! in-process control surface (start, base URLs, log, shutdown).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::cache::PromptCache;
use super::plan::Wire;
use super::profiles::{profile, profile_names};
use super::record::{SimClock, SimLog, SimRecord};
use super::respond::respond;
use super::scenario::Scenario;

/// Shared by every request of one simulator.
pub(crate) struct SimState {
    scenarios: Mutex<BTreeMap<String, Slot>>,
    pub log: Arc<SimLog>,
    /// Anthropic prompt-cache prefixes seen recently (`cache.rs`).
    pub cache: PromptCache,
}

struct Slot {
    scenario: Arc<Scenario>,
    /// Requests served so far; the next request's number.
    served: u64,
}

impl SimState {
    fn new(scenarios: BTreeMap<String, Scenario>) -> Self {
        let slots = scenarios.into_iter().map(|(name, s)| (name, Slot::new(s))).collect();
        SimState {
            scenarios: Mutex::new(slots),
            log: Arc::new(SimLog::new(SimClock::start())),
            cache: PromptCache::default(),
        }
    }

    /// The scenario of that name (a registered one, else a built-in profile) and the
    /// request's number within it, counting from 0.
    pub fn next_request(&self, name: &str) -> Option<(Arc<Scenario>, u64)> {
        let mut scenarios = self.scenarios.lock();
        if !scenarios.contains_key(name) {
            scenarios.insert(name.to_owned(), Slot::new(profile(name)?));
        }
        let slot = scenarios.get_mut(name)?;
        let number = slot.served;
        slot.served += 1;
        Some((slot.scenario.clone(), number))
    }

    fn register(&self, name: &str, scenario: Scenario) {
        self.scenarios.lock().insert(name.to_owned(), Slot::new(scenario));
    }

    fn names(&self) -> Vec<String> {
        let scenarios = self.scenarios.lock();
        let mut names: Vec<String> = scenarios.keys().cloned().collect();
        names.extend(
            profile_names()
                .iter()
                .filter(|p| !scenarios.contains_key(**p))
                .map(|p| (*p).to_owned()),
        );
        names.sort();
        names
    }
}

impl Slot {
    fn new(scenario: Scenario) -> Self {
        Slot {
            scenario: Arc::new(scenario),
            served: 0,
        }
    }
}

/// A running simulator. Cheap to clone; every clone controls the same server, which runs
/// until `shutdown` (dropping handles does not stop it).
#[derive(Clone)]
pub struct SimHandle {
    addr: SocketAddr,
    state: Arc<SimState>,
    stop: Arc<watch::Sender<bool>>,
}

impl std::fmt::Debug for SimHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHandle").field("addr", &self.addr).finish()
    }
}

impl SimHandle {
    /// Binds `listen` (use 127.0.0.1:0 for any port), spawns the server task, returns at once.
    pub async fn start(listen: SocketAddr, scenarios: BTreeMap<String, Scenario>) -> std::io::Result<SimHandle> {
        use axum::serve::ListenerExt;

        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "sim: TCP_NODELAY not set");
            }
        });
        let state = Arc::new(SimState::new(scenarios));
        let (stop, _) = watch::channel(false);
        let stop = Arc::new(stop);
        let app = router(state.clone());
        let task_stop = stop.clone();
        tokio::spawn(async move {
            let mut stopped = task_stop.subscribe();
            // Graceful: accepting stops, idle keep-alive connections close, and responses in
            // flight finish on their own connection tasks.
            let signal = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(signal).await {
                tracing::warn!(error = %e, "sim: server ended");
            }
            drop(task_stop);
        });
        Ok(SimHandle { addr, state, stop })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/s/{scenario}/v1`, the base URL an OpenAI client appends
    /// `/chat/completions` to.
    pub fn openai_base_url(&self, scenario: &str) -> String {
        format!("http://{}/s/{}/v1", self.addr, scenario)
    }

    /// `http://ADDR/s/{scenario}`, the base URL an Anthropic client appends `/v1/messages` to.
    pub fn anthropic_base_url(&self, scenario: &str) -> String {
        format!("http://{}/s/{}", self.addr, scenario)
    }

    /// Adds or replaces a scenario; its request count starts again from 0.
    pub fn register(&self, name: &str, scenario: Scenario) {
        self.state.register(name, scenario);
    }

    /// Every kept record, in arrival order.
    pub fn log(&self) -> Vec<SimRecord> {
        self.state.log.snapshot()
    }

    pub fn clear_log(&self) {
        self.state.log.clear();
    }

    /// Stops accepting connections and ends the server task.
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }
}

/// `tailcut sim`: runs the simulator until ctrl-c, printing where it listens.
pub async fn serve_standalone(listen: SocketAddr, scenarios: BTreeMap<String, Scenario>) -> std::io::Result<()> {
    let handle = SimHandle::start(listen, scenarios).await?;
    println!("tailcut sim listening on http://{}", handle.addr());
    for name in handle.state.names() {
        println!(
            "  {name:<24} openai: {}  anthropic: {}",
            handle.openai_base_url(&name),
            handle.anthropic_base_url(&name)
        );
    }
    println!("  log: http://{}/_sim/log", handle.addr());
    tokio::signal::ctrl_c().await?;
    handle.shutdown();
    Ok(())
}

fn router(state: Arc<SimState>) -> Router {
    Router::new()
        .route("/s/{scenario}/v1/chat/completions", post(openai_chat))
        .route("/s/{scenario}/v1/messages", post(anthropic_messages))
        .route("/_sim/log", get(get_log).delete(delete_log))
        .route("/_sim/scenarios", get(get_scenarios))
        .route("/_sim/scenarios/{name}", put(put_scenario))
        .with_state(state)
}

async fn openai_chat(
    State(state): State<Arc<SimState>>,
    Path(scenario): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    respond(state, Wire::OpenAi, scenario, &headers, &body).await
}

async fn anthropic_messages(
    State(state): State<Arc<SimState>>,
    Path(scenario): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    respond(state, Wire::Anthropic, scenario, &headers, &body).await
}

async fn get_log(State(state): State<Arc<SimState>>) -> Json<Vec<SimRecord>> {
    Json(state.log.snapshot())
}

async fn delete_log(State(state): State<Arc<SimState>>) -> StatusCode {
    state.log.clear();
    StatusCode::NO_CONTENT
}

async fn get_scenarios(State(state): State<Arc<SimState>>) -> Json<Vec<String>> {
    Json(state.names())
}

async fn put_scenario(State(state): State<Arc<SimState>>, Path(name): Path<String>, body: Bytes) -> Response {
    match serde_json::from_slice::<Scenario>(&body) {
        Ok(scenario) => {
            state.register(&name, scenario);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => {
            let mut response = (
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": {"message": format!("invalid scenario: {e}")}}).to_string(),
            )
                .into_response();
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
    }
}
