//! `IPPool`: where VIPs come from.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, LabelSelector};

/// A pool of addresses the controller may hand out as Service VIPs.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ringlb.io",
    version = "v1alpha1",
    kind = "IPPool",
    plural = "ippools",
    shortname = "ipp",
    status = "IPPoolStatus",
    printcolumn = r#"{"name":"Auto","type":"boolean","jsonPath":".spec.autoAssign"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"V4 Used","type":"integer","jsonPath":".status.ipv4.allocated"}"#,
    printcolumn = r#"{"name":"V4 Free","type":"string","jsonPath":".status.ipv4.free"}"#,
    printcolumn = r#"{"name":"V6 Used","type":"integer","jsonPath":".status.ipv6.allocated"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPPoolSpec {
    /// CIDRs in the pool, IPv4 or IPv6, e.g. `192.0.2.0/24` or `2001:db8::/64`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<String>,
    /// Explicit inclusive ranges, e.g. `{start: 192.0.2.10, end: 192.0.2.20}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<IPRange>,
    /// Whether Services that ask for no pool may get addresses from this one.
    #[serde(default = "default_true")]
    pub auto_assign: bool,
    /// Skip addresses ending in .0 and .255 (for clients with buggy stacks).
    #[serde(default)]
    pub avoid_buggy_ips: bool,
    /// Only Services whose labels match may use this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_selector: Option<LabelSelector>,
    /// Only Services in namespaces whose labels match may use this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Lower numbers are tried first when several pools match. Default 0.
    #[serde(default)]
    pub priority: i32,
}

fn default_true() -> bool {
    true
}

/// An inclusive address range of one family.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPRange {
    /// First address of the range.
    pub start: String,
    /// Last address of the range (inclusive).
    pub end: String,
}

/// Observed state of an `IPPool`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPPoolStatus {
    /// IPv4 usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<FamilyUsage>,
    /// IPv6 usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<FamilyUsage>,
    /// `Ready`, `Overlapping`, `Invalid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Allocated and free counts for one address family.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FamilyUsage {
    /// Addresses currently held by Services.
    pub allocated: u64,
    /// Addresses still free, as a decimal string (an IPv6 pool can exceed 2^64).
    pub free: String,
}
