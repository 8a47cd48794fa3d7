//! `BGPPeer`: a router the edges open a BGP session to.

// Every type here is re-exported at the crate root. The lint also fires on the
// copies of the structs that the `KubeSchema` derive generates for their CEL
// rules, which nothing can reach; hence the allow for this module.
#![allow(unreachable_pub)]

use std::net::IpAddr;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, Errors, LabelSelector, SecretKeyRef, ValidationErrors};

/// A BGP neighbour (usually a top-of-rack switch) of the selected edge nodes.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ringlb.io",
    version = "v1alpha1",
    kind = "BGPPeer",
    doc = "A BGP neighbour (usually a top-of-rack switch) of the selected edge nodes.",
    plural = "bgppeers",
    shortname = "bgpp",
    status = "BGPPeerStatus",
    printcolumn = r#"{"name":"Peer","type":"string","jsonPath":".spec.peerAddress"}"#,
    printcolumn = r#"{"name":"Peer ASN","type":"integer","jsonPath":".spec.peerASN"}"#,
    printcolumn = r#"{"name":"My ASN","type":"integer","jsonPath":".spec.myASN"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new(
    "!has(self.keepaliveTime) || !has(self.holdTime) || self.holdTime == 0 || self.keepaliveTime < self.holdTime"
).message("keepaliveTime must be less than holdTime"))]
#[serde(rename_all = "camelCase")]
pub struct BGPPeerSpec {
    /// The peer's IPv4 or IPv6 address.
    #[schemars(length(max = 45))]
    #[x_kube(validation = Rule::new("isIP(self)").message("must be an IPv4 or IPv6 address"))]
    pub peer_address: String,
    /// The peer's AS number (1..4294967295).
    #[serde(rename = "peerASN")]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub peer_asn: u32,
    /// Our AS number (1..4294967295).
    #[serde(rename = "myASN")]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub my_asn: u32,
    /// TCP port of the peer. Default 179.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
    /// Proposed hold time in seconds: 0 (no keepalives) or at least 3. Default 90.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 65535))]
    #[x_kube(validation = Rule::new("self == 0 || self >= 3").message("must be 0 or at least 3 seconds"))]
    pub hold_time: Option<u16>,
    /// Keepalive interval in seconds. Default holdTime / 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 21845))]
    pub keepalive_time: Option<u16>,
    /// Secret key holding the TCP MD5 password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<SecretKeyRef>,
    /// Allow an eBGP peer this many hops away (1..255): the TTL (IPv4) or hop
    /// limit (IPv6) of the session's packets. Unset, an eBGP session sends TTL 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 255))]
    pub ebgp_multihop: Option<u8>,
    /// GTSM (RFC 5082): send TTL / hop limit 255 and drop the peer's packets that
    /// arrive with less than 256 - hops (hops = ebgpMultihop, default 1). The peer
    /// must do the same (BIRD: `ttl security on`). Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_security: Option<bool>,
    /// Graceful restart (RFC 4724), restarting-speaker side: advertise the
    /// capability, so that when the edge agent restarts without a drain the peer
    /// keeps the edge's routes for `restartTime` while the datapath forwards on.
    /// Unset: no graceful restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_restart: Option<GracefulRestart>,
    /// Local address to open the session from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 45))]
    #[x_kube(validation = Rule::new("isIP(self)").message("must be an IPv4 or IPv6 address"))]
    pub source_address: Option<String>,
    /// Which nodes peer with this router. Empty selects every edge node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Run BFD (RFC 5880/5881, single hop) with the peer; BFD Down resets the BGP
    /// session at once. Absent: no BFD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd: Option<BfdSpec>,
}

/// BFD timers of a `BGPPeer`. Detection time = the peer's multiplier x the slower of
/// our `minRxMs` and the peer's transmit interval.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BfdSpec {
    /// Fastest rate, in milliseconds, at which we accept BFD packets. Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 60000))]
    pub min_rx_ms: Option<u32>,
    /// Interval, in milliseconds, at which we would like to send. Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 60000))]
    pub min_tx_ms: Option<u32>,
    /// Packets missed in a row before the session is declared down. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 255))]
    pub multiplier: Option<u8>,
}

