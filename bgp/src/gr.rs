//! Graceful restart (RFC 4724), restarting-speaker side: the capability (code 64)
//! this speaker puts in its OPEN, and its decoding from a peer's OPEN.
//!
//! ```text
//!  +--------+--------------------------+
//!  | R N 00 | restart time (12 bits)   |   R: "I restarted", N: RFC 8538
//!  +--------+--------------------------+
//!  | AFI (2) | SAFI (1) | F . . . . . . |   one per family; F: forwarding kept
//!  +---------------------------------------+
//! ```
//!
//! The helper (the ToR) keeps our routes as stale for the restart time when the
//! session drops without a NOTIFICATION; when the new session's OPEN carries F for
//! a family it keeps them until our End-of-RIB, then drops the stale ones we did not
//! re-announce. Without F it drops them at once. Pure: no I/O.

use super::codec::{Afi, Capability, Open, SAFI_UNICAST};

/// Capability code (RFC 4724 §3).
pub const CODE: u8 = 64;
/// Restart State bit in the first two octets.
const RESTART_STATE: u16 = 0x8000;
/// Graceful Notification bit (RFC 8538 §2).
const NOTIFICATION: u16 = 0x4000;
/// Forwarding State bit of a family's flags.
const FORWARDING: u8 = 0x80;
/// Largest restart time (12 bits).
pub const MAX_RESTART_TIME: u16 = 0x0fff;

/// What the speaker knows about its own start, the same for every peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestartState {
    /// This process replaced an earlier one that left without a drain: the R bit.
    pub restarted: bool,
    /// The datapath kept forwarding the announced routes across the restart: the F
    /// bit of every family.
    pub forwarding: bool,
}

/// What SIGTERM means to a process that runs the speaker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnSigterm {
    /// Graceful shutdown (RFC 8326): GRACEFUL_SHUTDOWN, the drain time, withdraw,
    /// NOTIFICATION Cease. For taking the node out of service.
    #[default]
    Drain,
    /// Hitless restart: close the sessions without NOTIFICATION and withdraw
    /// nothing; peers with graceful restart keep the routes for the restart time.
    /// For an upgrade of the process while the datapath forwards on.
    Restart,
}

/// One family of the capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrFamily {
    pub afi: u16,
    pub safi: u8,
    pub forwarding: bool,
}

/// The graceful restart capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrCapability {
    pub restart_state: bool,
    pub notification: bool,
    pub restart_time: u16,
    pub families: Vec<GrFamily>,
}

impl GrCapability {
    /// Ours: unicast for each of `families`, F per `state.forwarding`, R per
    /// `state.restarted`. No N bit: a NOTIFICATION from us always means "drop my
    /// routes" (the drain sends one after withdrawing everything).
    pub fn ours(restart_time: u16, families: &[Afi], state: RestartState) -> GrCapability {
        GrCapability {
            restart_state: state.restarted,
            notification: false,
            restart_time: restart_time.min(MAX_RESTART_TIME),
            families: families
                .iter()
                .map(|f| GrFamily {
                    afi: f.code(),
                    safi: SAFI_UNICAST,
                    forwarding: state.forwarding,
                })
                .collect(),
        }
    }

    pub fn to_capability(&self) -> Capability {
        let mut head = self.restart_time & MAX_RESTART_TIME;
        if self.restart_state {
            head |= RESTART_STATE;
        }
        if self.notification {
            head |= NOTIFICATION;
        }
        let mut value = head.to_be_bytes().to_vec();
        for f in &self.families {
            value.extend_from_slice(&f.afi.to_be_bytes());
            value.push(f.safi);
            value.push(if f.forwarding { FORWARDING } else { 0 });
        }
        Capability::Unknown { code: CODE, value }
    }

    /// Decodes a capability 64 value. `None` when it is not one or is malformed
    /// (a length that is not 2 + 4n): RFC 5492 lets us ignore it.
    pub fn from_capability(c: &Capability) -> Option<GrCapability> {
        let Capability::Unknown { code: CODE, value } = c else {
            return None;
        };
        if value.len() < 2 || (value.len() - 2) % 4 != 0 {
            return None;
        }
        let head = u16::from_be_bytes([value[0], value[1]]);
        Some(GrCapability {
            restart_state: head & RESTART_STATE != 0,
            notification: head & NOTIFICATION != 0,
            restart_time: head & MAX_RESTART_TIME,
            families: value[2..]
                .chunks_exact(4)
                .map(|c| GrFamily {
                    afi: u16::from_be_bytes([c[0], c[1]]),
                    safi: c[2],
                    forwarding: c[3] & FORWARDING != 0,
                })
                .collect(),
        })
    }

    /// The peer's capability, if its OPEN carries a valid one.
    pub fn from_open(o: &Open) -> Option<GrCapability> {
        o.capabilities.iter().find_map(Self::from_capability)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ours_encodes_as_rfc_4724_bytes() {
        let st = RestartState {
            restarted: true,
            forwarding: true,
        };
        let c = GrCapability::ours(120, &[Afi::Ipv4, Afi::Ipv6], st).to_capability();
        assert_eq!(
            c,
            Capability::Unknown {
                code: 64,
                // R + 120 s; IPv4 unicast F; IPv6 unicast F
                value: vec![0x80, 0x78, 0, 1, 1, 0x80, 0, 2, 1, 0x80],
            }
        );
        let fresh = GrCapability::ours(4095, &[Afi::Ipv4], RestartState::default());
        assert_eq!(
            fresh.to_capability(),
            Capability::Unknown {
                code: 64,
                value: vec![0x0f, 0xff, 0, 1, 1, 0],
            }
        );
        assert_eq!(
            GrCapability::ours(5000, &[], st).restart_time,
            4095,
            "12 bits"
        );
    }

    #[test]
    fn decodes_both_ways_and_ignores_malformed_values() {
        let c = GrCapability::ours(90, &[Afi::Ipv6], RestartState::default());
        assert_eq!(GrCapability::from_capability(&c.to_capability()), Some(c));
        // BIRD's helper-only capability: N bit, time 120, no family.
        let bird = Capability::Unknown {
            code: 64,
            value: vec![0x40, 0x78],
        };
        let d = GrCapability::from_capability(&bird).unwrap();
        assert!(d.notification && !d.restart_state && d.families.is_empty());
        assert_eq!(d.restart_time, 120);
        for bad in [vec![], vec![0], vec![0, 0, 0, 1, 1]] {
            let c = Capability::Unknown {
                code: 64,
                value: bad.clone(),
            };
            assert_eq!(GrCapability::from_capability(&c), None, "{bad:?}");
        }
        assert_eq!(
            GrCapability::from_capability(&Capability::RouteRefresh),
            None
        );
    }

    #[test]
    fn travels_in_an_open_and_back() {
        let mut o = Open::new(65011, 9, "10.0.0.11".parse().unwrap(), &[Afi::Ipv4]);
        assert_eq!(GrCapability::from_open(&o), None);
        let c = GrCapability::ours(
            30,
            &[Afi::Ipv4],
            RestartState {
                restarted: false,
                forwarding: true,
            },
        );
        o.capabilities.push(c.to_capability());
        let bytes = crate::codec::Message::Open(o).encode().unwrap();
        match crate::codec::decode(&bytes, true).unwrap() {
            crate::codec::Decoded::Message(crate::codec::Message::Open(back)) => {
                assert_eq!(GrCapability::from_open(&back), Some(c));
            }
            other => panic!("{other:?}"),
        }
    }
}
