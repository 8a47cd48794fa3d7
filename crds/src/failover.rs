//! The cross-region failover annotations, shared by the controller and the
//! edges. Pure: a Service's annotations and its own VIPs in, what they ask for and
//! what is wrong with them out.
//!
//! Region A's Service names a remote VIP (`ringlb.io/failover-vip`, region B's VIP of
//! the same app): while A has no ready local pod, A's edges send that VIP's new flows
//! to B's VIP (IPIP, as to a pod); `ringlb.io/failover-weight` keeps a trickle going
//! there while A is healthy. Region B's Service accepts A's VIP
//! (`ringlb.io/accept-failover-from`): B's edges serve A's VIP:port as a failover
//! alias of B's pods, for the IPIP packets A's edges send to B's VIP.
//!
//! A bad value never drops the Service: it is served without that part, and the
//! reason is returned for a log line, an Event or a condition message.

use std::collections::BTreeMap;
use std::net::IpAddr;

/// Region A: the remote VIP that takes this Service's new flows while it has no
/// ready local backend (same port and protocol, same address family).
pub const ANNOTATION_FAILOVER_VIP: &str = "ringlb.io/failover-vip";
/// Region A: percent (0..=50, default 0) of new flows sent to the failover VIP while
/// local backends ARE ready.
pub const ANNOTATION_FAILOVER_WEIGHT: &str = "ringlb.io/failover-weight";
/// Region B: remote VIPs, comma-separated, accepted as failover aliases of each of
/// this Service's ports.
pub const ANNOTATION_ACCEPT_FAILOVER_FROM: &str = "ringlb.io/accept-failover-from";
/// The controller's condition on a Service with a failover VIP.
pub const CONDITION_FAILOVER_ACTIVE: &str = "ringlb.io/FailoverActive";
/// The largest `ringlb.io/failover-weight`.
pub const MAX_FAILOVER_WEIGHT: u8 = 50;

/// What a Service's failover annotations ask for, after validation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailoverSpec {
    /// The remote VIP (`ringlb.io/failover-vip`), when set and valid.
    pub remote: Option<IpAddr>,
    /// Percent of new flows to `remote` while local backends are ready.
    pub weight: u8,
    /// Remote VIPs accepted as aliases (`ringlb.io/accept-failover-from`), valid
    /// ones only, sorted, without duplicates.
    pub accept: Vec<IpAddr>,
    /// One line per bad value (left out of the fields above).
    pub problems: Vec<String>,
}

impl FailoverSpec {
    /// The failover VIP for the Service VIP `vip`: only one of its family.
    pub fn remote_for(&self, vip: IpAddr) -> Option<IpAddr> {
        self.remote.filter(|r| r.is_ipv4() == vip.is_ipv4())
    }
}

/// An address another region's VIP can be: IPv4 (the receiving edge decapsulates
/// IPv4-in-IPv4 only; an IPv6 failover VIP would be announced and black-holed), not
/// unspecified, loopback or multicast.
fn parse_vip(v: &str) -> Result<IpAddr, String> {
    let ip: IpAddr = v
        .trim()
        .parse()
        .map_err(|_| format!("{:?} is not an IPv4 address", v.trim()))?;
    if ip.is_ipv6() {
        return Err(format!(
            "{ip}: IPv6 failover is not supported (edges decapsulate IPv4-in-IPv4 only)"
        ));
    }
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
        return Err(format!("{ip} is not a unicast address"));
    }
    Ok(ip)
}