/// Graceful restart settings of a `BGPPeer`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GracefulRestart {
    /// Seconds the peer keeps our routes after the session drops, waiting for the
    /// restarted edge (1..4095). Default 120.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4095))]
    pub restart_time: Option<u16>,
}

/// Default graceful restart time in seconds (RFC 4724 suggests at most the hold time;
/// 120 covers a slow image pull of the agent).
pub const DEFAULT_RESTART_TIME: u16 = 120;

/// Observed state of a `BGPPeer`, one entry per edge node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BGPPeerStatus {
    /// Session state as seen by each node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeSession>,
    /// `Conflict` (True while a node runs no session for this peer because an earlier
    /// BGPPeer has the same peerAddress there; the message names it) and `Invalid`
    /// (True while a node cannot use the spec or the password Secret; reason
    /// `SecretNotFound`, `SecretKeyMissing`, `SecretUnreadable` or `InvalidSpec`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One node's session with the peer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSession {
    /// Node name.
    pub node: String,
    /// RFC 4271 state: Idle, Connect, Active, OpenSent, OpenConfirm, Established; or
    /// `Conflict` / `Invalid` when the node runs no session for this peer (`lastError`
    /// says why).
    pub state: String,
    /// Prefixes advertised to the peer.
    #[serde(default)]
    pub advertised: u32,
    /// The address families the session negotiated (`IPv4`, `IPv6`); empty while it
    /// is not Established. The controller's `ringlb.io/Announced` Service condition
    /// reads it: a VIP's route reaches a peer only over a session of its family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub families: Vec<String>,
    /// When the state last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition: Option<String>,
    /// The last error, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// Default hold time (RFC 4271 suggests 90 s).
pub const DEFAULT_HOLD_TIME: u16 = 90;
/// Default BGP port.
pub const DEFAULT_PORT: u16 = 179;

