//! Resumable streams shared through Redis: the owner writes every event to a Redis Stream
//! under an entry id derived from its seq, plus a small record; any instance looks a stream
//! up and reads it from any `Last-Event-ID`.
//!
//! Keys, for stream `st_x` under `[state] key_prefix`:
//! - `<prefix>:replay:st_x`: the events, entry id `<seq>-0`, fields `n` (type), `d` (the
//!   compact JSON every reader sends) and `t` (present on the terminal event). `MAXLEN ~
//!   max_events`. Because the id *is* the seq, `Last-Event-ID: N` is an exact `XREAD` start
//!   (`N-0`, exclusive): every later event once, in order; a reader that sees a seq jump
//!   reports a gap rather than skipping silently.
//! - `<prefix>:replay:st_x:meta`: a hash: `token` (SHA-256 of the stream token, hex; never the
//!   token), `request` (the request id), `owner` (instance), `state` (`running`/`done`) and
//!   `last` (the terminal seq once done).
//! - `<prefix>:replay:st_x:cancel`: set by a `DELETE` on any instance; the owner polls it.
//! - `<prefix>:replay:st_x:readers`: refreshed by readers on other instances while they
//!   read, so the owner does not cancel the stream as detached.
//!
//! Writes never slow a stream: the owner enqueues each event on one bounded queue per
//! instance (`try_send`; a full queue drops the event from Redis only, which remote readers
//! then see as a gap), and one writer task sends whatever is queued as one pipeline. One
//! poller task per instance checks cancels and remote readers of all running streams, and
//! refreshes their TTLs, in one pipeline a second.
//!
//! - `writer`: the writer and the poller (the owner's side).
//! - `reader`: a reader on an instance that does not hold the stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use redis::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

use super::Shared;
use crate::config::StateConfig;

mod reader;
mod writer;

pub use reader::RemoteReader;

/// Writes queued per instance before new ones are dropped (from Redis only).
const QUEUE: usize = 8192;
/// The most writes sent in one pipeline.
const WRITE_BATCH: usize = 512;
/// How often the owner checks cancels and remote readers, and refreshes running TTLs.
pub const POLL: Duration = Duration::from_secs(1);
/// TTL of a running stream's keys; refreshed every `POLL`, so only a dead owner's keys expire.
const RUNNING_TTL: Duration = Duration::from_secs(30);
/// How long a remote reader counts as attached after its last read round.
const READER_TTL: Duration = Duration::from_secs(5);
/// How long a finished stream's record outlives its events, so a late reader gets 410.
const GONE_KEEP: Duration = Duration::from_secs(600);

/// What the owner's side of a stream must do when another instance asks.
pub trait Owner: Send + Sync + 'static {
    /// A `DELETE` on another instance cancelled the stream.
    fn cancel(&self);
    /// Whether a reader on another instance is attached now (called on changes only).
    fn remote_reader(&self, present: bool);
    /// The terminal seq once the stream finished.
    fn finished_at(&self) -> Option<u64>;
}

/// The shared half of the stream registry: one per instance.
pub struct SharedReplay {
    shared: Arc<Shared>,
    /// For readers' own connections (a blocking `XREAD` must not hold the pooled one).
    client: Option<redis::Client>,
    queue: mpsc::Sender<Write>,
    running: Mutex<HashMap<String, Tracked>>,
    max_events: usize,
    keep_after_done: Duration,
    op_timeout: Duration,
}

struct Tracked {
    owner: Weak<dyn Owner>,
    /// A write for this stream was dropped (queue full), so its terminal may never be written
    /// by the writer: the poller writes the end instead.
    lost: Arc<AtomicBool>,
    remote: bool,
    /// The record's fields, written again by the poller when Redis lost the record (it
    /// restarted empty, or the open's write was dropped): else other instances answer 404
    /// for a stream that runs.
    token_hash: Arc<str>,
    request_id: Arc<str>,
}

enum Write {
    Open {
        id: String,
        token_hash: Arc<str>,
        request_id: Arc<str>,
    },
    Event {
        keys: Arc<Keys>,
        seq: u64,
        name: &'static str,
        terminal: bool,
        json: Bytes,
    },
}

