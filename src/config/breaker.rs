//! `[breaker]`: when a route's circuit breaker opens, how long it stays open, and who probes
//! it when it cools (the config half of `health::breaker`).

use std::time::Duration;

/// Who finds out whether a cooled route recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeMode {
    /// The background prober sends its own minimal request; half-open admits no user
    /// request (users never pay for a probe).
    Background,
    /// Half-open admits `half_open_probes` user requests as probes.
    Traffic,
}

impl ProbeMode {
    pub fn parse(s: &str) -> Option<ProbeMode> {
        match s {
            "background" => Some(ProbeMode::Background),
            "traffic" => Some(ProbeMode::Traffic),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProbeMode::Background => "background",
            ProbeMode::Traffic => "traffic",
        }
    }
}

/// When a breaker opens and how long it stays open.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// How far back the error rate looks.
    pub window: Duration,
    /// Outcomes the window must hold before the error rate can open the breaker.
    pub min_volume: u32,
    /// Error rate (0.0..=1.0) at or above which the breaker opens.
    pub error_rate: f64,
    /// Failures in a row that open the breaker regardless of volume; 0 disables.
    pub consecutive_failures: u32,
    /// First cool-down after opening.
    pub cooldown: Duration,
    /// Cap for the doubling cool-down: the longest gap between two probes of a route, so
    /// about the longest a recovered route waits before it carries traffic again.
    pub max_cooldown: Duration,
    /// Concurrent user probes admitted when half-open with [`ProbeMode::Traffic`] (at least 1).
    pub half_open_probes: u32,
    /// Who probes a cooled route.
    pub probe: ProbeMode,
    /// How long a route out of quota or credit is cooled (not a breaker state: the route's
    /// cool-down, as after a 429).
    pub quota_cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            window: Duration::from_secs(10),
            min_volume: 20,
            error_rate: 0.5,
            consecutive_failures: 5,
            cooldown: Duration::from_secs(1),
            max_cooldown: Duration::from_secs(5),
            half_open_probes: 1,
            probe: ProbeMode::Background,
            quota_cooldown: Duration::from_secs(300),
        }
    }
}