impl BGPPeerSpec {
    /// Checks the spec as the CRD schema does.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut e = Errors::default();
        if self.peer_address.parse::<IpAddr>().is_err() {
            e.push(
                "spec.peerAddress",
                format!("{:?} is not an IPv4 or IPv6 address", self.peer_address),
            );
        }
        if self.peer_asn == 0 {
            e.push("spec.peerASN", "must be 1..4294967295");
        }
        if self.my_asn == 0 {
            e.push("spec.myASN", "must be 1..4294967295");
        }
        if self.port == Some(0) {
            e.push("spec.port", "must be 1..65535");
        }
        if let Some(h) = self.hold_time
            && (1..3).contains(&h)
        {
            e.push("spec.holdTime", "must be 0 or at least 3 seconds");
        }
        if let Some(k) = self.keepalive_time {
            if k == 0 {
                e.push("spec.keepaliveTime", "must be at least 1 second");
            }
            if self.hold_time.is_some_and(|h| h != 0 && k >= h) {
                e.push("spec", "keepaliveTime must be less than holdTime");
            }
        }
        if self.ebgp_multihop == Some(0) {
            e.push("spec.ebgpMultihop", "must be 1..255");
        }
        if let Some(t) = self.graceful_restart.as_ref().and_then(|g| g.restart_time)
            && !(1..=4095).contains(&t)
        {
            e.push(
                "spec.gracefulRestart.restartTime",
                "must be 1..4095 seconds",
            );
        }
        if let Some(src) = &self.source_address
            && src.parse::<IpAddr>().is_err()
        {
            e.push(
                "spec.sourceAddress",
                format!("{src:?} is not an IPv4 or IPv6 address"),
            );
        }
        if let Some(b) = &self.bfd {
            for (f, v) in [("minRxMs", b.min_rx_ms), ("minTxMs", b.min_tx_ms)] {
                if v.is_some_and(|v| !(10..=60_000).contains(&v)) {
                    e.push(format!("spec.bfd.{f}"), "must be 10..60000 milliseconds");
                }
            }
            if b.multiplier == Some(0) {
                e.push("spec.bfd.multiplier", "must be 1..255");
            }
        }
        e.finish()
    }

    /// The hold time to propose, with the default applied.
    pub fn hold_time(&self) -> u16 {
        self.hold_time.unwrap_or(DEFAULT_HOLD_TIME)
    }

    /// The keepalive interval, with the default (holdTime / 3) applied.
    pub fn keepalive_time(&self) -> u16 {
        self.keepalive_time.unwrap_or(self.hold_time() / 3)
    }

    /// The graceful restart time, if graceful restart is on.
    pub fn restart_time(&self) -> Option<u16> {
        self.graceful_restart
            .as_ref()
            .map(|g| g.restart_time.unwrap_or(DEFAULT_RESTART_TIME))
    }

    /// The TCP port, with the default applied.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(DEFAULT_PORT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> BGPPeerSpec {
        BGPPeerSpec {
            peer_address: "10.0.0.1".into(),
            peer_asn: 65000,
            my_asn: 4_200_000_000,
            port: None,
            hold_time: Some(3),
            keepalive_time: Some(1),
            password_secret_ref: None,
            ebgp_multihop: None,
            ttl_security: None,
            graceful_restart: None,
            source_address: None,
            node_selector: None,
            bfd: None,
        }
    }

    #[test]
    fn good_peer_validates_and_defaults_apply() {
        let p = peer();
        p.validate().unwrap();
        assert_eq!(p.port(), 179);
        let p = BGPPeerSpec {
            hold_time: None,
            keepalive_time: None,
            ..peer()
        };
        assert_eq!((p.hold_time(), p.keepalive_time()), (90, 30));
        assert_eq!(p.restart_time(), None);
        let p = BGPPeerSpec {
            graceful_restart: Some(GracefulRestart::default()),
            ..peer()
        };
        assert_eq!(p.restart_time(), Some(120));
    }

    #[test]
    fn bad_peers_name_the_field() {
        let bad = [
            (
                BGPPeerSpec {
                    peer_asn: 0,
                    ..peer()
                },
                "spec.peerASN",
            ),
            (
                BGPPeerSpec {
                    my_asn: 0,
                    ..peer()
                },
                "spec.myASN",
            ),
            (
                BGPPeerSpec {
                    peer_address: "10.0.0".into(),
                    ..peer()
                },
                "spec.peerAddress",
            ),
            (
                BGPPeerSpec {
                    hold_time: Some(2),
                    keepalive_time: None,
                    ..peer()
                },
                "spec.holdTime",
            ),
            (
                BGPPeerSpec {
                    keepalive_time: Some(3),
                    ..peer()
                },
                "spec",
            ),
            (
                BGPPeerSpec {
                    source_address: Some("x".into()),
                    ..peer()
                },
                "spec.sourceAddress",
            ),
            (
                BGPPeerSpec {
                    graceful_restart: Some(GracefulRestart {
                        restart_time: Some(4096),
                    }),
                    ..peer()
                },
                "spec.gracefulRestart.restartTime",
            ),
            (
                BGPPeerSpec {
                    port: Some(0),
                    ..peer()
                },
                "spec.port",
            ),
            (
                BGPPeerSpec {
                    bfd: Some(BfdSpec {
                        min_rx_ms: Some(5),
                        ..Default::default()
                    }),
                    ..peer()
                },
                "spec.bfd.minRxMs",
            ),
            (
                BGPPeerSpec {
                    bfd: Some(BfdSpec {
                        multiplier: Some(0),
                        ..Default::default()
                    }),
                    ..peer()
                },
                "spec.bfd.multiplier",
            ),
        ];
        for (p, field) in bad {
            let e = p.validate().unwrap_err();
            assert_eq!(e.0[0].field, field, "{e}");
        }
    }
}