/// One stream's id and keys, formatted once for all its writes.
struct Keys {
    id: String,
    events: String,
    meta: String,
}

/// The owner's handle on one stream's shared copy.
pub struct Mirror {
    keys: Arc<Keys>,
    queue: mpsc::Sender<Write>,
    lost: Arc<AtomicBool>,
}

impl Mirror {
    /// Queues one event for Redis; never waits. A full queue drops it from Redis only.
    pub fn event(&self, seq: u64, name: &'static str, terminal: bool, json: &Bytes) {
        let write = Write::Event {
            keys: Arc::clone(&self.keys),
            seq,
            name,
            terminal,
            json: json.clone(),
        };
        if self.queue.try_send(write).is_err() {
            self.lost.store(true, Ordering::Relaxed);
        }
    }
}

/// A stream's record as another instance finds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub request_id: String,
    token_hash: String,
    /// The terminal seq, once the stream is done.
    pub terminal: Option<u64>,
    /// Seqs of the oldest and newest events held (none when the events expired or were
    /// never written).
    pub first: Option<u64>,
    pub last: Option<u64>,
}

impl Record {
    /// Constant-time check of `token` against the stored hash.
    pub fn token_matches(&self, token: &str) -> bool {
        let given = token_hash(token);
        given.len() == self.token_hash.len() && bool::from(given.as_bytes().ct_eq(self.token_hash.as_bytes()))
    }

    /// The newest seq known: the terminal one, or the newest held.
    pub fn newest(&self) -> u64 {
        self.terminal.max(self.last).unwrap_or(0)
    }
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    Found(Record),
    NotFound,
    /// Redis did not answer: whether the stream exists elsewhere is unknown.
    Unreachable,
}

impl SharedReplay {
    /// Starts the instance's writer and poller. Must run inside a tokio runtime.
    pub fn start(shared: Arc<Shared>, state: &StateConfig, max_events: usize, keep_after_done: Duration) -> Arc<Self> {
        let (queue, rx) = mpsc::channel(QUEUE);
        let client = state.url().and_then(|url| redis::Client::open(url.as_str()).ok());
        let replay = Arc::new(SharedReplay {
            shared,
            client,
            queue,
            running: Mutex::new(HashMap::new()),
            max_events,
            keep_after_done,
            op_timeout: state.op_timeout,
        });
        tokio::spawn(writer::write_loop(
            Arc::downgrade(&replay),
            Arc::clone(&replay.shared),
            rx,
        ));
        tokio::spawn(writer::poll_loop(Arc::downgrade(&replay)));
        replay
    }

    /// Starts sharing a new stream: queues its record and tracks it for the poller.
    pub fn open(&self, id: &str, token: &str, request_id: &str, owner: Weak<dyn Owner>) -> Mirror {
        let lost = Arc::new(AtomicBool::new(false));
        let (hash, request): (Arc<str>, Arc<str>) = (token_hash(token).into(), request_id.into());
        let open = Write::Open {
            id: id.to_string(),
            token_hash: Arc::clone(&hash),
            request_id: Arc::clone(&request),
        };
        if self.queue.try_send(open).is_err() {
            lost.store(true, Ordering::Relaxed);
        }
        self.running.lock().insert(
            id.to_string(),
            Tracked {
                owner,
                lost: Arc::clone(&lost),
                remote: false,
                token_hash: hash,
                request_id: request,
            },
        );
        Mirror {
            keys: Arc::new(Keys {
                id: id.to_string(),
                events: self.key(id),
                meta: self.meta_key(id),
            }),
            queue: self.queue.clone(),
            lost,
        }
    }

