//! An upstream response's body read from an h2 stream: its data as it arrives, each chunk's
//! flow-control capacity given back as it is handed on, then its trailers; the stream keeps
//! its place on its connection until the body ends, fails or is dropped (dropping it resets
//! the stream, CANCEL, so a hedge's loser is closed at once).

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::h2_pool::Taken;

#[derive(Debug)]
pub struct H2Body {
    recv: h2::RecvStream,
    /// Until the body ends or fails.
    taken: Option<Taken>,
    data_done: bool,
    ended: bool,
}

impl H2Body {
    pub(crate) fn new(recv: h2::RecvStream, taken: Taken) -> Self {
        H2Body {
            recv,
            taken: Some(taken),
            data_done: false,
            ended: false,
        }
    }
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Handed on now, so the peer may send as much again. An error here means
                    // the stream is gone; the next poll says how.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => {
                    this.taken = None;
                    this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => this.data_done = true,
            }
        }
        let trailers = ready!(this.recv.poll_trailers(cx));
        this.taken = None;
        this.ended = true;
        match trailers {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
