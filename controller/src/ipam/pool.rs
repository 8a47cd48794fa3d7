//! Pools as the allocator sees them: parsed, validated address ranges plus the rules
//! (auto-assign, selectors, priority) that decide who may draw from them.
//!
//! An address is kept as a `u128` together with its [`Family`], so IPv4 and IPv6 share
//! one arithmetic and nothing ever enumerates a range.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ringlb_crds::IPPoolSpec;

/// An address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub fn other(self) -> Self {
        match self {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        }
    }

    /// The Kubernetes spelling (`IPv4`, `IPv6`), as in `spec.ipFamilies`.
    pub fn k8s_name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// Short label for metrics: `ipv4` / `ipv6`.
    pub fn label(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.k8s_name())
    }
}

/// The numeric value of an address.
pub fn ip_to_u128(ip: &IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(*a)),
        IpAddr::V6(a) => u128::from(*a),
    }
}

/// The address of `family` with numeric value `v` (truncated to 32 bits for IPv4).
pub fn u128_to_ip(family: Family, v: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

/// An inclusive range of addresses of one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub family: Family,
    pub start: u128,
    pub end: u128,
}

impl Range {
    pub fn contains(&self, ip: &IpAddr) -> bool {
        Family::of(ip) == self.family && (self.start..=self.end).contains(&ip_to_u128(ip))
    }

    pub fn first_ip(&self) -> IpAddr {
        u128_to_ip(self.family, self.start)
    }

    pub fn last_ip(&self) -> IpAddr {
        u128_to_ip(self.family, self.end)
    }

    pub fn overlaps(&self, other: &Range) -> bool {
        self.family == other.family && self.start <= other.end && other.start <= self.end
    }

    /// Number of addresses; saturates at `u128::MAX` for `::/0`.
    pub fn size(&self) -> u128 {
        (self.end - self.start).saturating_add(1)
    }

    /// Number of addresses `avoidBuggyIPs` skips (IPv4 .0 and .255), without iterating.
    pub fn buggy_count(&self) -> u128 {
        if self.family != Family::V4 {
            return 0;
        }
        // Count of x <= n with x % 256 == r.
        let upto = |n: u128, r: u128| if n < r { 0 } else { (n - r) / 256 + 1 };
        let below = |r: u128| {
            if self.start == 0 {
                0
            } else {
                upto(self.start - 1, r)
            }
        };
        (upto(self.end, 0) - below(0)) + (upto(self.end, 255) - below(255))
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first_ip(), self.last_ip())
    }
}

/// Whether `avoidBuggyIPs` skips this address (IPv4 ending in .0 or .255).
pub fn is_buggy(family: Family, v: u128) -> bool {
    family == Family::V4 && matches!(v & 0xff, 0 | 0xff)
}

/// A validated pool, ready for allocation.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    pub name: String,
    pub ranges: Vec<Range>,
    /// Addresses inside the ranges that are never handed out: the IPv6 subnet-router
    /// anycast address (RFC 4291 section 2.6.1) of each IPv6 CIDR shorter than /127.
    pub reserved: BTreeSet<IpAddr>,
    pub auto_assign: bool,
    pub avoid_buggy_ips: bool,
    pub priority: i32,
    pub service_selector: Option<Selector>,
    pub namespace_selector: Option<Selector>,
}

/// Why a pool spec cannot be used. One entry per bad field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PoolError {
    pub field: String,
    pub message: String,
}

impl PoolError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl Pool {
    /// Parses and validates an `IPPool` spec. Every problem is reported, not only the
    /// first, so the pool's `Invalid` condition names them all.
    pub fn from_spec(name: &str, spec: &IPPoolSpec) -> Result<Pool, Vec<PoolError>> {
        let mut errors = Vec::new();
        // The schema's rules (shared with the CRD, in ringlb-crds) first.
        let ranges: Vec<Range> = match spec.blocks() {
            Ok(blocks) => blocks
                .into_iter()
                .map(|b| Range {
                    family: Family::of(&b.start),
                    start: ip_to_u128(&b.start),
                    end: ip_to_u128(&b.end),
                })
                .collect(),
            Err(errs) => {
                errors.extend(
                    errs.0
                        .into_iter()
                        .map(|e| PoolError::new(e.field, e.message)),
                );
                Vec::new()
            }
        };
        for i in 0..ranges.len() {
            for j in (i + 1)..ranges.len() {
                if ranges[i].overlaps(&ranges[j]) {
                    errors.push(PoolError::new(
                        "spec",
                        format!("{} overlaps {} in the same pool", ranges[i], ranges[j]),
                    ));
                }
            }
        }
        let service_selector =
            Selector::parse("spec.serviceSelector", spec.service_selector.as_ref())
                .map_err(|e| errors.push(PoolError::new(e.field, e.message)))
                .ok()
                .flatten();
        let namespace_selector =
            Selector::parse("spec.namespaceSelector", spec.namespace_selector.as_ref())
                .map_err(|e| errors.push(PoolError::new(e.field, e.message)))
                .ok()
                .flatten();
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Pool {
            name: name.to_string(),
            ranges,
            reserved: spec.reserved_addresses().into_iter().collect(),
            auto_assign: spec.auto_assign,
            avoid_buggy_ips: spec.avoid_buggy_ips,
            priority: spec.priority,
            service_selector,
            namespace_selector,
        })
    }

    pub fn has_family(&self, family: Family) -> bool {
        self.ranges.iter().any(|r| r.family == family)
    }

    /// Whether the pool would hand out `ip` (inside a range, not reserved and, with
    /// `avoidBuggyIPs`, not a .0/.255 address).
    pub fn offers(&self, ip: &IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip))
            && !self.reserved.contains(ip)
            && !(self.avoid_buggy_ips && is_buggy(Family::of(ip), ip_to_u128(ip)))
    }

    /// Whether `ip` lies in the pool but is one of its [`Pool::reserved`] addresses.
    pub fn reserves(&self, ip: &IpAddr) -> bool {
        self.reserved.contains(ip) && self.covers(ip)
    }

    /// Whether the pool lies anywhere over `ip` (ignoring `avoidBuggyIPs`).
    pub fn covers(&self, ip: &IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip))
    }

    /// Whether a Service with these labels in a namespace with these labels may use
    /// this pool.
    pub fn admits(&self, service_labels: &Labels, namespace_labels: &Labels) -> bool {
        self.service_selector
            .as_ref()
            .is_none_or(|s| s.matches(service_labels))
            && self
                .namespace_selector
                .as_ref()
                .is_none_or(|s| s.matches(namespace_labels))
    }

    /// Usable addresses of one family (after `avoidBuggyIPs` and the reserved
    /// addresses), saturating.
    pub fn usable(&self, family: Family) -> u128 {
        // Reserved addresses are IPv6, so never also counted as buggy.
        let reserved = self
            .reserved
            .iter()
            .filter(|ip| Family::of(ip) == family && self.covers(ip))
            .count() as u128;
        self.ranges
            .iter()
            .filter(|r| r.family == family)
            .map(|r| {
                r.size()
                    - if self.avoid_buggy_ips {
                        r.buggy_count()
                    } else {
                        0
                    }
            })
            .fold(0u128, |a, b| a.saturating_add(b))
            .saturating_sub(reserved)
    }
}

pub use ringlb_crds::labels::{Labels, Selector};
