//! The owner's side of shared streams: the one writer task that pipelines queued writes
//! (records, events, ends) to Redis, and the one poller that checks cancels and remote
//! readers of every running stream and refreshes their TTLs.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tokio::sync::mpsc;

use super::{ms, Keys, Owner, SharedReplay, Write, GONE_KEEP, POLL, RUNNING_TTL, WRITE_BATCH};
use crate::shared::Shared;

/// A running stream as one poll sees it: id, owner, whether a remote reader was attached,
/// and its record's token hash and request id.
type Polled = (String, Arc<dyn Owner>, bool, [Arc<str>; 2]);

impl SharedReplay {
    /// Adds one batch of writes to `pipe`; returns the streams whose terminal it writes.
    fn add_writes(&self, pipe: &mut redis::Pipeline, batch: &mut Vec<Write>) -> Vec<String> {
        let mut ended = Vec::new();
        let mut seen: Vec<Arc<Keys>> = Vec::new();
        for write in batch.drain(..) {
            match write {
                Write::Open {
                    id,
                    token_hash,
                    request_id,
                } => {
                    let meta = self.meta_key(&id);
                    pipe.hset_multiple(
                        &meta,
                        &[
                            ("token", &*token_hash),
                            ("request", &*request_id),
                            ("owner", self.shared.instance()),
                            ("state", "running"),
                        ],
                    )
                    .ignore()
                    .pexpire(&meta, ms(RUNNING_TTL) as i64)
                    .ignore();
                }
                Write::Event {
                    keys,
                    seq,
                    name,
                    terminal,
                    json,
                } => {
                    let key = &keys.events;
                    let entry = pipe
                        .cmd("XADD")
                        .arg(key)
                        .arg("MAXLEN")
                        .arg("~")
                        .arg(self.max_events)
                        .arg(format!("{seq}-0"))
                        .arg("n")
                        .arg(name)
                        .arg("d")
                        .arg(json.as_ref());
                    if terminal {
                        entry.arg("t").arg(1);
                    }
                    entry.ignore();
                    if terminal {
                        let meta = &keys.meta;
                        let keep = ms(self.keep_after_done);
                        pipe.hset_multiple(meta, &[("state", "done".to_string()), ("last", seq.to_string())])
                            .ignore()
                            .pexpire(key, keep.max(1) as i64)
                            .ignore()
                            .pexpire(meta, (keep + ms(GONE_KEEP)) as i64)
                            .ignore();
                        ended.push(keys.id.clone());
                    } else if !seen.iter().any(|k| Arc::ptr_eq(k, &keys)) {
                        // A key created here has a TTL at once, so a dead owner leaves nothing.
                        pipe.pexpire(key, ms(RUNNING_TTL) as i64).ignore();
                        seen.push(keys);
                    }
                }
            }
        }
        ended
    }

    fn end_tracking(&self, ids: &[String]) {
        let mut running = self.running.lock();
        for id in ids {
            running.remove(id);
        }
    }

    /// One poll of every running stream: cancels, remote readers, TTLs; and the end of a
    /// stream whose terminal write was dropped.
    async fn poll(&self) {
        let mut snapshot: Vec<Polled> = Vec::new();
        let mut ended: Vec<(String, u64)> = Vec::new();
        {
            let mut running = self.running.lock();
            running.retain(|id, t| {
                let Some(owner) = t.owner.upgrade() else { return false };
                if t.lost.load(Ordering::Relaxed) {
                    if let Some(last) = owner.finished_at() {
                        ended.push((id.clone(), last));
                        return false;
                    }
                }
                let record = [Arc::clone(&t.token_hash), Arc::clone(&t.request_id)];
                snapshot.push((id.clone(), owner, t.remote, record));
                true
            });
        }
        if snapshot.is_empty() && ended.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        for (id, ..) in &snapshot {
            // The record's PEXPIRE answers whether it still exists.
            pipe.exists(self.cancel_key(id))
                .exists(self.readers_key(id))
                .pexpire(self.key(id), ms(RUNNING_TTL) as i64)
                .ignore()
                .pexpire(self.meta_key(id), ms(RUNNING_TTL) as i64);
        }
        let keep = ms(self.keep_after_done);
        for (id, last) in &ended {
            pipe.hset_multiple(
                self.meta_key(id),
                &[("state", "done".to_string()), ("last", last.to_string())],
            )
            .ignore()
            .pexpire(self.key(id), keep.max(1) as i64)
            .ignore()
            .pexpire(self.meta_key(id), (keep + ms(GONE_KEEP)) as i64)
            .ignore();
        }
        let Some(flags) = self
            .shared
            .run("replay_poll", |mut c| async move {
                pipe.query_async::<Vec<bool>>(&mut c).await
            })
            .await
        else {
            return;
        };
        let mut lost_records = redis::pipe();
        let mut any_lost = false;
        for ((id, owner, was_remote, record), flags) in snapshot.iter().zip(flags.chunks(3)) {
            let (cancelled, remote) = (flags.first() == Some(&true), flags.get(1) == Some(&true));
            if flags.get(2) == Some(&false) {
                // Written field by field only where missing, and its TTL only where it has
                // none: the terminal write may have made it anew in the meantime.
                let meta = self.meta_key(id);
                for (field, value) in [
                    ("token", &*record[0]),
                    ("request", &*record[1]),
                    ("owner", self.shared.instance()),
                    ("state", "running"),
                ] {
                    lost_records.hset_nx(&meta, field, value).ignore();
                }
                lost_records
                    .cmd("PEXPIRE")
                    .arg(&meta)
                    .arg(ms(RUNNING_TTL))
                    .arg("NX")
                    .ignore();
                any_lost = true;
            }
            if cancelled {
                owner.cancel();
            }
            if remote != *was_remote {
                owner.remote_reader(remote);
                if let Some(t) = self.running.lock().get_mut(id) {
                    t.remote = remote;
                }
            }
        }
        if any_lost {
            tracing::info!("rewriting the shared records of running streams that Redis lost");
            let _: Option<()> = self
                .shared
                .run("replay_rewrite", |mut c| async move {
                    lost_records.query_async::<()>(&mut c).await
                })
                .await;
        }
    }
}

/// The one writer task: sends whatever is queued as one pipeline, one pipeline at a time
/// (so writes batch up while one is in flight). A failed pipeline is dropped: Redis then
/// lacks those events, and remote readers report the gap.
pub(super) async fn write_loop(replay: Weak<SharedReplay>, shared: Arc<Shared>, mut rx: mpsc::Receiver<Write>) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while rx.recv_many(&mut batch, WRITE_BATCH).await > 0 {
        let Some(replay) = replay.upgrade() else { return };
        let mut pipe = redis::pipe();
        let ended = replay.add_writes(&mut pipe, &mut batch);
        shared
            .run(
                "replay_write",
                |mut c| async move { pipe.query_async::<()>(&mut c).await },
            )
            .await;
        replay.end_tracking(&ended);
    }
}

pub(super) async fn poll_loop(replay: Weak<SharedReplay>) {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(replay) = replay.upgrade() else { return };
        replay.poll().await;
    }
}
