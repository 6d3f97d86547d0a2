//! A reader of a shared stream on an instance that does not hold it: `XREAD BLOCK` in bounded
//! batches from its own connection, checking that seqs follow one another (a jump is a gap,
//! never a silent skip), and refreshing its presence so the owner keeps the stream alive.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamReadReply;
use redis::{AsyncConnectionConfig, Value};

use super::{entry_seq, ms, SharedReplay, READER_TTL};
use crate::transport::replay::{Event, Read};

/// Entries fetched per round.
const BATCH: usize = 64;
/// How long one `XREAD` waits for new entries.
const BLOCK: Duration = Duration::from_millis(1000);
/// Failed rounds in a row after which the reader ends (its client reconnects, maybe to the
/// owner, which still has every event).
const MAX_FAILURES: u32 = 3;

pub struct RemoteReader {
    client: Option<redis::Client>,
    conn: Option<MultiplexedConnection>,
    op_timeout: Duration,
    key: String,
    meta: String,
    readers: String,
    /// Seq of the next event this reader must get.
    next: u64,
    /// The newest entry fetched so far: the next `XREAD` starts after it (not after `next`,
    /// so an entry that cannot be used is not fetched again and again).
    cursor: u64,
    buf: VecDeque<(u64, Event)>,
    /// Once set, every later call answers this (`Gap` or `End`).
    finish: Option<Read>,
    failures: u32,
}

impl RemoteReader {
    pub(super) fn new(replay: &SharedReplay, id: &str, after: u64) -> RemoteReader {
        RemoteReader {
            client: replay.client.clone(),
            conn: None,
            op_timeout: replay.op_timeout,
            key: replay.key(id),
            meta: replay.meta_key(id),
            readers: replay.readers_key(id),
            next: after.saturating_add(1),
            cursor: after,
            buf: VecDeque::with_capacity(BATCH),
            finish: None,
            failures: 0,
        }
    }

    /// The next event, waiting for it; `Gap` when the owner's copy in Redis lacks the next
    /// one; `End` after the terminal event, or when Redis stops answering.
    pub async fn next(&mut self) -> Read {
        loop {
            if let Some(read) = self.try_next() {
                return read;
            }
            match self.fetch().await {
                Some(()) => self.failures = 0,
                None => {
                    self.failures += 1;
                    if self.failures >= MAX_FAILURES {
                        self.finish = Some(Read::End);
                    }
                }
            }
        }
    }

    /// The next event if it was already fetched.
    pub fn try_next(&mut self) -> Option<Read> {
        if let Some(read) = &self.finish {
            return Some(read.clone());
        }
        while let Some((seq, event)) = self.buf.pop_front() {
            if seq < self.next {
                continue;
            }
            if seq > self.next {
                self.buf.clear();
                let gap = Read::Gap { first: seq };
                self.finish = Some(gap.clone());
                return Some(gap);
            }
            self.next = seq + 1;
            if event.terminal {
                self.finish = Some(Read::End);
            }
            return Some(Read::Event(seq, event));
        }
        None
    }

