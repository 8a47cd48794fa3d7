//! BFD held across a hitless restart by something outside the process (the XDP
//! datapath's `bfd_hold` map, wired in by the edge agent): the speaker hands
//! its Up sessions to a [`HoldStore`] instead of sending AdminDown, and the
//! next process resumes them ([`super::fsm::Session::resume`]) from the offers
//! the store still holds. The store is a trait so this crate needs no BPF.
//!
//! ```text
//!  restart exit:  Speaker::bfd_hold_or_admin_down
//!                   ├─ Up, IPv4, GR, store.covers(peer) ─> HeldBfd ─> store.hold
//!                   └─ anything else ───────────────────> AdminDown (as before)
//!  next start:    store.offers() ─> Speaker: start_bfd resumes a matching offer,
//!                   store.release(offer) once its first packet is out
//! ```

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::BfdConfig;
use super::fsm::Resume;

/// One session handed over (or offered back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldBfd {
    pub peer: IpAddr,
    /// Our address and UDP source port of the session's packets.
    pub local: SocketAddr,
    /// Our timers (Desired Min TX once Up, Required Min RX, Detect Mult).
    pub min_tx: Duration,
    pub min_rx: Duration,
    pub multiplier: u8,
    pub resume: Resume,
    /// How long the holder may answer for us: the peer's graceful restart time
    /// (after it, the peer drops our routes anyway).
    pub hold_for: Duration,
}

impl HeldBfd {
    /// Whether `cfg` (a new process's BFD settings for this peer) can take the
    /// session over unchanged; a change would need a Poll Sequence the holder
    /// never started, so such a session starts afresh.
    pub fn matches(&self, cfg: &BfdConfig) -> bool {
        self.min_tx == cfg.min_tx && self.min_rx == cfg.min_rx && self.multiplier == cfg.multiplier
    }

    /// Whether a holder that answers each of the peer's packets once keeps the
    /// peer's session up: the peer sends every max(its Desired Min TX, our
    /// Required Min RX) (less with jitter) and declares us down after our
    /// multiplier times max(its Required Min RX, our Desired Min TX). With
    /// asymmetric timers the first can reach the second; such a session is not
    /// held (it gets AdminDown).
    pub fn paced(&self) -> bool {
        let peer_sends_every = self.resume.remote_min_tx.max(self.min_rx);
        let peer_detects_in =
            self.resume.remote_min_rx.max(self.min_tx) * u32::from(self.multiplier);
        peer_sends_every < peer_detects_in
    }
}

/// Where sessions are held while no agent runs. Implementations do I/O but must
/// not block for long: they run on the restart path.
pub trait HoldStore: Send + Sync {
    /// Whether the holder sees `peer`'s packets (it is reached over the
    /// interface the holder runs on).
    fn covers(&self, peer: IpAddr, local: SocketAddr) -> bool;
    /// Hold these sessions; returns the ones it could not (they get AdminDown).
    fn hold(&self, sessions: &[HeldBfd]) -> Vec<HeldBfd>;
    /// The sessions an earlier process left that are still held (expired ones
    /// are dropped by the store).
    fn offers(&self) -> Vec<HeldBfd>;
    /// Stop holding `peer`'s session from `local` (resumed, or not wanted).
    fn release(&self, local: SocketAddr, peer: IpAddr);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unchanged_timers_resume_a_held_session() {
        let ms = Duration::from_millis;
        let cfg = BfdConfig {
            min_rx: ms(100),
            min_tx: ms(100),
            multiplier: 3,
            port: 3784,
        };
        let held = HeldBfd {
            peer: "10.0.0.1".parse().unwrap(),
            local: "10.0.0.11:49200".parse().unwrap(),
            min_tx: ms(100),
            min_rx: ms(100),
            multiplier: 3,
            resume: Resume {
                local_disc: 1,
                remote_disc: 2,
                remote_min_tx: ms(100),
                remote_min_rx: ms(100),
                remote_mult: 3,
            },
            hold_for: Duration::from_secs(30),
        };
        assert!(held.matches(&cfg));
        assert!(!held.matches(&BfdConfig {
            min_tx: ms(50),
            ..cfg
        }));
        assert!(!held.matches(&BfdConfig {
            min_rx: ms(300),
            ..cfg
        }));
        assert!(!held.matches(&BfdConfig {
            multiplier: 5,
            ..cfg
        }));
    }

    #[test]
    fn a_hold_is_paced_only_while_the_peer_sends_faster_than_it_detects() {
        let ms = Duration::from_millis;
        let held = |min_tx, min_rx, mult, remote_min_tx, remote_min_rx| HeldBfd {
            peer: "10.0.0.1".parse().unwrap(),
            local: "10.0.0.11:49200".parse().unwrap(),
            min_tx: ms(min_tx),
            min_rx: ms(min_rx),
            multiplier: mult,
            resume: Resume {
                local_disc: 1,
                remote_disc: 2,
                remote_min_tx: ms(remote_min_tx),
                remote_min_rx: ms(remote_min_rx),
                remote_mult: 3,
            },
            hold_for: Duration::from_secs(30),
        };
        // the tests' timers: the peer sends every 100 ms, detects in 300 ms
        assert!(held(100, 100, 3, 100, 100).paced());
        assert!(held(100, 100, 2, 100, 100).paced());
        // multiplier 1: one answer per interval is exactly the detection time
        assert!(!held(100, 100, 1, 100, 100).paced());
        // the peer sends every 1 s (its min tx), but detects us in 3 x 100 ms
        assert!(!held(100, 100, 3, 1000, 100).paced());
        // we asked for packets only every 1 s (our min rx): too slow as well
        assert!(!held(100, 1000, 3, 100, 100).paced());
        // a slow peer that also detects slowly: 1 s against 3 x 1 s
        assert!(held(100, 100, 3, 1000, 1000).paced());
    }
}
