//! BFD held by the XDP datapath across a hitless restart: the speaker's
//! [`HoldStore`] over the pinned `bfd_hold` map (`ringlb_xdp::bfd_hold`), for
//! `ringlb-edge run --on-sigterm restart` and `ringlb-edge speaker` with
//! `--bfd-hold-interface`. docs/bgp.md, "Graceful restart and BFD".
//!
//! ```text
//!  restart exit: Speaker ── HeldBfd (Up, IPv4, peer routed via the XDP interface)
//!                  ──> write: bfd_hold[(local, peer)] = discriminators, timers,
//!                      source port, deadline = now + the peer's restart time
//!  next start:   offers(): live entries (expired ones deleted) ──> Speaker resumes
//!                  them; release() once its first packet is out
//! ```
//!
//! A map error is logged and means "not held": the session then ends with
//! AdminDown, as without this (the restart is no longer hitless at a ToR with
//! BIRD's `bfd on`, but nothing else breaks).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use ringlb_bgp::bfd::fsm::Resume;
use ringlb_bgp::bfd::hold::{HeldBfd, HoldStore};
use ringlb_xdp::bfd_hold::{BfdHoldMap, HeldEntry, HeldSession, monotonic_now};

/// The `bfd_hold` map pinned in `pin_dir`, for peers routed via `interface`.
pub struct XdpHoldStore {
    pin_dir: PathBuf,
    interface: String,
}

impl XdpHoldStore {
    pub fn new(pin_dir: PathBuf, interface: String) -> XdpHoldStore {
        XdpHoldStore { pin_dir, interface }
    }

    fn map(&self) -> Option<BfdHoldMap> {
        match BfdHoldMap::open_pinned(&self.pin_dir) {
            Ok(Some(m)) => Some(m),
            Ok(None) => {
                tracing::warn!(pin_dir = %self.pin_dir.display(), "no pinned bfd_hold map: BFD is not held across restarts");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "opening the bfd_hold map");
                None
            }
        }
    }
}

/// The map entry of a hand-over; `None` for IPv6 (not held) or a deadline past
/// the clock's range.
pub fn to_session(h: &HeldBfd, now: std::time::Duration) -> Option<HeldSession> {
    let (IpAddr::V4(local), IpAddr::V4(peer)) = (h.local.ip(), h.peer) else {
        return None;
    };
    Some(HeldSession {
        local,
        peer,
        my_disc: h.resume.local_disc,
        your_disc: h.resume.remote_disc,
        min_tx: h.min_tx,
        min_rx: h.min_rx,
        detect_mult: h.multiplier,
        peer_min_tx: h.resume.remote_min_tx,
        peer_min_rx: h.resume.remote_min_rx,
        peer_mult: h.resume.remote_mult,
        src_port: h.local.port(),
        deadline: now.checked_add(h.hold_for)?,
    })
}

/// The hand-over a live entry offers the next process.
pub fn from_entry(e: &HeldEntry, now: std::time::Duration) -> HeldBfd {
    let s = &e.session;
    HeldBfd {
        peer: IpAddr::V4(s.peer),
        local: SocketAddr::new(IpAddr::V4(s.local), s.src_port),
        min_tx: s.min_tx,
        min_rx: s.min_rx,
        multiplier: s.detect_mult,
        resume: Resume {
            local_disc: s.my_disc,
            remote_disc: s.your_disc,
            remote_min_tx: s.peer_min_tx,
            remote_min_rx: s.peer_min_rx,
            remote_mult: s.peer_mult,
        },
        hold_for: s.deadline.saturating_sub(now),
    }
}

