//! `BGPAdvertisement`: what to say about VIPs of selected pools, to selected peers.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, LabelSelector};

/// Attributes attached to VIP announcements.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ringlb.io",
    version = "v1alpha1",
    kind = "BGPAdvertisement",
    plural = "bgpadvertisements",
    shortname = "bgpadv",
    status = "BGPAdvertisementStatus",
    printcolumn = r#"{"name":"LocalPref","type":"integer","jsonPath":".spec.localPref"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BGPAdvertisementSpec {
    /// Pools whose VIPs this applies to. Empty selects every pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_pool_selector: Option<LabelSelector>,
    /// Peers this applies to. Empty selects every peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_selector: Option<LabelSelector>,
    /// Standard communities, `ASN:VALUE` (each 0..65535).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub communities: Vec<String>,
    /// Large communities (RFC 8092), `GLOBAL:LOCAL1:LOCAL2` (each 0..4294967295).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub large_communities: Vec<String>,
    /// LOCAL_PREF for iBGP peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_pref: Option<u32>,
    /// Announce an aggregate of this length instead of host routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregation_length: Option<AggregationLength>,
}

/// Aggregation prefix lengths per family.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AggregationLength {
    /// 0..32, default 32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v4: Option<u8>,
    /// 0..128, default 128.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v6: Option<u8>,
}

/// Observed state of a `BGPAdvertisement`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BGPAdvertisementStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
