//! A WebSocket's outgoing messages, written by the session's own task: a message goes to the
//! socket as soon as it takes one, and at most `limit` wait while the client is behind.
//!
//! No channel and no writer future: the session's loop hands each message to the socket
//! itself and keeps flushing while it waits for its next input. Messages wait only while the
//! socket is not ready (the client is not reading), first in one inline place and then in a
//! backlog that is allocated for the burst and freed once it has drained, so an idle or
//! keeping-up socket holds no outgoing buffer here (a bounded channel's first block was
//! 2 KiB per socket, idle or not).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::extract::ws::Message;
use futures::Sink;

pub struct Outbox {
    /// The oldest message waiting; `None` only when the backlog is empty too.
    next: Option<Message>,
    backlog: VecDeque<Message>,
    /// Messages handed to the socket since its last flush.
    unflushed: bool,
    limit: usize,
}

impl Outbox {
    /// An outbox where at most `limit` (at least 1) messages may wait.
    pub fn new(limit: usize) -> Self {
        Outbox {
            next: None,
            backlog: VecDeque::new(),
            unflushed: false,
            limit: limit.max(1),
        }
    }

    /// Messages not yet handed to the socket.
    pub fn waiting(&self) -> usize {
        usize::from(self.next.is_some()) + self.backlog.len()
    }

    /// May one more message wait?
    pub fn has_room(&self) -> bool {
        self.waiting() < self.limit
    }

    /// Queues `message` behind those waiting; the caller checks `has_room` first.
    pub fn push(&mut self, message: Message) {
        if self.next.is_none() {
            self.next = Some(message);
        } else {
            self.backlog.push_back(message);
        }
    }

    /// Hands the waiting messages to `socket` and flushes them: ready once nothing waits and
    /// everything is flushed, or with the socket's error (the client is gone).
    pub fn poll_write<S>(&mut self, socket: &mut S, cx: &mut Context<'_>) -> Poll<Result<(), axum::Error>>
    where
        S: Sink<Message, Error = axum::Error> + Unpin,
    {
        while let Some(message) = self.next.take() {
            match Pin::new(&mut *socket).poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    self.next = Some(message);
                    return Poll::Pending;
                }
            }
            Pin::new(&mut *socket).start_send(message)?;
            self.unflushed = true;
            self.next = self.backlog.pop_front();
        }
        if self.backlog.capacity() > 0 {
            // The burst has drained: give its memory back.
            self.backlog = VecDeque::new();
        }
        if self.unflushed {
            ready!(Pin::new(&mut *socket).poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }

    /// Writes until one more message may wait.
    pub fn poll_room<S>(&mut self, socket: &mut S, cx: &mut Context<'_>) -> Poll<Result<(), axum::Error>>
    where
        S: Sink<Message, Error = axum::Error> + Unpin,
    {
        if let Poll::Ready(Err(e)) = self.poll_write(socket, cx) {
            return Poll::Ready(Err(e));
        }
        if self.has_room() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;
    use futures::{SinkExt, StreamExt};
    use std::future::poll_fn;

    fn text(s: &str) -> Message {
        Message::Text(s.into())
    }

    /// A socket that takes `room` messages until they are read.
    fn socket(room: usize) -> (impl Sink<Message, Error = axum::Error> + Unpin, mpsc::Receiver<Message>) {
        let (tx, rx) = mpsc::channel::<Message>(room);
        (tx.sink_map_err(axum::Error::new), rx)
    }

    #[tokio::test]
    async fn messages_go_out_in_order_and_the_backlog_is_freed_once_drained() {
        let (mut sock, mut client) = socket(0);
        let mut out = Outbox::new(8);
        for i in 0..5 {
            out.push(text(&i.to_string()));
        }
        assert_eq!(out.waiting(), 5);
        let first = futures::poll!(poll_fn(|cx| out.poll_write(&mut sock, cx)));
        assert!(first.is_pending(), "the client has not read yet");
        assert!(out.backlog.capacity() > 0, "a burst waits in the backlog");
        let mut got = Vec::new();
        while got.len() < 5 {
            let _ = futures::poll!(poll_fn(|cx| out.poll_write(&mut sock, cx)));
            if let Some(Message::Text(t)) = client.next().await {
                got.push(t.to_string());
            }
        }
        assert_eq!(got, ["0", "1", "2", "3", "4"], "in order, none lost");
        assert!(poll_fn(|cx| out.poll_write(&mut sock, cx)).await.is_ok());
        assert_eq!((out.waiting(), out.backlog.capacity()), (0, 0), "drained and freed");
    }

    #[tokio::test]
    async fn there_is_room_for_limit_messages_and_a_gone_client_is_an_error() {
        let (mut sock, client) = socket(0);
        let mut out = Outbox::new(2);
        out.push(text("a"));
        assert!(futures::poll!(poll_fn(|cx| out.poll_write(&mut sock, cx))).is_pending());
        assert_eq!(out.waiting(), 0, "the socket took it, unread");
        out.push(text("b"));
        assert!(out.has_room());
        out.push(text("c"));
        assert!(!out.has_room(), "two may wait");
        assert!(futures::poll!(poll_fn(|cx| out.poll_room(&mut sock, cx))).is_pending());
        drop(client);
        assert!(
            poll_fn(|cx| out.poll_room(&mut sock, cx)).await.is_err(),
            "the socket's error ends the wait"
        );
    }
}
