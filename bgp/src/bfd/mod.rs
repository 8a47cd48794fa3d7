//! BFD (RFC 5880, single hop over UDP per RFC 5881), asynchronous mode, so a BGP
//! peer that stops forwarding is noticed in a fraction of a second instead of at the
//! end of the hold time.
//!
//! ```text
//!  UDP :3784 (v4, v6) ── rx task (socket.rs): TTL 255 check, decode, drop + count
//!        │                 malformed packets, find the session by discriminator
//!        │                 (or by source address while the peer does not know ours)
//!        v  Rx(Control) (mpsc)
//!  ┌─────────────────────────────┐  Control ──> tx socket (src port 49152-65535,
//!  │ BFD session task (task.rs)  │               TTL 255), one per session
//!  │ Session FSM (fsm.rs, pure)  │
//!  │ + tx / detection timers     │── BfdStatus (watch) ──> callers, metrics
//!  └─────────────────────────────┘── PeerCmd::BfdDown ──> the BGP peer task
//! ```
//!
//! - `packet`: the Control packet codec (encoding cannot fail; decoding checks
//!   everything RFC 5880 §6.8.6 asks for and returns a typed error).
//! - `fsm`: the session state machine, pure: events in, actions out, no clock.
//! - `task`: the I/O task of one session; `socket`: the shared receive sockets.
//! - `metrics`: `ringlb_bfd_*`.
//!
//! Not implemented: authentication (packets with the A bit are dropped), demand mode,
//! the echo function, multihop (RFC 5883).

pub mod fsm;
pub mod hold;
pub mod metrics;
pub mod packet;
pub mod socket;
pub mod task;

use std::time::Duration;

use serde::Deserialize;

use super::{Error, invalid};

/// The UDP port of single-hop BFD Control packets (RFC 5881 §4).
pub const CONTROL_PORT: u16 = 3784;
/// NOTIFICATION Cease subcode "BFD Down" (RFC 9384), sent when BFD resets a session.
pub const CEASE_BFD_DOWN: u8 = 10;
/// Default timers: 300 ms x 3 (detection in about 0.9 s), as FRR.
pub const DEFAULT_INTERVAL_MS: u32 = 300;
pub const DEFAULT_MULTIPLIER: u8 = 3;

/// BFD settings as a `BGPPeer` or the standalone file gives them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BfdSpec {
    #[serde(default)]
    pub min_rx_ms: Option<u32>,
    #[serde(default)]
    pub min_tx_ms: Option<u32>,
    #[serde(default)]
    pub multiplier: Option<u8>,
}

/// The checked BFD settings of one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BfdConfig {
    /// Required Min RX Interval: the fastest we accept packets.
    pub min_rx: Duration,
    /// Desired Min TX Interval once the session is Up.
    pub min_tx: Duration,
    /// Detect Mult.
    pub multiplier: u8,
    /// Destination UDP port (3784; other values only in tests).
    pub port: u16,
}

impl BfdConfig {
    pub fn from_spec(s: &BfdSpec) -> Result<BfdConfig, Error> {
        let ms = |f: &str, v: Option<u32>| match v.unwrap_or(DEFAULT_INTERVAL_MS) {
            v @ 10..=60_000 => Ok(Duration::from_millis(u64::from(v))),
            v => Err(invalid(
                format!("bfd.{f}"),
                format!("{v} ms is outside 10..60000"),
            )),
        };
        let multiplier = s.multiplier.unwrap_or(DEFAULT_MULTIPLIER);
        if multiplier == 0 {
            return Err(invalid("bfd.multiplier", "must be 1..255"));
        }
        Ok(BfdConfig {
            min_rx: ms("minRxMs", s.min_rx_ms)?,
            min_tx: ms("minTxMs", s.min_tx_ms)?,
            multiplier,
            port: CONTROL_PORT,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_defaults_and_limits() {
        let c = BfdConfig::from_spec(&BfdSpec::default()).unwrap();
        assert_eq!(c.min_rx, Duration::from_millis(300));
        assert_eq!(c.min_tx, Duration::from_millis(300));
        assert_eq!((c.multiplier, c.port), (3, 3784));
        let e = BfdConfig::from_spec(&BfdSpec {
            min_tx_ms: Some(5),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("bfd.minTxMs"), "{e}");
        let e = BfdConfig::from_spec(&BfdSpec {
            multiplier: Some(0),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("bfd.multiplier"), "{e}");
    }
}
