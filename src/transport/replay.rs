//! The replay buffer of one resumable stream: its events numbered from 1, bounded by count
//! and by bytes (the oldest dropped first), and readers that each follow their own cursor.
//!
//! One producer appends; any number of readers read. A reader never blocks the producer or
//! another reader: it only waits for the next event, and a reader that falls behind the
//! oldest retained event gets `Read::Gap` instead of holding memory.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::native::ServerMessage;

/// Bookkeeping counted against `max_bytes` for each event besides its JSON: its slot in the
/// log, the allocator's header on its JSON, and the shared header (with its own allocator
/// header) that `Bytes` allocates at the first copy, a reader's or `push_event`'s. Not
/// counted: the log's spare slots (a `VecDeque` grows by doubling: at most one more slot per
/// held event).
pub const EVENT_OVERHEAD: usize = std::mem::size_of::<Stored>() + 16 + 32;

/// One retained event: the native message as the compact JSON `GET /v1/stream` sends (its
/// `id` is the stream's request id), kept serialized because that is several times smaller
/// than the message itself and every reader sends it as it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The `type`, which is the SSE event name.
    pub name: &'static str,
    pub terminal: bool,
    pub json: Bytes,
}

struct Stored {
    event: Event,
    /// The bytes charged for it: its JSON plus `EVENT_OVERHEAD`.
    cost: usize,
}

struct Log {
    events: VecDeque<Stored>,
    /// Seq of `events[0]` (or of the next event when the log is empty).
    first: u64,
    /// Seq of the newest event; 0 before the first.
    last: u64,
    /// The newest event is terminal: nothing more will come.
    finished: bool,
    bytes: usize,
}

/// What a reader gets next.
#[derive(Debug, Clone, PartialEq)]
pub enum Read {
    Event(u64, Event),
    /// The next event the reader needs was dropped; `first` is the oldest still held.
    Gap {
        first: u64,
    },
    /// The stream ended and the reader has every event.
    End,
}

/// Where a resume from `after` (the last seq a client has) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// Events after `after` are (or will be) available.
    Ok,
    /// The client already has the terminal event.
    Finished,
    /// Events after `after` were dropped; `first` is the oldest still held.
    Gap { first: u64 },
    /// `after` is beyond the newest event: the client cannot have seen it.
    Ahead { last: u64 },
}

pub struct Replay {
    log: Mutex<Log>,
    max_events: usize,
    max_bytes: usize,
    /// The newest seq: readers wait on it.
    newest: watch::Sender<u64>,
}

impl Replay {
    pub fn new(max_events: usize, max_bytes: usize) -> Replay {
        Replay {
            log: Mutex::new(Log {
                events: VecDeque::new(),
                first: 1,
                last: 0,
                finished: false,
                bytes: 0,
            }),
            max_events: max_events.max(1),
            max_bytes,
            newest: watch::Sender::new(0),
        }
    }

    /// Appends an event (ignored once the stream finished) and returns its seq. The
    /// oldest events are dropped while either bound is exceeded; the newest is always kept,
    /// so a late reader can still learn how the stream ended.
    pub fn push(&self, message: ServerMessage) -> Option<u64> {
        self.push_event(message).map(|(seq, _)| seq)
    }

    /// `push`, also returning the stored event (to copy it elsewhere, e.g. to Redis).
    pub fn push_event(&self, message: ServerMessage) -> Option<(u64, Event)> {
        let event = Event {
            name: message.name(),
            terminal: message.is_terminal(),
            // Boxed first so the buffer holds exactly the JSON, not a grown Vec's capacity.
            json: Bytes::from(message.to_json().into_bytes().into_boxed_slice()),
        };
        let cost = event.json.len() + EVENT_OVERHEAD;
        let finished = event.terminal;
        let seq = {
            let mut log = self.log.lock();
            if log.finished {
                return None;
            }
            log.last += 1;
            log.finished = finished;
            log.bytes += cost;
            log.events.push_back(Stored {
                event: event.clone(),
                cost,
            });
            while log.events.len() > 1 && (log.events.len() > self.max_events || log.bytes > self.max_bytes) {
                if let Some(old) = log.events.pop_front() {
                    log.bytes -= old.cost;
                    log.first += 1;
                }
            }
            log.last
        };
        self.newest.send_replace(seq);
        Some((seq, event))
    }

    pub fn finished(&self) -> bool {
        self.log.lock().finished
    }

    /// The newest seq and whether it is terminal.
    pub fn last(&self) -> (u64, bool) {
        let log = self.log.lock();
        (log.last, log.finished)
    }

    /// Events and bytes held now.
    pub fn held(&self) -> (usize, usize) {
        let log = self.log.lock();
        (log.events.len(), log.bytes)
    }

    pub fn check_resume(&self, after: u64) -> Resume {
        let log = self.log.lock();
        if after > log.last {
            Resume::Ahead { last: log.last }
        } else if log.finished && after == log.last {
            Resume::Finished
        } else if after + 1 < log.first {
            Resume::Gap { first: log.first }
        } else {
            Resume::Ok
        }
    }

    /// A reader that gets every event with seq > `after`.
    pub fn reader(self: &Arc<Self>, after: u64) -> Reader {
        Reader {
            replay: Arc::clone(self),
            next: after.saturating_add(1),
            newest: self.newest.subscribe(),
        }
    }

