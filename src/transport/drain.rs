//! The drain signal every handler and stream can see: when shutdown began (`/readyz` fails,
//! new chat requests are refused) and when the drain time ran out (streams still running end
//! with an in-band `draining` error).
//!
//! The server raises both (`server::serve`); handlers read `is_draining`, and the pumps'
//! watchdog (`transport::pump`) waits on `cut` so that a stream whose client is not reading
//! ends too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::types::{Envelope, ErrorClass, ErrorEvent};

/// Shutdown's two moments, shared by every clone.
#[derive(Clone, Debug, Default)]
pub struct Drain {
    draining: Arc<AtomicBool>,
    cut: CancellationToken,
}

/// How long a refused or cut client should wait before retrying (elsewhere).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

impl Drain {
    /// Shutdown began: `/readyz` answers 503 and new chat requests get 503 with Retry-After.
    pub fn begin(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The drain time is over: every stream still running ends with a `draining` error.
    pub fn cut(&self) {
        self.begin();
        self.cut.cancel();
    }

    /// Resolves once `cut` was called (at once if it already was).
    pub fn cut_token(&self) -> CancellationToken {
        self.cut.clone()
    }

    /// The flag `begin` sets, for readers that only need to know.
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.draining)
    }
}

/// The in-band error a stream ends with when the drain cuts it; each dialect renders it its own
/// way (an OpenAI error chunk, an Anthropic `error` event, a native `error` message), all with
/// class/code `draining`.
pub fn cut_event(envelope: Envelope) -> ErrorEvent {
    ErrorEvent {
        code: None,
        class: ErrorClass::Draining,
        status: ErrorClass::Draining.http_status(),
        message: "tailcut is shutting down and ended this answer before it finished; retry the request".into(),
        retry_after: Some(RETRY_AFTER),
        envelope,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn cut_implies_draining_and_wakes_every_clone() {
        let drain = Drain::default();
        let token = drain.clone().cut_token();
        assert!(!drain.is_draining(), "not draining at first");
        drain.clone().cut();
        assert!(drain.is_draining(), "a cut is also a drain");
        token.cancelled().await;
        assert!(drain.flag().load(Ordering::SeqCst), "the shared flag is set");
    }
}
