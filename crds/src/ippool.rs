//! `IPPool`: where VIPs come from.

// Every type here is re-exported at the crate root. The lint also fires on the
// copies of the structs that the `KubeSchema` derive generates for their CEL
// rules, which nothing can reach; hence the allow for this module.
#![allow(unreachable_pub)]

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, LabelSelector, ValidationError, ValidationErrors};

/// Most CIDRs or ranges one pool may list (bounds the CEL cost the API server estimates).
pub const MAX_BLOCKS: usize = 64;

/// CEL on each `cidrs` entry: no host bits set (`10.9.1.5/24` is refused, not widened).
/// On the entry, not the list: the API server then names the entry's index, and the
/// message's cost is bounded by the entry's `maxLength`.
const HOST_BITS_RULE: &str = "!isCIDR(self) || cidr(self) == cidr(self).masked()";

/// CEL message for [`HOST_BITS_RULE`]: the entry, as `validate()` says.
/// (`string(cidr(self).masked())` would name the network too, but kube-apiserver
/// estimates a CIDR's string as unbounded and refuses the CRD over its cost.)
const HOST_BITS_MESSAGE: &str =
    "self + ' has host bits set; write its network address or list the addresses in ranges'";

/// The schema of `cidrs`: a bounded list of bounded strings, each free of host bits.
fn cidrs_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": MAX_BLOCKS,
        "items": {
            "type": "string",
            "maxLength": 64,
            "x-kubernetes-validations": [{
                "rule": HOST_BITS_RULE,
                "messageExpression": HOST_BITS_MESSAGE,
            }],
        },
    })
}

/// A pool of addresses the controller may hand out as Service VIPs.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ringlb.io",
    version = "v1alpha1",
    kind = "IPPool",
    doc = "A pool of addresses ringlb hands out as Service VIPs.",
    plural = "ippools",
    shortname = "ipp",
    status = "IPPoolStatus",
    printcolumn = r#"{"name":"Auto","type":"boolean","jsonPath":".spec.autoAssign"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"V4 Used","type":"integer","jsonPath":".status.ipv4.allocated"}"#,
    printcolumn = r#"{"name":"V4 Free","type":"string","jsonPath":".status.ipv4.free"}"#,
    printcolumn = r#"{"name":"V6 Used","type":"integer","jsonPath":".status.ipv6.allocated"}"#,
    printcolumn = r#"{"name":"V6 Free","type":"string","jsonPath":".status.ipv6.free"}"#,
    printcolumn = r#"{"name":"Overlapping","type":"string","jsonPath":".status.conditions[?(@.type==\"Overlapping\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new(
    "(has(self.cidrs) && size(self.cidrs) > 0) || (has(self.ranges) && size(self.ranges) > 0)"
).message("an IPPool needs at least one entry in cidrs or ranges"))]
#[serde(rename_all = "camelCase")]
pub struct IPPoolSpec {
    /// CIDRs in the pool, IPv4 or IPv6, e.g. `192.0.2.0/24` or `2001:db8::/64`. The
    /// address must be the network's (no host bits set: `10.9.1.5/24` is refused). The
    /// all-zeros address of an IPv6 CIDR shorter than /127 (the subnet-router anycast
    /// address, RFC 4291) is never handed out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "cidrs_schema")]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))")
        .message("every entry must be a CIDR such as 192.0.2.0/24 or 2001:db8::/64"))]
    pub cidrs: Vec<String>,
    /// Explicit inclusive ranges, e.g. `{start: 192.0.2.10, end: 192.0.2.20}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub ranges: Vec<IPRange>,
    /// Whether Services that ask for no pool may get addresses from this one.
    #[serde(default = "default_true")]
    pub auto_assign: bool,
    /// Skip IPv4 addresses ending in .0 and .255 (for clients with buggy stacks).
    #[serde(default, rename = "avoidBuggyIPs")]
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
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new(
    "!isIP(self.start) || !isIP(self.end) || ip(self.start).family() == ip(self.end).family()"
).message("start and end must be of the same address family"))]
#[x_kube(validation = Rule::new(
    "!isIP(self.start) || !isIP(self.end) || ip(self.start).family() != 4 || ip(self.end).family() != 4 || \
     (int(self.start.split('.')[0]) * 16777216 + int(self.start.split('.')[1]) * 65536 + \
      int(self.start.split('.')[2]) * 256 + int(self.start.split('.')[3])) <= \
     (int(self.end.split('.')[0]) * 16777216 + int(self.end.split('.')[1]) * 65536 + \
      int(self.end.split('.')[2]) * 256 + int(self.end.split('.')[3]))"
).message("start must not be after end"))]
#[serde(rename_all = "camelCase")]
pub struct IPRange {
    /// First address of the range.
    #[schemars(length(max = 45))]
    #[x_kube(validation = Rule::new("isIP(self)").message("must be an IP address"))]
    pub start: String,
    /// Last address of the range (inclusive).
    #[schemars(length(max = 45))]
    #[x_kube(validation = Rule::new("isIP(self)").message("must be an IP address"))]
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
    /// `Ready`, `Overlapping`, `Invalid`, and `Advertised` (`False`/`NoAdvertisement`
    /// while no `BGPAdvertisement` selects the pool, `False`/`NoPeer` while those that
    /// do select no `BGPPeer`: its addresses are handed out but sent to no router).
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

/// One parsed block of a pool: an inclusive range of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub start: IpAddr,
    pub end: IpAddr,
}

