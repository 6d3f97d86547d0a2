//! The registry of resumable streams: each answer runs in its own task into a replay buffer,
//! is found by id, read by whoever holds its token, and forgotten a while after it ends.
//!
//! - `run`: the task that drives one answer (detached cancel, cut, expiry).
//! - `http`: `POST /v1/streams`, `GET /v1/streams/{id}/events`, `DELETE /v1/streams/{id}`.
//! - `remote`: the same reads and cancels for a stream another instance runs, through Redis
//!   (`[state] redis_url`; `shared::replay`).
//!
//! The WebSocket registers its requests here too, so any stream can be read over either.

mod http;
pub mod remote;
mod run;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use parking_lot::Mutex;
use rand::RngCore;
use subtle::ConstantTimeEq;
use tokio::sync::watch;

pub use http::{delete_stream, gap_error, open_stream, read_events};

use super::native::ServerMessage;
use super::replay::{Reader, Replay};
use crate::config::{StateConfig, StreamsConfig};
use crate::shared::replay::{Mirror, Owner, SharedReplay};
use crate::shared::Shared;
use crate::types::EventStream;

/// Why a running stream was stopped from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// Its owner cancelled it (`DELETE`, or a WebSocket `cancel`).
    Cancelled,
    /// The server is shutting down; the message says so.
    Draining(String),
}

/// One resumable stream as the registry holds it.
pub struct Stream {
    pub id: String,
    token: String,
    /// The gateway request id: the `id` inside every event's JSON.
    pub request_id: String,
    pub replay: Arc<Replay>,
    /// Readers attached now; the run cancels a stream left without one.
    readers: watch::Sender<usize>,
    stop: watch::Sender<Option<Stop>>,
    /// Its copy in Redis, when state is shared.
    mirror: Option<Mirror>,
    /// A reader on another instance counts as one attached reader here.
    remote_reader: AtomicBool,
}

impl Stream {
    /// Constant-time comparison with the stream's token.
    pub fn token_matches(&self, given: &str) -> bool {
        given.len() == self.token.len() && bool::from(given.as_bytes().ct_eq(self.token.as_bytes()))
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// Attaches a reader of every event after `after`; it counts as attached until dropped.
    pub fn attach(self: &Arc<Self>, after: u64) -> Attached {
        self.readers.send_modify(|n| *n += 1);
        Attached {
            reader: self.replay.reader(after),
            stream: Arc::clone(self),
        }
    }

    /// Appends an event to the replay buffer and queues it for the shared copy.
    fn record(&self, message: ServerMessage) {
        if let Some((seq, event)) = self.replay.push_event(message) {
            if let Some(mirror) = &self.mirror {
                mirror.event(seq, event.name, event.terminal, &event.json);
            }
        }
    }

    /// Asks the run to stop (no effect once the stream ended).
    pub fn stop(&self, why: Stop) {
        self.stop.send_if_modified(|s| {
            if s.is_none() && !self.replay.finished() {
                *s = Some(why);
                true
            } else {
                false
            }
        });
    }
}

impl Owner for Stream {
    fn cancel(&self) {
        self.stop(Stop::Cancelled);
    }

    fn remote_reader(&self, present: bool) {
        if self.remote_reader.swap(present, Ordering::Relaxed) != present {
            self.readers.send_modify(|n| {
                *n = if present { *n + 1 } else { n.saturating_sub(1) };
            });
        }
    }

    fn finished_at(&self) -> Option<u64> {
        let (last, finished) = self.replay.last();
        finished.then_some(last)
    }
}

/// A reader that keeps its stream from counting as detached while it lives.
pub struct Attached {
    pub reader: Reader,
    pub stream: Arc<Stream>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.stream.readers.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Why a stream cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No such stream was ever here (or it was forgotten long ago).
    NotFound,
    /// It existed and expired.
    Gone,
    /// The token is missing or not this stream's.
    Forbidden,
}

/// The registry is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

struct Table {
    live: HashMap<String, Arc<Stream>>,
    /// Finished streams still held, oldest first: the first to go when room is needed.
    finished: VecDeque<String>,
    /// Ids that expired, newest last, so a late reader gets 410 rather than 404. Bounded by
    /// `max_open`; an id pushed out of it reads as unknown.
    gone: VecDeque<String>,
    gone_set: HashSet<String>,
    /// `max_open`.
    gone_cap: usize,
}

pub struct Registry {
    config: StreamsConfig,
    table: Mutex<Table>,
    /// `[state] redis_url`: streams are also written to Redis, and read from it when another
    /// instance runs them.
    shared: OnceLock<Arc<SharedReplay>>,
}

impl Registry {
    pub fn new(config: StreamsConfig) -> Registry {
        let gone_cap = config.max_open;
        Registry {
            config,
            table: Mutex::new(Table {
                live: HashMap::new(),
                gone: VecDeque::new(),
                gone_set: HashSet::new(),
                finished: VecDeque::new(),
                gone_cap,
            }),
            shared: OnceLock::new(),
        }
    }