/// Reads the failover annotations of a Service whose VIPs are `own` (its
/// `status.loadBalancer.ingress`; may be empty before allocation, when the family
/// is not checked).
pub fn from_annotations(ann: Option<&BTreeMap<String, String>>, own: &[IpAddr]) -> FailoverSpec {
    let Some(ann) = ann else {
        return FailoverSpec::default();
    };
    let mut problems = Vec::new();
    let mut bad = |key: &str, v: &str, why: String| {
        problems.push(format!("annotation {key}={v:?}: {why}; ignored"));
    };
    let mut remote = None;
    if let Some(v) = ann.get(ANNOTATION_FAILOVER_VIP) {
        match parse_vip(v) {
            Err(why) => bad(ANNOTATION_FAILOVER_VIP, v, why),
            Ok(ip) if own.contains(&ip) => bad(
                ANNOTATION_FAILOVER_VIP,
                v,
                "the Service's own VIP cannot be its failover VIP".into(),
            ),
            Ok(ip) if !own.is_empty() && !own.iter().any(|o| o.is_ipv4() == ip.is_ipv4()) => {
                let fam = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
                bad(
                    ANNOTATION_FAILOVER_VIP,
                    v,
                    format!("the Service has no {fam} VIP for it to back up"),
                )
            }
            Ok(ip) => remote = Some(ip),
        }
    }
    let mut weight = 0;
    if let Some(v) = ann.get(ANNOTATION_FAILOVER_WEIGHT) {
        match v.trim().parse::<u8>() {
            Ok(w) if w <= MAX_FAILOVER_WEIGHT && remote.is_some() => weight = w,
            Ok(w) if w <= MAX_FAILOVER_WEIGHT => {
                if w > 0 {
                    let why = format!("needs a valid {ANNOTATION_FAILOVER_VIP}");
                    bad(ANNOTATION_FAILOVER_WEIGHT, v, why);
                }
            }
            _ => bad(
                ANNOTATION_FAILOVER_WEIGHT,
                v,
                format!("not a whole percent from 0 to {MAX_FAILOVER_WEIGHT}"),
            ),
        }
    }
    let mut accept = Vec::new();
    if let Some(v) = ann.get(ANNOTATION_ACCEPT_FAILOVER_FROM) {
        let mut listed = false;
        for item in v.split(',').filter(|i| !i.trim().is_empty()) {
            listed = true;
            match parse_vip(item) {
                Err(why) => bad(ANNOTATION_ACCEPT_FAILOVER_FROM, v, why),
                Ok(ip) if own.contains(&ip) => bad(
                    ANNOTATION_ACCEPT_FAILOVER_FROM,
                    v,
                    format!("{ip} is the Service's own VIP"),
                ),
                Ok(ip) => accept.push(ip),
            }
        }
        if !listed {
            bad(ANNOTATION_ACCEPT_FAILOVER_FROM, v, "no address".into());
        }
    }
    accept.sort();
    accept.dedup();
    FailoverSpec {
        remote,
        weight,
        accept,
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const OWN: &[&str] = &["192.0.2.1", "2001:db8::1"];

    fn own() -> Vec<IpAddr> {
        OWN.iter().map(|s| ip(s)).collect()
    }

    #[test]
    fn nothing_set_is_nothing_asked() {
        assert_eq!(from_annotations(None, &own()), FailoverSpec::default());
        let s = from_annotations(Some(&ann(&[("other", "x")])), &own());
        assert_eq!(s, FailoverSpec::default());
    }

    #[test]
    fn reads_every_annotation() {
        let s = from_annotations(
            Some(&ann(&[
                (ANNOTATION_FAILOVER_VIP, " 198.51.100.7 "),
                (ANNOTATION_FAILOVER_WEIGHT, "1"),
                (
                    ANNOTATION_ACCEPT_FAILOVER_FROM,
                    "203.0.113.9, 203.0.113.10,203.0.113.9,",
                ),
            ])),
            &own(),
        );
        assert!(s.problems.is_empty(), "{:?}", s.problems);
        assert_eq!(s.remote, Some(ip("198.51.100.7")));
        assert_eq!(s.weight, 1);
        assert_eq!(s.accept, vec![ip("203.0.113.9"), ip("203.0.113.10")]);
        // A dual-stack Service: the IPv4 failover VIP backs up the IPv4 VIP only.
        assert_eq!(s.remote_for(ip("192.0.2.1")), Some(ip("198.51.100.7")));
        assert_eq!(s.remote_for(ip("2001:db8::1")), None);
        // Before allocation the family cannot be checked: accepted.
        let s = from_annotations(
            Some(&ann(&[(ANNOTATION_FAILOVER_VIP, "198.51.100.9")])),
            &[],
        );
        assert_eq!((s.remote, s.problems.len()), (Some(ip("198.51.100.9")), 0));
    }

    #[test]
    fn every_bad_value_is_left_out_and_said() {
        let v4_only = [ip("192.0.2.1")];
        let cases: &[(&str, &str, &str)] = &[
            (ANNOTATION_FAILOVER_VIP, "region-b", "not an IPv4 address"),
            (ANNOTATION_FAILOVER_VIP, "192.0.2.1", "own VIP cannot be"),
            (
                ANNOTATION_FAILOVER_VIP,
                "2001:db8:2::5",
                "IPv6 failover is not supported",
            ),
            (
                ANNOTATION_ACCEPT_FAILOVER_FROM,
                "2001:db8:2::5",
                "IPv6 failover is not supported",
            ),
            (ANNOTATION_FAILOVER_VIP, "0.0.0.0", "not a unicast"),
            (ANNOTATION_FAILOVER_VIP, "127.0.0.1", "not a unicast"),
            (ANNOTATION_FAILOVER_VIP, "224.0.0.1", "not a unicast"),
            (ANNOTATION_FAILOVER_WEIGHT, "51", "from 0 to 50"),
            (ANNOTATION_FAILOVER_WEIGHT, "-1", "from 0 to 50"),
            (ANNOTATION_FAILOVER_WEIGHT, "1%", "from 0 to 50"),
            (ANNOTATION_FAILOVER_WEIGHT, "5", "needs a valid"),
            (ANNOTATION_ACCEPT_FAILOVER_FROM, "192.0.2.1", "own VIP"),
            (ANNOTATION_ACCEPT_FAILOVER_FROM, "a.b.c.d", "not an IPv4"),
            (ANNOTATION_ACCEPT_FAILOVER_FROM, " , ", "no address"),
        ];
        for (key, value, why) in cases {
            let s = from_annotations(Some(&ann(&[(key, value)])), &v4_only);
            assert_eq!(s.problems.len(), 1, "{key}={value}: {:?}", s.problems);
            assert!(
                s.problems[0].contains(why),
                "{key}={value}: {:?}",
                s.problems
            );
            assert!(s.problems[0].contains(key), "{:?}", s.problems);
            assert_eq!((s.remote, s.weight), (None, 0), "{key}={value}");
            assert!(s.accept.is_empty(), "{key}={value}");
        }
        // One bad entry of a list leaves the good ones; a bad weight keeps the VIP.
        let s = from_annotations(
            Some(&ann(&[
                (ANNOTATION_ACCEPT_FAILOVER_FROM, "x, 203.0.113.9"),
                (ANNOTATION_FAILOVER_VIP, "198.51.100.7"),
                (ANNOTATION_FAILOVER_WEIGHT, "99"),
            ])),
            &v4_only,
        );
        assert_eq!(s.accept, vec![ip("203.0.113.9")]);
        assert_eq!((s.remote, s.weight), (Some(ip("198.51.100.7")), 0));
        assert_eq!(s.problems.len(), 2, "{:?}", s.problems);
        // Weight 0 without a failover VIP is harmless.
        let s = from_annotations(Some(&ann(&[(ANNOTATION_FAILOVER_WEIGHT, "0")])), &own());
        assert!(s.problems.is_empty(), "{:?}", s.problems);
    }
}