    fn read(&self, next: u64) -> Option<Read> {
        let log = self.log.lock();
        if next < log.first {
            return Some(Read::Gap { first: log.first });
        }
        let index = usize::try_from(next - log.first).unwrap_or(usize::MAX);
        match log.events.get(index) {
            Some(stored) => Some(Read::Event(next, stored.event.clone())),
            None if log.finished => Some(Read::End),
            None => None,
        }
    }
}

/// One reader's cursor into a replay buffer.
pub struct Reader {
    replay: Arc<Replay>,
    next: u64,
    newest: watch::Receiver<u64>,
}

impl Reader {
    /// The next event, waiting for it when the reader is caught up. After `Gap` or `End`
    /// the reader is done (calling again repeats the answer).
    pub async fn next(&mut self) -> Read {
        loop {
            // Marked seen before looking, so a push after the look wakes `changed`.
            self.newest.borrow_and_update();
            if let Some(read) = self.replay.read(self.next) {
                if let Read::Event(seq, _) = &read {
                    self.next = seq + 1;
                }
                return read;
            }
            if self.newest.changed().await.is_err() {
                return Read::End;
            }
        }
    }

    /// The next event if it is already here, without waiting (to batch writes).
    pub fn try_next(&mut self) -> Option<Read> {
        let read = self.replay.read(self.next)?;
        if let Read::Event(seq, _) = &read {
            self.next = seq + 1;
        }
        Some(read)
    }

    /// Seq of the next event this reader will get.
    pub fn position(&self) -> u64 {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(text: &str) -> ServerMessage {
        ServerMessage::Delta {
            id: "req_1".into(),
            text: text.into(),
        }
    }

    fn done() -> ServerMessage {
        ServerMessage::Cancelled { id: "req_1".into() }
    }

    fn seqs(reads: &[Read]) -> Vec<u64> {
        reads
            .iter()
            .filter_map(|r| match r {
                Read::Event(seq, _) => Some(*seq),
                _ => None,
            })
            .collect()
    }

    async fn read_all(reader: &mut Reader) -> Vec<Read> {
        let mut out = Vec::new();
        loop {
            let r = reader.next().await;
            let last = !matches!(r, Read::Event(..));
            out.push(r);
            if last {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn a_reader_gets_every_event_after_its_cursor_then_the_end() {
        let replay = Arc::new(Replay::new(100, 1 << 20));
        for i in 0..5 {
            replay.push(delta(&format!("t{i}")));
        }
        replay.push(done());
        let mut reader = replay.reader(2);
        let reads = read_all(&mut reader).await;
        assert_eq!(seqs(&reads), vec![3, 4, 5, 6], "exactly the events after 2");
        assert_eq!(reads.last(), Some(&Read::End), "then the end");
        assert_eq!(replay.push(delta("late")), None, "nothing is appended after the end");
    }

    #[tokio::test]
    async fn a_waiting_reader_wakes_for_the_next_event() {
        let replay = Arc::new(Replay::new(100, 1 << 20));
        let mut reader = replay.reader(0);
        let waiting = tokio::spawn(async move { reader.next().await });
        tokio::task::yield_now().await;
        replay.push(delta("a"));
        let read = waiting.await.expect("reader task");
        assert!(matches!(read, Read::Event(1, _)), "woken with seq 1: {read:?}");
    }

    #[test]
    fn the_event_bound_drops_the_oldest() {
        let replay = Arc::new(Replay::new(3, 1 << 20));
        for i in 0..10 {
            replay.push(delta(&format!("t{i}")));
        }
        assert_eq!(replay.held().0, 3, "three events held");
        assert_eq!(replay.check_resume(6), Resume::Gap { first: 8 }, "7 was dropped");
        assert_eq!(replay.check_resume(7), Resume::Ok, "8 onwards is held");
        assert_eq!(replay.check_resume(11), Resume::Ahead { last: 10 }, "11 never existed");
    }

    #[test]
    fn the_byte_bound_holds_and_the_newest_event_is_kept() {
        let one = delta("x").to_json().len() + EVENT_OVERHEAD;
        let replay = Arc::new(Replay::new(1000, one * 4));
        for _ in 0..50 {
            replay.push(delta("x"));
            assert!(replay.held().1 <= one * 4, "bytes stay within the bound");
        }
        assert_eq!(replay.held(), (4, one * 4), "four events fit");
        let big = "y".repeat(one * 10);
        replay.push(delta(&big));
        assert_eq!(replay.held().0, 1, "an event over the bound alone is still kept");
    }

    #[tokio::test]
    async fn a_reader_behind_the_buffer_gets_a_gap() {
        let replay = Arc::new(Replay::new(2, 1 << 20));
        let mut reader = replay.reader(0);
        for i in 0..5 {
            replay.push(delta(&format!("t{i}")));
        }
        assert_eq!(reader.next().await, Read::Gap { first: 4 }, "1..3 were dropped");
    }

    #[test]
    fn resume_at_the_terminal_event_is_finished() {
        let replay = Arc::new(Replay::new(10, 1 << 20));
        replay.push(delta("a"));
        replay.push(done());
        assert_eq!(replay.check_resume(2), Resume::Finished, "the client has the end");
        assert_eq!(replay.check_resume(1), Resume::Ok, "the end is still to read");
    }
}
