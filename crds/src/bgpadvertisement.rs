//! `BGPAdvertisement`: what to say about VIPs of selected pools, to selected peers.

// Every type here is re-exported at the crate root. The lint also fires on the
// copies of the structs that the `KubeSchema` derive generates for their CEL
// rules, which nothing can reach; hence the allow for this module.
#![allow(unreachable_pub)]

use std::fmt;
use std::str::FromStr;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, Errors, LabelSelector, ValidationErrors};

/// Attributes attached to VIP announcements.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ringlb.io",
    version = "v1alpha1",
    kind = "BGPAdvertisement",
    doc = "Attributes ringlb attaches to VIP announcements for selected pools and peers.",
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
    /// Standard communities (RFC 1997), `ASN:VALUE` with each part 0..65535.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 11)))]
    #[x_kube(validation = Rule::new(
        "self.all(c, c.matches('^[0-9]{1,5}:[0-9]{1,5}$') && int(c.split(':')[0]) <= 65535 && int(c.split(':')[1]) <= 65535)"
    ).message("each community must be ASN:VALUE with both parts 0..65535"))]
    pub communities: Vec<String>,
    /// Large communities (RFC 8092), `GLOBAL:LOCAL1:LOCAL2` with each part 0..4294967295.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 32)))]
    #[x_kube(validation = Rule::new(
        "self.all(c, c.matches('^[0-9]{1,10}:[0-9]{1,10}:[0-9]{1,10}$') && int(c.split(':')[0]) <= 4294967295 && int(c.split(':')[1]) <= 4294967295 && int(c.split(':')[2]) <= 4294967295)"
    ).message("each large community must be GLOBAL:LOCAL1:LOCAL2 with every part 0..4294967295"))]
    pub large_communities: Vec<String>,
    /// LOCAL_PREF sent to iBGP peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4294967295u32))]
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
    #[schemars(range(min = 0, max = 32))]
    pub v4: Option<u8>,
    /// 0..128, default 128.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 128))]
    pub v6: Option<u8>,
}

/// Observed state of a `BGPAdvertisement`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BGPAdvertisementStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A standard community, `ASN:VALUE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Community(pub u16, pub u16);

impl Community {
    /// GRACEFUL_SHUTDOWN, RFC 8326.
    pub const GRACEFUL_SHUTDOWN: Community = Community(65535, 0);

    /// The 32-bit value carried on the wire.
    pub const fn as_u32(self) -> u32 {
        ((self.0 as u32) << 16) | self.1 as u32
    }
}

impl FromStr for Community {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let err = || format!("{s:?} is not ASN:VALUE with both parts 0..65535");
        let (a, b) = s.split_once(':').ok_or_else(err)?;
        Ok(Community(
            a.parse().map_err(|_| err())?,
            b.parse().map_err(|_| err())?,
        ))
    }
}

impl fmt::Display for Community {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.0, self.1)
    }
}

/// A large community (RFC 8092), `GLOBAL:LOCAL1:LOCAL2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LargeCommunity(pub u32, pub u32, pub u32);

impl FromStr for LargeCommunity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let err = || format!("{s:?} is not GLOBAL:LOCAL1:LOCAL2 with every part 0..4294967295");
        let mut it = s.split(':');
        let mut next =
            || -> Result<u32, String> { it.next().ok_or_else(err)?.parse().map_err(|_| err()) };
        let v = LargeCommunity(next()?, next()?, next()?);
        if it.next().is_some() {
            return Err(err());
        }
        Ok(v)
    }
}

impl fmt::Display for LargeCommunity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.0, self.1, self.2)
    }
}

impl BGPAdvertisementSpec {
    /// The parsed standard communities.
    pub fn communities(&self) -> Result<Vec<Community>, ValidationErrors> {
        parse_all(&self.communities, "spec.communities")
    }

    /// The parsed large communities.
    pub fn large_communities(&self) -> Result<Vec<LargeCommunity>, ValidationErrors> {
        parse_all(&self.large_communities, "spec.largeCommunities")
    }

    /// Checks the spec as the CRD schema does.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut e = Errors::default();
        for r in [
            self.communities().map(|_| ()),
            self.large_communities().map(|_| ()),
        ] {
            if let Err(errs) = r {
                e.0.extend(errs.0);
            }
        }
        if let Some(agg) = &self.aggregation_length {
            if agg.v4.is_some_and(|l| l > 32) {
                e.push("spec.aggregationLength.v4", "must be 0..32");
            }
            if agg.v6.is_some_and(|l| l > 128) {
                e.push("spec.aggregationLength.v6", "must be 0..128");
            }
        }
        e.finish()
    }
}

fn parse_all<T: FromStr<Err = String>>(
    items: &[String],
    field: &str,
) -> Result<Vec<T>, ValidationErrors> {
    let mut e = Errors::default();
    let mut out = Vec::with_capacity(items.len());
    for (i, s) in items.iter().enumerate() {
        match s.parse() {
            Ok(v) => out.push(v),
            Err(msg) => e.push(format!("{field}[{i}]"), msg),
        }
    }
    e.finish().map(|()| out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adv() -> BGPAdvertisementSpec {
        BGPAdvertisementSpec {
            ip_pool_selector: None,
            peer_selector: None,
            communities: vec!["65000:100".into(), "65535:0".into()],
            large_communities: vec!["4200000000:1:2".into()],
            local_pref: Some(200),
            aggregation_length: None,
        }
    }

    #[test]
    fn parses_communities() {
        let a = adv();
        a.validate().unwrap();
        assert_eq!(a.communities().unwrap()[1], Community::GRACEFUL_SHUTDOWN);
        assert_eq!(Community::GRACEFUL_SHUTDOWN.as_u32(), 0xffff_0000);
        assert_eq!(
            a.large_communities().unwrap(),
            vec![LargeCommunity(4_200_000_000, 1, 2)]
        );
        assert_eq!(LargeCommunity(1, 2, 3).to_string(), "1:2:3");
    }

    #[test]
    fn bad_communities_name_the_entry() {
        let a = BGPAdvertisementSpec {
            communities: vec!["1:2".into(), "65536:1".into()],
            ..adv()
        };
        let e = a.validate().unwrap_err();
        assert_eq!(e.0[0].field, "spec.communities[1]");
        let a = BGPAdvertisementSpec {
            large_communities: vec!["1:2".into()],
            ..adv()
        };
        assert_eq!(
            a.validate().unwrap_err().0[0].field,
            "spec.largeCommunities[0]"
        );
        let a = BGPAdvertisementSpec {
            large_communities: vec!["1:2:3:4".into()],
            ..adv()
        };
        assert!(a.validate().is_err());
        let a = BGPAdvertisementSpec {
            aggregation_length: Some(AggregationLength {
                v4: Some(33),
                v6: None,
            }),
            ..adv()
        };
        assert_eq!(
            a.validate().unwrap_err().0[0].field,
            "spec.aggregationLength.v4"
        );
    }
}