    /// Finds stream `id` in Redis: its record and the seqs it holds.
    pub async fn lookup(&self, id: &str) -> Lookup {
        let (key, meta) = (self.key(id), self.meta_key(id));
        let found = self
            .shared
            .run("replay_lookup", |mut c| async move {
                let mut pipe = redis::pipe();
                pipe.hgetall(&meta)
                    .cmd("XRANGE")
                    .arg(&key)
                    .arg("-")
                    .arg("+")
                    .arg("COUNT")
                    .arg(1)
                    .cmd("XREVRANGE")
                    .arg(&key)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1);
                pipe.query_async::<(HashMap<String, String>, Value, Value)>(&mut c)
                    .await
            })
            .await;
        let Some((fields, first, last)) = found else {
            return Lookup::Unreachable;
        };
        let (Some(token_hash), Some(request_id)) = (fields.get("token"), fields.get("request")) else {
            return Lookup::NotFound;
        };
        let terminal = match fields.get("state").map(String::as_str) {
            Some("done") => fields.get("last").and_then(|l| l.parse().ok()),
            _ => None,
        };
        Lookup::Found(Record {
            request_id: request_id.clone(),
            token_hash: token_hash.clone(),
            terminal,
            first: first_entry_seq(&first),
            last: first_entry_seq(&last),
        })
    }

    /// Asks the owner (wherever it runs) to cancel stream `id`; false when Redis did not answer.
    pub async fn cancel(&self, id: &str) -> bool {
        let key = self.cancel_key(id);
        let ttl = ms(RUNNING_TTL);
        self.shared
            .run("replay_cancel", |mut c| async move {
                redis::cmd("SET")
                    .arg(&key)
                    .arg(1)
                    .arg("PX")
                    .arg(ttl)
                    .query_async::<()>(&mut c)
                    .await
            })
            .await
            .is_some()
    }

    /// A reader of stream `id` from after seq `after`, on its own connection.
    pub fn reader(&self, id: &str, after: u64) -> RemoteReader {
        RemoteReader::new(self, id, after)
    }

    fn key(&self, id: &str) -> String {
        self.shared.key(&format!("replay:{id}"))
    }

    fn meta_key(&self, id: &str) -> String {
        self.shared.key(&format!("replay:{id}:meta"))
    }

    fn cancel_key(&self, id: &str) -> String {
        self.shared.key(&format!("replay:{id}:cancel"))
    }

    fn readers_key(&self, id: &str) -> String {
        self.shared.key(&format!("replay:{id}:readers"))
    }
}

/// SHA-256 of a stream token, hex: what the shared record keeps instead of the token.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The seq of the first entry of an `XRANGE` reply (`[[id, fields], ...]`).
fn first_entry_seq(reply: &Value) -> Option<u64> {
    let Value::Array(entries) = reply else { return None };
    let Value::Array(entry) = entries.first()? else {
        return None;
    };
    match entry.first()? {
        Value::BulkString(id) => entry_seq(&String::from_utf8_lossy(id)),
        Value::SimpleString(id) => entry_seq(id),
        _ => None,
    }
}

/// `<seq>-0` → seq.
fn entry_seq(id: &str) -> Option<u64> {
    id.split_once('-').map_or(id, |(ms, _)| ms).parse().ok()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_are_seqs_and_tokens_are_kept_as_hashes_only() {
        assert_eq!(entry_seq("42-0"), Some(42));
        assert_eq!(entry_seq("7"), Some(7));
        assert_eq!(entry_seq("x-0"), None);
        let hash = token_hash("k3F-secret");
        assert_eq!(hash.len(), 64);
        assert!(!hash.contains("k3F"));
        let record = Record {
            request_id: "req_1".into(),
            token_hash: hash,
            terminal: None,
            first: Some(1),
            last: Some(3),
        };
        assert!(record.token_matches("k3F-secret"));
        assert!(!record.token_matches("k3F-secreT"));
        assert!(!record.token_matches(""));
        assert_eq!(record.newest(), 3);
    }

    #[test]
    fn the_first_entry_of_a_range_reply_gives_its_seq() {
        let reply = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"12-0".to_vec()),
            Value::Array(vec![]),
        ])]);
        assert_eq!(first_entry_seq(&reply), Some(12));
        assert_eq!(first_entry_seq(&Value::Array(vec![])), None);
        assert_eq!(first_entry_seq(&Value::Nil), None);
    }
}
