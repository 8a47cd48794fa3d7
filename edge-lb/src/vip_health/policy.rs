//! A Service's health policy, from its annotations: how many ready backends make a
//! VIP:port healthy, what happens to the route below that, and the hold-down before
//! a VIP that went unhealthy counts as healthy again. Pure.

use std::collections::BTreeMap;
use std::time::Duration;

use ringlb_bgp::Deprefer;
use ringlb_crds::service::{ANNOTATION_HOLD_DOWN, ANNOTATION_MIN_READY, ANNOTATION_UNHEALTHY_BGP};
use ringlb_ops::flags::parse_duration;

/// The hold-down when the Service sets none.
pub const DEFAULT_HOLD_DOWN: Duration = Duration::from_secs(15);
/// The most AS_PATH prepends `ringlb.io/unhealthy-bgp` accepts.
pub const MAX_PREPEND: u8 = 10;

/// What happens to the route of a VIP:port below its threshold (that still has a
/// ready backend: one with none is always withdrawn).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Below {
    #[default]
    Withdraw,
    Deprefer(Deprefer),
}

/// One Service's health policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    pub min_ready: u32,
    pub below: Below,
    pub hold_down: Duration,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            min_ready: 1,
            below: Below::Withdraw,
            hold_down: DEFAULT_HOLD_DOWN,
        }
    }
}

/// The policy the annotations ask for. A bad annotation keeps its default and adds one
/// line to the returned problems (for a log line and an Event), never an error.
pub fn from_annotations(ann: Option<&BTreeMap<String, String>>) -> (HealthPolicy, Vec<String>) {
    let mut p = HealthPolicy::default();
    let mut problems = Vec::new();
    let Some(ann) = ann else {
        return (p, problems);
    };
    let mut bad = |key: &str, v: &str, why: String| {
        problems.push(format!("annotation {key}={v:?}: {why}; using the default"));
    };
    if let Some(v) = ann.get(ANNOTATION_MIN_READY) {
        match ringlb_crds::service::parse_min_ready(v) {
            Some(n) => p.min_ready = n,
            None => bad(ANNOTATION_MIN_READY, v, "not a whole number >= 1".into()),
        }
    }
    if let Some(v) = ann.get(ANNOTATION_UNHEALTHY_BGP) {
        match parse_below(v) {
            Ok(b) => p.below = b,
            Err(why) => bad(ANNOTATION_UNHEALTHY_BGP, v, why),
        }
    }
    if let Some(v) = ann.get(ANNOTATION_HOLD_DOWN) {
        match parse_duration(v) {
            Ok(d) if d <= Duration::from_secs(3600) => p.hold_down = d,
            Ok(_) => bad(ANNOTATION_HOLD_DOWN, v, "longer than 1h".into()),
            Err(why) => bad(ANNOTATION_HOLD_DOWN, v, why),
        }
    }
    (p, problems)
}

/// `withdraw`, or a comma list of `prepend=N` (1..=10), `med=N`, `local-pref=N`.
pub fn parse_below(v: &str) -> Result<Below, String> {
    let v = v.trim();
    if v == "withdraw" {
        return Ok(Below::Withdraw);
    }
    let mut d = Deprefer::default();
    for item in v.split(',').map(str::trim) {
        let Some((k, n)) = item.split_once('=') else {
            return Err(format!(
                "{item:?} is not withdraw or KEY=N (prepend, med, local-pref)"
            ));
        };
        let n: u32 = n
            .trim()
            .parse()
            .map_err(|_| format!("{item:?}: {n:?} is not a whole number"))?;
        match k.trim() {
            "prepend" => {
                d.prepend = u8::try_from(n)
                    .ok()
                    .filter(|p| (1..=MAX_PREPEND).contains(p))
                    .ok_or_else(|| format!("prepend={n}: from 1 to {MAX_PREPEND}"))?;
            }
            "med" => d.med = Some(n),
            "local-pref" => d.local_pref = Some(n),
            other => {
                return Err(format!("unknown key {other:?} (prepend, med, local-pref)"));
            }
        }
    }
    Ok(Below::Deprefer(d))
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

    #[test]
    fn defaults_without_annotations() {
        assert_eq!(from_annotations(None), (HealthPolicy::default(), vec![]));
        let (p, bad) = from_annotations(Some(&ann(&[("other", "x")])));
        assert_eq!(
            (p.min_ready, p.below, p.hold_down),
            (1, Below::Withdraw, DEFAULT_HOLD_DOWN)
        );
        assert!(bad.is_empty());
    }

    #[test]
    fn reads_every_annotation() {
        let (p, bad) = from_annotations(Some(&ann(&[
            (ANNOTATION_MIN_READY, "3"),
            (
                ANNOTATION_UNHEALTHY_BGP,
                "prepend=4, med=1000,local-pref=50",
            ),
            (ANNOTATION_HOLD_DOWN, "30s"),
        ])));
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(p.min_ready, 3);
        assert_eq!(
            p.below,
            Below::Deprefer(Deprefer {
                prepend: 4,
                med: Some(1000),
                local_pref: Some(50)
            })
        );
        assert_eq!(p.hold_down, Duration::from_secs(30));
        assert_eq!(parse_below("withdraw"), Ok(Below::Withdraw));
    }

    #[test]
    fn bad_values_keep_their_default_and_say_why() {
        let (p, bad) = from_annotations(Some(&ann(&[
            (ANNOTATION_MIN_READY, "0"),
            (ANNOTATION_UNHEALTHY_BGP, "prepend=99"),
            (ANNOTATION_HOLD_DOWN, "soon"),
        ])));
        assert_eq!(p, HealthPolicy::default());
        assert_eq!(bad.len(), 3, "{bad:?}");
        assert!(
            bad[0].contains("ringlb.io/min-ready-backends=\"0\""),
            "{bad:?}"
        );
        assert!(bad[1].contains("from 1 to 10"), "{bad:?}");
        assert!(bad[2].contains("not a duration"), "{bad:?}");
        for v in ["", "drop", "med", "med=x", "weight=3", "prepend=0"] {
            assert!(parse_below(v).is_err(), "{v:?} accepted");
        }
    }
}
