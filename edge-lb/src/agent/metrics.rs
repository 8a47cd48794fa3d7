//! Prometheus metrics of the datapath, fed from `Datapath::counters` (XDP: the
//! per-CPU BPF counters summed over CPUs; IPVS: its per-service counters and its
//! nftables guard's named counters).
//! Registered under the program's `ringlb_` prefix and the datapath's name
//! (`xdp`, `ipvs`):
//!
//! - `ringlb_<dp>_packets_total{reason}`: XDP, every verdict/reason of `abi::Stat`
//!   (`tx`, `pass_not_vip`, `pass_mtu`, `drop_fib`, `ct_hit`, ...); IPVS, the
//!   guard's drops under the same labels (`drop_no_service`, `drop_vip_icmp`,
//!   `drop_vip_other`, `drop_source_range`)
//! - `ringlb_<dp>_vip_packets_total{vip}`, `ringlb_<dp>_vip_bytes_total{vip}`
//! - `ringlb_<dp>_vip_dropped_total{vip,reason}`: packets to the VIP the datapath
//!   dropped on purpose (`source_range`, a source outside the Service's
//!   `loadBalancerSourceRanges`; the global count is
//!   `ringlb_<dp>_packets_total{reason="drop_source_range"}`)
//! - `ringlb_<dp>_apply_seconds`: time of one apply (plan + kernel writes)
//! - `ringlb_<dp>_apply_errors_total{kind}`
//!
//! The kernel counters are absolute; `update` adds the difference since the
//! last call (a counter that went down, e.g. a VIP re-created, starts over).
//! A VIP that is no longer in the counters (the service went away) loses its
//! two series, so deleted services do not stay in /metrics forever.

use std::collections::BTreeMap;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use ringlb_datapath::{Counters, Error};

pub type Labels = Vec<(String, String)>;

#[derive(Clone)]
pub struct DatapathMetrics {
    pub packets: Family<Labels, Counter>,
    pub vip_packets: Family<Labels, Counter>,
    pub vip_bytes: Family<Labels, Counter>,
    pub vip_dropped: Family<Labels, Counter>,
    pub apply_seconds: Histogram,
    pub apply_errors: Family<Labels, Counter>,
    last: std::sync::Arc<std::sync::Mutex<BTreeMap<(String, String), u64>>>,
}

impl DatapathMetrics {
    /// Registers the metrics of the datapath `name` (`xdp`, `ipvs`).
    pub fn register(registry: &mut Registry, name: &str) -> Self {
        let m = Self {
            packets: Family::default(),
            vip_packets: Family::default(),
            vip_bytes: Family::default(),
            vip_dropped: Family::default(),
            apply_seconds: Histogram::new([1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0]),
            apply_errors: Family::default(),
            last: Default::default(),
        };
        let sub = registry.sub_registry_with_prefix(name);
        let what = name.to_uppercase();
        sub.register(
            "packets",
            format!("{what} packets by verdict/reason"),
            m.packets.clone(),
        );
        sub.register(
            "vip_packets",
            format!("{what} packets per VIP"),
            m.vip_packets.clone(),
        );
        sub.register(
            "vip_bytes",
            format!("{what} bytes per VIP"),
            m.vip_bytes.clone(),
        );
        sub.register(
            "vip_dropped",
            format!("{what} packets per VIP dropped on purpose, by reason"),
            m.vip_dropped.clone(),
        );
        sub.register(
            "apply_seconds",
            "Time to apply a desired-state change to the datapath",
            m.apply_seconds.clone(),
        );
        sub.register(
            "apply_errors",
            "Failed applies by kind",
            m.apply_errors.clone(),
        );
        m
    }

