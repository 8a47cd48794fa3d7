//! `BGPPeer`: a router the edges open a BGP session to.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, LabelSelector, SecretKeyRef};

/// A BGP neighbour (usually a top-of-rack switch) of the selected edge nodes.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ringlb.io",
    version = "v1alpha1",
    kind = "BGPPeer",
    plural = "bgppeers",
    shortname = "bgpp",
    status = "BGPPeerStatus",
    printcolumn = r#"{"name":"Peer","type":"string","jsonPath":".spec.peerAddress"}"#,
    printcolumn = r#"{"name":"Peer ASN","type":"integer","jsonPath":".spec.peerASN"}"#,
    printcolumn = r#"{"name":"My ASN","type":"integer","jsonPath":".spec.myASN"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BGPPeerSpec {
    /// The peer's IPv4 or IPv6 address.
    pub peer_address: String,
    /// The peer's AS number (1..4294967295).
    #[serde(rename = "peerASN")]
    pub peer_asn: u32,
    /// Our AS number (1..4294967295).
    #[serde(rename = "myASN")]
    pub my_asn: u32,
    /// TCP port of the peer. Default 179.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Proposed hold time in seconds: 0 (no keepalives) or at least 3. Default 90.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_time: Option<u16>,
    /// Keepalive interval in seconds. Default holdTime / 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive_time: Option<u16>,
    /// Secret key holding the TCP MD5 password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<SecretKeyRef>,
    /// Allow an eBGP peer this many hops away (1..255).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ebgp_multihop: Option<u8>,
    /// Local address to open the session from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_address: Option<String>,
    /// Which nodes peer with this router. Empty selects every edge node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
}

/// Observed state of a `BGPPeer`, one entry per edge node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BGPPeerStatus {
    /// Session state as seen by each node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeSession>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One node's session with the peer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSession {
    /// Node name.
    pub node: String,
    /// RFC 4271 state: Idle, Connect, Active, OpenSent, OpenConfirm, Established.
    pub state: String,
    /// Prefixes advertised to the peer.
    #[serde(default)]
    pub advertised: u32,
    /// When the state last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition: Option<String>,
    /// The last error, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}