impl IPPoolSpec {
    /// An auto-assigned pool of `cidrs` with every other field at its default: the
    /// spec of a manifest that lists only `cidrs`.
    pub fn from_cidrs(cidrs: &[&str]) -> Self {
        IPPoolSpec {
            cidrs: cidrs.iter().map(|s| s.to_string()).collect(),
            ranges: vec![],
            auto_assign: true,
            avoid_buggy_ips: false,
            service_selector: None,
            namespace_selector: None,
            priority: 0,
        }
    }

    /// Checks the spec as the CRD schema does (and the IPv6 range order, which CEL
    /// cannot express) and returns its blocks, CIDRs first, then ranges.
    pub fn blocks(&self) -> Result<Vec<Block>, ValidationErrors> {
        let mut errors = Vec::new();
        let mut blocks = Vec::new();
        if self.cidrs.is_empty() && self.ranges.is_empty() {
            errors.push(ValidationError::new(
                "spec",
                "an IPPool needs at least one entry in cidrs or ranges",
            ));
        }
        if self.cidrs.len() > MAX_BLOCKS {
            errors.push(ValidationError::new(
                "spec.cidrs",
                format!("at most {MAX_BLOCKS} entries"),
            ));
        }
        if self.ranges.len() > MAX_BLOCKS {
            errors.push(ValidationError::new(
                "spec.ranges",
                format!("at most {MAX_BLOCKS} entries"),
            ));
        }
        for (i, cidr) in self.cidrs.iter().enumerate() {
            match cidr.parse::<IpNetwork>() {
                Ok(net) if net.ip() != net.network() => errors.push(ValidationError::new(
                    format!("spec.cidrs[{i}]"),
                    host_bits_message(cidr, &net),
                )),
                Ok(net) => blocks.push(Block {
                    start: net.network(),
                    end: net.broadcast_or_last(),
                }),
                Err(e) => errors.push(ValidationError::new(
                    format!("spec.cidrs[{i}]"),
                    format!("{cidr:?} is not a CIDR: {e}"),
                )),
            }
        }
        for (i, range) in self.ranges.iter().enumerate() {
            match range.parse(i) {
                Ok(b) => blocks.push(b),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(blocks)
        } else {
            Err(ValidationErrors(errors))
        }
    }

    /// Validates the spec; see [`IPPoolSpec::blocks`].
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        self.blocks().map(|_| ())
    }
}

impl IPRange {
    fn parse(&self, i: usize) -> Result<Block, ValidationError> {
        let field = |f: &str| format!("spec.ranges[{i}].{f}");
        let start: IpAddr = self.start.parse().map_err(|_| {
            ValidationError::new(
                field("start"),
                format!("{:?} is not an IP address", self.start),
            )
        })?;
        let end: IpAddr = self.end.parse().map_err(|_| {
            ValidationError::new(field("end"), format!("{:?} is not an IP address", self.end))
        })?;
        if start.is_ipv4() != end.is_ipv4() {
            return Err(ValidationError::new(
                format!("spec.ranges[{i}]"),
                "start and end must be of the same address family",
            ));
        }
        if start > end {
            return Err(ValidationError::new(
                format!("spec.ranges[{i}]"),
                format!("start {start} must not be after end {end}"),
            ));
        }
        Ok(Block { start, end })
    }
}

/// The refusal of a CIDR with host bits set, worded as the CRD's CEL message is.
fn host_bits_message(cidr: &str, net: &IpNetwork) -> String {
    let masked = IpNetwork::new(net.network(), net.prefix())
        .map_or_else(|_| net.network().to_string(), |n| n.to_string());
    format!(
        "{cidr} has host bits set; write its network address or list the addresses in ranges \
         (the network is {masked})"
    )
}