    /// Shares streams through Redis from now on (set once, at start; inside a runtime).
    pub fn share(&self, shared: Arc<Shared>, state: &StateConfig) {
        let replay = SharedReplay::start(shared, state, self.config.max_events, self.config.keep_after_done);
        let _ = self.shared.set(replay);
    }

    /// The shared copy of every stream, when state is shared.
    pub fn remote(&self) -> Option<&Arc<SharedReplay>> {
        self.shared.get()
    }

    pub fn config(&self) -> &StreamsConfig {
        &self.config
    }

    /// Streams held now (running or finished and kept).
    pub fn len(&self) -> usize {
        self.table.lock().live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every place is taken by a running stream. (Finished ones make room: the oldest is
    /// expired early when a new stream needs its place.)
    pub fn is_full(&self) -> bool {
        let table = self.table.lock();
        table.live.len() >= self.config.max_open && table.finished.is_empty()
    }

    /// Registers an answer and spawns the task that drives it into the replay buffer. The
    /// task holds `permit` (a slot at the stream gate) until the answer ends or is stopped.
    pub fn open(
        self: &Arc<Self>,
        events: EventStream,
        request_id: String,
        permit: impl Send + 'static,
    ) -> Result<Arc<Stream>, Full> {
        let stream = {
            let mut table = self.table.lock();
            while table.live.len() >= self.config.max_open {
                let Some(oldest) = table.finished.pop_front() else {
                    return Err(Full);
                };
                table.forget(&oldest);
            }
            let id = format!("st_{}", random_b64::<16>());
            let token = random_b64::<24>();
            let stream = Arc::new_cyclic(|me: &Weak<Stream>| {
                let owner: Weak<dyn Owner> = me.clone();
                let mirror = self.shared.get().map(|s| s.open(&id, &token, &request_id, owner));
                Stream {
                    id: id.clone(),
                    token,
                    request_id,
                    replay: Arc::new(Replay::new(self.config.max_events, self.config.max_bytes)),
                    readers: watch::Sender::new(0),
                    stop: watch::Sender::new(None),
                    mirror,
                    remote_reader: AtomicBool::new(false),
                }
            });
            table.live.insert(id, Arc::clone(&stream));
            stream
        };
        tokio::spawn(run::run(Arc::clone(self), Arc::clone(&stream), events, permit));
        Ok(stream)
    }

    /// The stream `id`, if `token` is its token.
    pub fn find(&self, id: &str, token: Option<&str>) -> Result<Arc<Stream>, Refused> {
        let table = self.table.lock();
        let Some(stream) = table.live.get(id) else {
            return Err(if table.gone_set.contains(id) {
                Refused::Gone
            } else {
                Refused::NotFound
            });
        };
        match token {
            Some(t) if stream.token_matches(t) => Ok(Arc::clone(stream)),
            _ => Err(Refused::Forbidden),
        }
    }

    /// Streams whose answer is still running (the drain waits for them: a WebSocket's
    /// requests and a resumable stream with no reader are no connection of hyper's).
    pub fn running(&self) -> usize {
        self.table.lock().live.values().filter(|s| !s.replay.finished()).count()
    }

    /// Ends every running stream with an `error` event of code `draining` that names the
    /// stream (so its client knows it may ask again); returns how many were cut. For the
    /// shutdown path, at the end of `[server] drain_ms`.
    pub fn cut_all(&self, reason: &str) -> usize {
        let streams: Vec<Arc<Stream>> = self.table.lock().live.values().cloned().collect();
        let mut cut = 0;
        for stream in streams {
            if !stream.replay.finished() {
                stream.stop(Stop::Draining(reason.to_string()));
                cut += 1;
            }
        }
        cut
    }

    /// The stream's answer ended: it is kept, and may now give its place to a new one.
    fn finished(&self, id: &str) {
        self.table.lock().finished.push_back(id.to_string());
    }

    /// Forgets a finished stream; later reads get `Gone`.
    fn expire(&self, id: &str) {
        let mut table = self.table.lock();
        table.forget(id);
        // Streams expire in the order they finished, so the ids at the front are this one
        // (or ones already evicted): the queue stays as long as the table.
        while table.finished.front().is_some_and(|f| !table.live.contains_key(f)) {
            table.finished.pop_front();
        }
    }
}

impl Table {
    fn forget(&mut self, id: &str) {
        if self.live.remove(id).is_none() {
            return;
        }
        self.gone.push_back(id.to_string());
        self.gone_set.insert(id.to_string());
        while self.gone.len() > self.gone_cap {
            if let Some(old) = self.gone.pop_front() {
                self.gone_set.remove(&old);
            }
        }
    }
}

/// `N` random bytes from the OS-seeded CSPRNG, base64url without padding.
fn random_b64<const N: usize>() -> String {
    let mut bytes = [0u8; N];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

#[cfg(test)]
mod tests;