    /// One round: marks this reader present and waits up to `BLOCK` for entries after the
    /// cursor. With none, checks whether the stream ended or expired. `None` on failure.
    async fn fetch(&mut self) -> Option<()> {
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&self.readers)
            .arg(1)
            .arg("PX")
            .arg(ms(READER_TTL))
            .ignore()
            .cmd("XREAD")
            .arg("COUNT")
            .arg(BATCH)
            .arg("BLOCK")
            .arg(ms(BLOCK))
            .arg("STREAMS")
            .arg(&self.key)
            .arg(format!("{}-0", self.cursor));
        let budget = BLOCK + self.op_timeout;
        let conn = self.connection().await?;
        let reply = match tokio::time::timeout(budget, pipe.query_async::<(Option<StreamReadReply>,)>(conn)).await {
            Ok(Ok((reply,))) => reply,
            _ => {
                self.conn = None;
                return None;
            }
        };
        let entries: Vec<_> = reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids).collect();
        if entries.is_empty() {
            return self.check_end().await;
        }
        for entry in entries {
            let Some(seq) = entry_seq(&entry.id) else { continue };
            self.cursor = self.cursor.max(seq);
            let text = |field: &str| match entry.map.get(field) {
                Some(Value::BulkString(b)) => Some(b.clone()),
                Some(Value::SimpleString(s)) => Some(s.clone().into_bytes()),
                _ => None,
            };
            let (Some(name), Some(json)) = (text("n"), text("d")) else {
                continue;
            };
            self.buf.push_back((
                seq,
                Event {
                    name: static_name(&String::from_utf8_lossy(&name)),
                    terminal: entry.map.contains_key("t"),
                    json: Bytes::from(json),
                },
            ));
        }
        Some(())
    }

    /// Nothing new arrived: the reader ends when the record is gone (expired, or the owner
    /// died and stopped refreshing it) or the stream is done with nothing left to read.
    async fn check_end(&mut self) -> Option<()> {
        let mut pipe = redis::pipe();
        pipe.hget(&self.meta, "state").hget(&self.meta, "last");
        let budget = self.op_timeout;
        let conn = self.connection().await?;
        let reply = tokio::time::timeout(budget, pipe.query_async::<(Option<String>, Option<u64>)>(conn)).await;
        match reply {
            Ok(Ok((None, _))) => self.finish = Some(Read::End),
            Ok(Ok((Some(state), last))) if state == "done" && last.is_some_and(|l| self.next > l) => {
                self.finish = Some(Read::End)
            }
            Ok(Ok(_)) => {}
            _ => {
                self.conn = None;
                return None;
            }
        }
        Some(())
    }

    async fn connection(&mut self) -> Option<&mut MultiplexedConnection> {
        if self.conn.is_none() {
            let client = self.client.as_ref()?;
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.op_timeout))
                .set_response_timeout(Some(BLOCK + self.op_timeout));
            let conn = tokio::time::timeout(
                self.op_timeout,
                client.get_multiplexed_async_connection_with_config(&config),
            )
            .await
            .ok()?
            .ok()?;
            self.conn = Some(conn);
        }
        self.conn.as_mut()
    }
}

/// The event type as the `&'static str` the local buffer uses; an unknown one (a newer
/// instance's) keeps a generic name, its JSON unchanged.
fn static_name(name: &str) -> &'static str {
    const NAMES: [&str; 10] = [
        "start",
        "delta",
        "tool_call",
        "reset",
        "route_switch",
        "usage",
        "done",
        "error",
        "cancelled",
        "accepted",
    ];
    NAMES.iter().find(|n| **n == name).copied().unwrap_or("message")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(after: u64) -> RemoteReader {
        RemoteReader {
            client: None,
            conn: None,
            op_timeout: Duration::from_millis(100),
            key: "k".into(),
            meta: "k:meta".into(),
            readers: "k:readers".into(),
            next: after + 1,
            cursor: after,
            buf: VecDeque::new(),
            finish: None,
            failures: 0,
        }
    }

    fn event(terminal: bool) -> Event {
        Event {
            name: if terminal { "done" } else { "delta" },
            terminal,
            json: Bytes::from_static(b"{}"),
        }
    }

    #[test]
    fn fetched_entries_come_once_in_order_and_a_jump_is_a_gap() {
        let mut r = reader(2);
        r.buf.extend([
            (2, event(false)),
            (3, event(false)),
            (4, event(false)),
            (6, event(false)),
        ]);
        assert!(
            matches!(r.try_next(), Some(Read::Event(3, _))),
            "2 is already had: skipped"
        );
        assert!(matches!(r.try_next(), Some(Read::Event(4, _))));
        assert_eq!(
            r.try_next(),
            Some(Read::Gap { first: 6 }),
            "5 is missing: a gap, not a skip"
        );
        assert_eq!(r.try_next(), Some(Read::Gap { first: 6 }), "and it stays the answer");
    }

    #[test]
    fn the_terminal_event_ends_the_reader() {
        let mut r = reader(0);
        r.buf.extend([(1, event(false)), (2, event(true))]);
        assert!(matches!(r.try_next(), Some(Read::Event(1, _))));
        assert!(matches!(r.try_next(), Some(Read::Event(2, e)) if e.terminal));
        assert_eq!(r.try_next(), Some(Read::End));
        assert_eq!(r.try_next(), Some(Read::End));
    }

    #[tokio::test]
    async fn without_a_connection_the_reader_ends_after_bounded_failures() {
        let mut r = reader(0);
        assert_eq!(
            r.next().await,
            Read::End,
            "no client: three failed rounds, then the end"
        );
        assert_eq!(static_name("delta"), "delta");
        assert_eq!(static_name("future_type"), "message");
    }
}