impl IPPoolSpec {
    /// The subnet-router anycast address (RFC 4291 section 2.6.1: the all-zeros host
    /// address) of every IPv6 CIDR shorter than /127, which the controller never hands
    /// out. A /127 (RFC 6164) or /128 has no such address. Entries that do not parse are
    /// skipped ([`IPPoolSpec::blocks`] reports them).
    pub fn reserved_addresses(&self) -> Vec<IpAddr> {
        self.cidrs
            .iter()
            .filter_map(|c| c.parse::<IpNetwork>().ok())
            .filter(|n| n.is_ipv6() && n.prefix() < 127)
            .map(|n| n.network())
            .collect()
    }
}

/// The last address of a network (its broadcast address for IPv4).
trait LastAddr {
    fn broadcast_or_last(&self) -> IpAddr;
}

impl LastAddr for IpNetwork {
    fn broadcast_or_last(&self) -> IpAddr {
        match self {
            IpNetwork::V4(n) => IpAddr::V4(n.broadcast()),
            IpNetwork::V6(n) => {
                let host_bits = 128 - u32::from(n.prefix());
                let net = u128::from(n.network());
                let mask = if host_bits == 128 {
                    u128::MAX
                } else {
                    (1u128 << host_bits) - 1
                };
                IpAddr::V6((net | mask).into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cidrs: &[&str], ranges: &[(&str, &str)]) -> IPPoolSpec {
        IPPoolSpec {
            ranges: ranges
                .iter()
                .map(|(s, e)| IPRange {
                    start: s.to_string(),
                    end: e.to_string(),
                })
                .collect(),
            ..IPPoolSpec::from_cidrs(cidrs)
        }
    }

    #[test]
    fn parses_blocks_of_both_families() {
        let b = spec(
            &["192.0.2.0/30", "2001:db8::/64"],
            &[("198.51.100.1", "198.51.100.9")],
        )
        .blocks()
        .unwrap();
        assert_eq!(b[0].start, "192.0.2.0".parse::<IpAddr>().unwrap());
        assert_eq!(b[0].end, "192.0.2.3".parse::<IpAddr>().unwrap());
        assert_eq!(
            b[1].end,
            "2001:db8::ffff:ffff:ffff:ffff".parse::<IpAddr>().unwrap()
        );
        assert_eq!(b[2].end, "198.51.100.9".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn errors_name_the_field() {
        let e = spec(&["10.0.0.0/33"], &[]).validate().unwrap_err();
        assert_eq!(e.0[0].field, "spec.cidrs[0]");
        let e = spec(&[], &[("10.0.0.9", "10.0.0.1")])
            .validate()
            .unwrap_err();
        assert_eq!(e.0[0].field, "spec.ranges[0]");
        assert!(e.to_string().contains("must not be after"), "{e}");
        let e = spec(&[], &[("2001:db8::9", "2001:db8::1")])
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("spec.ranges[0]"), "{e}");
        let e = spec(&[], &[("10.0.0.1", "2001:db8::1")])
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("same address family"), "{e}");
        let e = spec(&[], &[("10.0.0.x", "10.0.0.1")])
            .validate()
            .unwrap_err();
        assert_eq!(e.0[0].field, "spec.ranges[0].start");
        let e = spec(&[], &[]).validate().unwrap_err();
        assert_eq!(e.0[0].field, "spec");
    }

    #[test]
    fn host_bits_are_refused_naming_the_entry() {
        let e = spec(&["192.0.2.0/24", "10.9.1.5/24"], &[])
            .validate()
            .unwrap_err();
        assert_eq!(e.0.len(), 1, "{e}");
        assert_eq!(e.0[0].field, "spec.cidrs[1]");
        assert_eq!(
            e.0[0].message,
            "10.9.1.5/24 has host bits set; write its network address or list the addresses \
             in ranges (the network is 10.9.1.0/24)"
        );
        let e = spec(&["2001:db8::8/64"], &[]).validate().unwrap_err();
        assert!(
            e.to_string().contains("(the network is 2001:db8::/64)"),
            "{e}"
        );
        // A host route is its own network.
        spec(&["10.9.1.5/32", "2001:db8::5/128"], &[])
            .validate()
            .unwrap();
    }

    #[test]
    fn reserved_addresses_are_the_v6_subnet_router_anycast_ones() {
        let s = spec(
            &[
                "192.0.2.0/24",
                "2001:db8::/64",
                "2001:db8:1::/126",
                "2001:db8:2::/127",
                "2001:db8:3::/128",
            ],
            &[("2001:db8:4::", "2001:db8:4::9")],
        );
        let want: Vec<IpAddr> = ["2001:db8::", "2001:db8:1::"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(s.reserved_addresses(), want);
    }
}
