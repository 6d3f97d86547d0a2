//! The budget of control frames (pings, pongs) a WebSocket client may send: past
//! `MAX_CONTROL_FRAMES` in one `CONTROL_WINDOW` the socket is closed (1008).
//!
//! Why: each client ping is read and answered by the WebSocket layer at once, whether or not
//! the client reads the answers, so a client flooding pings while it reads nothing kept the
//! session's task reading at full speed, one core's worth, until the write timeout closed it.
//! A client needs a ping every few seconds at most (browsers send none); a pong is owed only
//! once per ping of ours.

use std::time::Duration;

use tokio::time::Instant;

/// Control frames a client may send per window.
pub const MAX_CONTROL_FRAMES: u32 = 64;
/// The window they are counted over.
pub const CONTROL_WINDOW: Duration = Duration::from_secs(10);

/// Control frames counted since the window began.
#[derive(Debug)]
pub struct ControlBudget {
    since: Instant,
    count: u32,
}

impl ControlBudget {
    pub fn new(now: Instant) -> Self {
        ControlBudget { since: now, count: 0 }
    }

    /// Counts one control frame at `now`: `false` once the window's allowance is spent.
    pub fn take(&mut self, now: Instant) -> bool {
        if now.saturating_duration_since(self.since) >= CONTROL_WINDOW {
            self.since = now;
            self.count = 0;
        }
        self.count = self.count.saturating_add(1);
        self.count <= MAX_CONTROL_FRAMES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowance_is_per_window() {
        let start = Instant::now();
        let mut budget = ControlBudget::new(start);
        for i in 0..MAX_CONTROL_FRAMES {
            assert!(budget.take(start), "frame {i} is within the allowance");
        }
        assert!(!budget.take(start + CONTROL_WINDOW / 2), "one more in the same window");
        assert!(budget.take(start + CONTROL_WINDOW), "a new window, a new allowance");
    }
}