impl HoldStore for XdpHoldStore {
    fn covers(&self, peer: IpAddr, _local: SocketAddr) -> bool {
        match ringlb_nexthop::route_interface(None, peer) {
            Ok((_, name)) if name == self.interface => true,
            Ok((_, name)) => {
                tracing::info!(%peer, via = name, xdp = self.interface, "BFD peer not behind the XDP interface: not held");
                false
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "no route to the BFD peer: not held");
                false
            }
        }
    }

    fn hold(&self, sessions: &[HeldBfd]) -> Vec<HeldBfd> {
        let Some(mut map) = self.map() else {
            return sessions.to_vec();
        };
        let now = monotonic_now();
        let mut failed = Vec::new();
        for h in sessions {
            let Some(s) = to_session(h, now) else {
                failed.push(*h);
                continue;
            };
            match map.write(&s) {
                Ok(()) => {
                    tracing::info!(peer = %h.peer, local = %h.local, hold_ms = h.hold_for.as_millis() as u64, "BFD session held by XDP")
                }
                Err(e) => {
                    tracing::warn!(peer = %h.peer, error = %e, "writing the bfd_hold entry");
                    failed.push(*h);
                }
            }
        }
        failed
    }

    fn offers(&self) -> Vec<HeldBfd> {
        let Some(mut map) = self.map() else {
            return Vec::new();
        };
        let entries = match map.entries() {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "reading the bfd_hold map");
                return Vec::new();
            }
        };
        let now = monotonic_now();
        let mut offers = Vec::new();
        for e in entries {
            let (local, peer) = (e.session.local, e.session.peer);
            if e.live(now) {
                tracing::info!(%peer, %local, answered = e.answered, refused = e.refused, "BFD session held by XDP: resuming it");
                offers.push(from_entry(&e, now));
            } else {
                tracing::warn!(%peer, %local, answered = e.answered, "held BFD session expired before this start: deleted");
                if let Err(err) = map.remove(local, peer) {
                    tracing::warn!(error = %err, "deleting an expired bfd_hold entry");
                }
            }
        }
        offers
    }

    fn release(&self, local: SocketAddr, peer: IpAddr) {
        let (IpAddr::V4(l), IpAddr::V4(p)) = (local.ip(), peer) else {
            return;
        };
        let Some(mut map) = self.map() else { return };
        match map.get(l, p) {
            Ok(Some(e)) => {
                tracing::info!(%peer, answered = e.answered, refused = e.refused, "BFD session resumed: the datapath stops answering for it")
            }
            Ok(None) => {}
            Err(err) => tracing::warn!(error = %err, "reading a bfd_hold entry"),
        }
        if let Err(err) = map.remove(l, p) {
            tracing::warn!(%peer, error = %err, "deleting the bfd_hold entry");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn held(peer: &str, local: &str) -> HeldBfd {
        HeldBfd {
            peer: peer.parse().unwrap(),
            local: local.parse().unwrap(),
            min_tx: Duration::from_millis(100),
            min_rx: Duration::from_millis(200),
            multiplier: 3,
            resume: Resume {
                local_disc: 11,
                remote_disc: 22,
                remote_min_tx: Duration::from_millis(300),
                remote_min_rx: Duration::from_millis(400),
                remote_mult: 5,
            },
            hold_for: Duration::from_secs(30),
        }
    }

    #[test]
    fn a_hand_over_becomes_an_entry_and_comes_back_as_the_same_offer() {
        let h = held("10.0.0.1", "10.0.0.11:49200");
        let now = Duration::from_secs(1000);
        let s = to_session(&h, now).unwrap();
        assert_eq!((s.my_disc, s.your_disc, s.src_port), (11, 22, 49200));
        assert_eq!(s.deadline, Duration::from_secs(1030));
        let e = HeldEntry {
            session: s,
            answered: 5,
            refused: 0,
            last_answer: None,
        };
        let back = from_entry(&e, Duration::from_secs(1010));
        assert_eq!(
            back,
            HeldBfd {
                hold_for: Duration::from_secs(20),
                ..h
            }
        );
    }

    #[test]
    fn ipv6_sessions_are_not_held() {
        assert_eq!(
            to_session(&held("2001:db8::1", "[2001:db8::11]:49200"), Duration::ZERO),
            None
        );
    }
}