    /// Adds what the kernel counted since the last call.
    pub fn update(&self, c: &Counters) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let mut add =
            |family: &Family<Labels, Counter>, kind: &str, label: (&str, String), now: u64| {
                let key = (kind.to_string(), label.1.clone());
                let before = last.insert(key, now).unwrap_or(0);
                let delta = if now >= before { now - before } else { now };
                if delta > 0 {
                    family
                        .get_or_create(&vec![(label.0.to_string(), label.1)])
                        .inc_by(delta);
                }
            };
        for (reason, v) in &c.global {
            add(&self.packets, "g", ("reason", reason.to_string()), *v);
        }
        let mut present = std::collections::BTreeSet::new();
        for (vip, p, b) in &c.per_vip {
            let label = vip.to_string();
            add(&self.vip_packets, "p", ("vip", label.clone()), *p);
            add(&self.vip_bytes, "b", ("vip", label.clone()), *b);
            present.insert(label);
        }
        for (vip, reason, n) in &c.per_vip_dropped {
            let labels = vec![
                ("vip".to_string(), vip.to_string()),
                ("reason".to_string(), reason.to_string()),
            ];
            let key = (format!("d{reason}"), vip.to_string());
            let before = last.insert(key, *n).unwrap_or(0);
            let delta = if *n >= before { *n - before } else { *n };
            if delta > 0 {
                self.vip_dropped.get_or_create(&labels).inc_by(delta);
            }
        }
        // VIPs gone since the last call: drop their series and their memory
        let gone: Vec<(String, String)> = last
            .keys()
            .filter(|(kind, l)| kind != "g" && !present.contains(l))
            .cloned()
            .collect();
        for (kind, label) in gone {
            let vip = ("vip".to_string(), label.clone());
            match kind.strip_prefix('d') {
                Some(reason) => {
                    let labels = vec![vip, ("reason".to_string(), reason.to_string())];
                    self.vip_dropped.remove(&labels);
                }
                None => {
                    self.vip_packets.remove(&vec![vip.clone()]);
                    self.vip_bytes.remove(&vec![vip]);
                }
            }
            last.remove(&(kind, label));
        }
    }

    /// Records one apply's outcome.
    pub fn observe_apply(&self, seconds: f64, result: Result<(), &Error>) {
        self.apply_seconds.observe(seconds);
        if let Err(e) = result {
            self.apply_errors
                .get_or_create(&vec![("kind".into(), e.metric_label().into())])
                .inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlb_datapath::{Proto, Vip};

    fn text(r: &Registry) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, r).unwrap();
        s
    }

    #[test]
    fn counters_become_monotonic_metrics() {
        let mut r = Registry::with_prefix("ringlb");
        let m = DatapathMetrics::register(&mut r, "xdp");
        let vip = Vip {
            addr: "10.0.0.1".parse().unwrap(),
            port: 80,
            proto: Proto::Tcp,
        };
        m.update(&Counters {
            global: vec![("tx", 10), ("pass_mtu", 0)],
            per_vip: vec![(vip, 10, 640)],
            per_vip_dropped: vec![(vip, "source_range", 3)],
        });
        m.update(&Counters {
            global: vec![("tx", 15), ("pass_mtu", 2)],
            per_vip: vec![(vip, 15, 960)],
            per_vip_dropped: vec![(vip, "source_range", 7)],
        });
        let t = text(&r);
        assert!(
            t.contains("ringlb_xdp_packets_total{reason=\"tx\"} 15"),
            "{t}"
        );
        assert!(
            t.contains("ringlb_xdp_packets_total{reason=\"pass_mtu\"} 2"),
            "{t}"
        );
        assert!(
            t.contains("ringlb_xdp_vip_bytes_total{vip=\"10.0.0.1:80/tcp\"} 960"),
            "{t}"
        );
        assert!(
            t.contains(
                "ringlb_xdp_vip_dropped_total{vip=\"10.0.0.1:80/tcp\",reason=\"source_range\"} 7"
            ),
            "{t}"
        );
        m.observe_apply(
            0.0002,
            Err(&ringlb_xdp::Error::IdsExhausted {
                what: "VIP",
                max: 1,
            }
            .into()),
        );
        let t = text(&r);
        assert!(
            t.contains("ringlb_xdp_apply_errors_total{kind=\"ids_exhausted\"} 1"),
            "{t}"
        );
        assert!(t.contains("ringlb_xdp_apply_seconds_count 1"), "{t}");
    }

    #[test]
    fn a_deleted_vip_loses_its_series() {
        let mut r = Registry::with_prefix("ringlb");
        let m = DatapathMetrics::register(&mut r, "xdp");
        let vip = |last: u8| Vip {
            addr: std::net::IpAddr::from([10, 0, 0, last]),
            port: 80,
            proto: Proto::Tcp,
        };
        m.update(&Counters {
            global: vec![("tx", 3)],
            per_vip: vec![(vip(1), 1, 64), (vip(2), 2, 128)],
            per_vip_dropped: vec![(vip(1), "source_range", 1)],
        });
        let t = text(&r);
        assert!(t.contains("vip=\"10.0.0.1:80/tcp\""), "{t}");
        assert!(t.contains("vip=\"10.0.0.2:80/tcp\""), "{t}");
        // VIP 1 is deleted: its packet and byte series go, VIP 2's stay
        m.update(&Counters {
            global: vec![("tx", 5)],
            per_vip: vec![(vip(2), 4, 256)],
            ..Default::default()
        });
        let t = text(&r);
        assert!(!t.contains("10.0.0.1:80/tcp"), "{t}");
        assert!(
            t.contains("ringlb_xdp_vip_packets_total{vip=\"10.0.0.2:80/tcp\"} 4"),
            "{t}"
        );
        assert!(
            t.contains("ringlb_xdp_packets_total{reason=\"tx\"} 5"),
            "{t}"
        );
        // re-created, it starts from its new kernel counter
        m.update(&Counters {
            global: vec![("tx", 6)],
            per_vip: vec![(vip(1), 1, 64), (vip(2), 4, 256)],
            ..Default::default()
        });
        let t = text(&r);
        assert!(
            t.contains("ringlb_xdp_vip_bytes_total{vip=\"10.0.0.1:80/tcp\"} 64"),
            "{t}"
        );
    }
}
