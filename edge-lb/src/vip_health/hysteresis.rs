//! The hold-down of one VIP:port, so that flapping pods do not flap routes: a VIP:port
//! goes unhealthy at once, and returns to healthy only after it has been good
//! (programmed, enough ready backends) for the whole hold-down. One that has never
//! been healthy (a new Service, an edge that just started) is healthy as soon as it is
//! good: there is no flapping to damp yet. Pure: time comes in as an argument.
//!
//! ```text
//!            good (never healthy, or hold-down 0)
//!   Unhealthy ─────────────────────────────────────> Healthy
//!     │  ^ not good                      not good │     ^
//!     │  └─────────────── Recovering <───────┐    │     │ good for the hold-down
//!     │ good (was healthy)    │  └───────────┼────┼─────┘
//!     └───────────────────────┘              └────┘ (Healthy -> Unhealthy at once)
//! ```

use std::time::{Duration, Instant};

/// Where a VIP:port is in its hold-down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Healthy,
    Unhealthy,
    /// Good again since `since`, waiting out the hold-down.
    Recovering {
        since: Instant,
    },
}

/// A change of the healthy verdict, for an Event and a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Healthy for the first time (no hold-down applied).
    Healthy,
    /// Healthy again after the hold-down.
    Recovered,
    /// Was healthy, is not.
    Unhealthy,
}

/// The hold-down state machine of one VIP:port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hysteresis {
    phase: Phase,
    ever_healthy: bool,
}

impl Default for Hysteresis {
    fn default() -> Self {
        Hysteresis {
            phase: Phase::Unhealthy,
            ever_healthy: false,
        }
    }
}

impl Hysteresis {
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The verdict the route and the health URL follow.
    pub fn is_healthy(&self) -> bool {
        self.phase == Phase::Healthy
    }

    /// Feeds one observation (`good`: programmed with enough ready backends) at `now`.
    pub fn step(&mut self, good: bool, now: Instant, hold_down: Duration) -> Option<Transition> {
        match (self.phase, good) {
            (Phase::Healthy, true) | (Phase::Unhealthy, false) => None,
            (Phase::Healthy, false) => {
                self.phase = Phase::Unhealthy;
                Some(Transition::Unhealthy)
            }
            (Phase::Recovering { .. }, false) => {
                // The hold-down starts over the next time it is good.
                self.phase = Phase::Unhealthy;
                None
            }
            (Phase::Unhealthy, true) if !self.ever_healthy => {
                self.phase = Phase::Healthy;
                self.ever_healthy = true;
                Some(Transition::Healthy)
            }
            (Phase::Unhealthy, true) => {
                self.phase = Phase::Recovering { since: now };
                self.finish_recovery(now, hold_down)
            }
            (Phase::Recovering { .. }, true) => self.finish_recovery(now, hold_down),
        }
    }

    fn finish_recovery(&mut self, now: Instant, hold_down: Duration) -> Option<Transition> {
        let Phase::Recovering { since } = self.phase else {
            return None;
        };
        (now.saturating_duration_since(since) >= hold_down).then(|| {
            self.phase = Phase::Healthy;
            Transition::Recovered
        })
    }

    /// When a recovering VIP:port becomes healthy if it stays good: the agent syncs
    /// then, without waiting for an API event.
    pub fn due(&self, hold_down: Duration) -> Option<Instant> {
        match self.phase {
            Phase::Recovering { since } => Some(since + hold_down),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(30);

    fn at(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    #[test]
    fn a_new_vip_is_healthy_as_soon_as_it_is_good() {
        let t0 = Instant::now();
        let mut h = Hysteresis::default();
        assert!(!h.is_healthy());
        assert_eq!(
            h.step(false, t0, HOLD),
            None,
            "never healthy: no transition"
        );
        assert_eq!(h.step(true, at(t0, 1), HOLD), Some(Transition::Healthy));
        assert!(h.is_healthy());
        assert_eq!(h.step(true, at(t0, 2), HOLD), None);
    }

    #[test]
    fn goes_unhealthy_at_once_and_back_only_after_the_hold_down() {
        let t0 = Instant::now();
        let mut h = Hysteresis::default();
        h.step(true, t0, HOLD);
        assert_eq!(h.step(false, at(t0, 10), HOLD), Some(Transition::Unhealthy));
        assert!(!h.is_healthy());
        assert_eq!(h.step(true, at(t0, 11), HOLD), None);
        assert_eq!(h.phase(), Phase::Recovering { since: at(t0, 11) });
        assert_eq!(h.due(HOLD), Some(at(t0, 41)));
        assert_eq!(h.step(true, at(t0, 40), HOLD), None, "29 s of 30");
        assert!(!h.is_healthy());
        assert_eq!(h.step(true, at(t0, 41), HOLD), Some(Transition::Recovered));
        assert!(h.is_healthy());
        assert_eq!(h.due(HOLD), None);
    }

    #[test]
    fn flapping_pods_keep_the_verdict_unhealthy() {
        let t0 = Instant::now();
        let mut h = Hysteresis::default();
        h.step(true, t0, HOLD);
        h.step(false, at(t0, 1), HOLD);
        // Ready for 20 s, gone for 1 s, ready again: the hold-down restarts each time.
        let mut transitions = Vec::new();
        for cycle in 0..5 {
            let base = 2 + cycle * 21;
            for s in 0..20 {
                transitions.extend(h.step(true, at(t0, base + s), HOLD));
            }
            transitions.extend(h.step(false, at(t0, base + 20), HOLD));
        }
        assert!(transitions.is_empty(), "{transitions:?}");
        assert!(!h.is_healthy());
        // Steady for the hold-down: healthy again, once.
        h.step(true, at(t0, 200), HOLD);
        assert_eq!(h.step(true, at(t0, 230), HOLD), Some(Transition::Recovered));
    }

    #[test]
    fn a_zero_hold_down_follows_the_backends() {
        let t0 = Instant::now();
        let mut h = Hysteresis::default();
        h.step(true, t0, Duration::ZERO);
        assert_eq!(
            h.step(false, t0, Duration::ZERO),
            Some(Transition::Unhealthy)
        );
        assert_eq!(
            h.step(true, t0, Duration::ZERO),
            Some(Transition::Recovered)
        );
    }
}
