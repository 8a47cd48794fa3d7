//! The retry pace of every watch: 250 ms doubling to a 5 s cap, ±20 % jitter, back to
//! 250 ms after a good event.
//!
//! kube-runtime's default (0.8 s doubling to 30 s, with jitter that can double a
//! delay) left the controller blind for up to a minute after a 30 s API outage: the
//! API was back, but the Service watch's next attempt was still far off. A 5 s cap
//! costs one cheap failed request per watch every 5 s while the API is down.

use std::time::Duration;

use kube::runtime::utils::Backoff;

const MIN: Duration = Duration::from_millis(250);
const MAX: Duration = Duration::from_secs(5);

/// Use with `WatchStreamExt::backoff(WatchBackoff::default())`.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
    seed: u64,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(0);
        WatchBackoff {
            next: MIN,
            seed: h.finish() | 1,
        }
    }
}

impl WatchBackoff {
    /// xorshift64: jitter only, no need for a real random source.
    fn jitter(&mut self) -> f64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        0.8 + 0.4 * ((self.seed % 1000) as f64 / 1000.0)
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let base = self.next;
        self.next = (self.next * 2).min(MAX);
        Some(base.mul_f64(self.jitter()))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let mut b = WatchBackoff::default();
        let d: Vec<Duration> = b.by_ref().take(8).collect();
        assert!(d[0] >= Duration::from_millis(200) && d[0] <= Duration::from_millis(300));
        assert!(d[1] >= Duration::from_millis(400) && d[1] <= Duration::from_millis(600));
        assert!(d[7] >= Duration::from_secs(4) && d[7] <= Duration::from_secs(6));
        b.reset();
        assert!(b.next().unwrap() <= Duration::from_millis(300));
    }
}
