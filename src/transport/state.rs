//! `AppState`: what every handler shares (the gateway, the config, the stream gate, the
//! client keys and their limits, the metrics handle, the drain signal). The server builds
//! it; the transports read it.

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Config;
use crate::gateway::Gateway;
use crate::shared::Shared;
use crate::transport::auth::Access;
use crate::transport::drain::Drain;
use crate::transport::pump::Watch;
use crate::transport::streams::Registry;
use crate::types::Priority;

/// Shared state every handler gets.
#[derive(Clone)]
pub struct AppState {
    pub gateway: Arc<Gateway>,
    pub config: Arc<Config>,
    /// The stream gate's total (`max_streams`): one permit per open chat stream, none left →
    /// 503. The WebSocket session takes its permits here directly.
    pub streams: Arc<Semaphore>,
    /// `max_streams` with batch's share capped (`batch_max_share`); the HTTP chat endpoints
    /// enter here.
    pub gate: StreamGate,
    /// `[auth]`: the client keys, their live limits, the token signer.
    pub access: Arc<Access>,
    pub metrics: Option<PrometheusHandle>,
    /// Shutdown: begun (`/readyz` 503, new chats refused) and cut (streams end in-band).
    pub drain: Drain,
    /// The chat streams' watchdog (`transport::pump`): `max_stream_ms`, the stall, the cut.
    pub pumps: Arc<Watch>,
    /// Resumable streams (`POST /v1/streams`, WebSocket requests); `cut_all` at drain's end.
    pub resumable: Arc<Registry>,
    /// `[state] redis_url`: state shared with other instances, or `None` (local only).
    pub shared: Option<Arc<Shared>>,
    /// Per client-facing model, its routes' context windows, for WebSocket sessions'
    /// histories: built once, not per socket.
    pub ws_windows: Arc<crate::transport::ws::Windows>,
}

impl AppState {
    pub fn new(gateway: Arc<Gateway>) -> Self {
        let config = Arc::clone(gateway.config());
        let resumable = Arc::new(Registry::new(config.server.streams.clone()));
        let gate = StreamGate::new(config.server.max_streams, config.server.batch_max_share);
        let drain = Drain::default();
        // The validator already parsed the URL, so this only fails on a URL read from
        // `redis_url_env`; then the instance runs on local state and says so.
        let shared = Shared::start(&config.state).unwrap_or_else(|e| {
            tracing::error!(error = %e, "shared state is off: serving with local state");
            None
        });
        // Per-key limits and health hints shared with other instances (`shared::hints`).
        let access = Arc::new(Access::new(&config).with_shared(shared.as_ref()));
        if let Some(shared) = &shared {
            resumable.share(Arc::clone(shared), &config.state);
            crate::shared::hints::spawn(shared, gateway.health(), config.state.hint_poll);
        }
        AppState {
            ws_windows: crate::transport::ws::windows(&config),
            shared,
            streams: Arc::clone(gate.all()),
            gate,
            access,
            gateway,
            config,
            metrics: crate::telemetry::install(),
            pumps: Arc::new(Watch::start(drain.cut_token())),
            drain,
            resumable,
        }
    }
}

/// The stream gate: `max_streams` slots in all, of which batch requests may hold at most
/// `batch_max_share`, so interactive requests always find room while batch fills up.
#[derive(Clone, Debug)]
pub struct StreamGate {
    all: Arc<Semaphore>,
    batch: Arc<Semaphore>,
}

/// One open chat stream's place at the gate; released when dropped.
#[derive(Debug)]
pub struct StreamSlot {
    _all: OwnedSemaphorePermit,
    _batch: Option<OwnedSemaphorePermit>,
}

impl StreamGate {
    /// `max_streams` in all; batch gets `floor(max_streams * share)` of them, at least one
    /// (so a tiny gate still serves batch), never more than all.
    pub fn new(max_streams: usize, batch_share: f64) -> Self {
        let batch = ((max_streams as f64 * batch_share).floor() as usize).clamp(max_streams.min(1), max_streams);
        StreamGate {
            all: Arc::new(Semaphore::new(max_streams)),
            batch: Arc::new(Semaphore::new(batch)),
        }
    }

    /// A slot for a request of `priority`, or `None` when its share (or the whole gate) is full.
    pub fn try_enter(&self, priority: Priority) -> Option<StreamSlot> {
        let batch = match priority {
            Priority::Batch => Some(Arc::clone(&self.batch).try_acquire_owned().ok()?),
            Priority::Interactive => None,
        };
        let all = Arc::clone(&self.all).try_acquire_owned().ok()?;
        Some(StreamSlot {
            _all: all,
            _batch: batch,
        })
    }

    /// The gate's total.
    pub fn all(&self) -> &Arc<Semaphore> {
        &self.all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_holds_at_most_its_share_and_interactive_gets_the_rest() {
        let gate = StreamGate::new(100, 0.8);
        let batch: Vec<StreamSlot> = (0..150).filter_map(|_| gate.try_enter(Priority::Batch)).collect();
        assert_eq!(batch.len(), 80, "batch stops at 80% of max_streams");
        let interactive: Vec<StreamSlot> = (0..150).filter_map(|_| gate.try_enter(Priority::Interactive)).collect();
        assert_eq!(interactive.len(), 20, "interactive gets the remaining 20 slots");
        assert!(gate.try_enter(Priority::Interactive).is_none(), "the gate is full");
        drop(batch);
        assert!(
            gate.try_enter(Priority::Batch).is_some(),
            "batch slots come back when released"
        );
    }

    #[test]
    fn interactive_may_take_the_whole_gate_and_slots_come_back_on_drop() {
        let gate = StreamGate::new(10, 0.5);
        let all: Vec<StreamSlot> = (0..12).filter_map(|_| gate.try_enter(Priority::Interactive)).collect();
        assert_eq!(all.len(), 10, "interactive is limited by max_streams only");
        assert!(gate.try_enter(Priority::Batch).is_none(), "nothing left for batch");
        drop(all);
        let batch: Vec<StreamSlot> = (0..10).filter_map(|_| gate.try_enter(Priority::Batch)).collect();
        assert_eq!(batch.len(), 5, "released slots return, batch capped at half");
    }

    #[test]
    fn a_tiny_gate_still_admits_one_batch_stream() {
        let gate = StreamGate::new(1, 0.8);
        assert!(
            gate.try_enter(Priority::Batch).is_some(),
            "floor(0.8) would starve batch entirely"
        );
    }
}
