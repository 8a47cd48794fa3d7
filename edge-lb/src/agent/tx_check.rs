//! Whether the XDP program's transmits reach the wire.
//!
//! An `XDP_TX` or redirect the driver cannot send is dropped in the driver and
//! counted only among its own statistics (`ethtool -S`: veth's
//! `rx_queue_0_xdp_tx_errors` when native XDP runs on a veth whose peer has no XDP
//! program). The program counts those packets as sent, so nothing else shows the
//! loss. Every counters tick the agent reads the driver's XDP transmit error
//! counters (`ringlb_xdp::ethtool`) next to the program's `tx` + `redirect`; when
//! the errors grow, the edge is not ready (`/readyz` names the fault), every
//! `/health/vip/...` page answers 503 with the reason, `ringlb_xdp_tx_failing` is 1,
//! and a log line and a Warning Event `XDPTransmitFailing` on the Node say so. An
//! interval in which the program sent and the errors did not grow clears it.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use ringlb_datapath::Counters;

use crate::vip_health::Board;

/// The `/readyz` fault name.
pub const FAULT: &str = "xdp-transmit";

/// One reading: the driver's XDP transmit errors and the program's sends, both
/// cumulative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub errors: u64,
    pub sent: u64,
}

/// What one interval showed, when it changed the verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// `errors` of the program's `sent` transmits failed in the interval.
    Failing { errors: u64, sent: u64 },
    /// The program sent and nothing failed.
    Recovered,
}

/// The verdict over successive samples (pure).
#[derive(Debug, Default)]
pub struct TxWatch {
    last: Option<Sample>,
    failing: bool,
}

impl TxWatch {
    /// Takes a sample; returns the change of verdict it makes, if any. The first
    /// sample (and one after a counter went back, a driver reset) is a baseline.
    pub fn observe(&mut self, s: Sample) -> Option<Change> {
        let last = self.last.replace(s)?;
        if s.errors < last.errors || s.sent < last.sent {
            return None;
        }
        let (errors, sent) = (s.errors - last.errors, s.sent - last.sent);
        if errors > 0 {
            let first = !self.failing;
            self.failing = true;
            return first.then_some(Change::Failing { errors, sent });
        }
        if self.failing && sent > 0 {
            self.failing = false;
            return Some(Change::Recovered);
        }
        None
    }

    pub fn failing(&self) -> bool {
        self.failing
    }
}

/// The fault text for `iface` (readiness, health pages, log, Event).
pub fn reason(iface: &str, errors: u64, sent: u64) -> String {
    format!(
        "XDP transmits fail on {iface}: the driver counted {errors} xdp tx errors while the \
         program sent {sent} packets (a veth drops native XDP_TX unless its peer runs an XDP \
         program: --xdp-mode generic)"
    )
}

/// The program's transmits in `c` (`tx` + `redirect`).
pub fn sent(c: &Counters) -> u64 {
    c.global
        .iter()
        .filter(|(l, _)| *l == "tx" || *l == "redirect")
        .map(|(_, v)| *v)
        .sum()
}

/// The watch of one interface and where it reports.
pub struct TxCheck {
    iface: String,
    watch: TxWatch,
    errors: Gauge,
    failing: Gauge,
    /// The driver has no XDP transmit error counters (said once).
    no_counters: bool,
}

impl TxCheck {
    /// Registers `ringlb_xdp_driver_tx_errors` and `ringlb_xdp_tx_failing`.
    pub fn new(iface: &str, registry: &mut Registry) -> Self {
        let (errors, failing) = (Gauge::default(), Gauge::default());
        registry.register(
            "xdp_driver_tx_errors",
            "XDP transmits the driver of the XDP interface failed (its ethtool -S xdp tx/xmit error counters, summed)",
            errors.clone(),
        );
        registry.register(
            "xdp_tx_failing",
            "1 while the driver's XDP transmit errors grow (the edge is then not ready)",
            failing.clone(),
        );
        Self {
            iface: iface.into(),
            watch: TxWatch::default(),
            errors,
            failing,
            no_counters: false,
        }
    }

    /// Reads the driver's counters (in the calling thread's network namespace)
    /// beside the program's counters `c`, and reports a change of verdict to
    /// `health` (the fault [`FAULT`]), `board` (every VIP's page), the metrics and
    /// the log. Returns the reason when the transmits start failing (for the
    /// caller's Event: [`event`]).
    pub fn check(
        &mut self,
        c: &Counters,
        health: &ringlb_ops::Health,
        board: &Board,
    ) -> Option<String> {
        let stats = match ringlb_xdp::ethtool::driver_stats(&self.iface) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(iface = %self.iface, error = %e, "reading the driver's statistics");
                return None;
            }
        };
        let Some(errors) = ringlb_xdp::ethtool::xdp_tx_errors(&stats.stats) else {
            if !self.no_counters {
                self.no_counters = true;
                tracing::info!(iface = %self.iface, driver = %stats.driver, "the driver counts no XDP transmit errors: failed transmits cannot be seen");
            }
            return None;
        };
        self.errors.set(errors as i64);
        let change = self.watch.observe(Sample {
            errors,
            sent: sent(c),
        });
        match change {
            Some(Change::Failing { errors, sent }) => {
                let why = reason(&self.iface, errors, sent);
                tracing::error!(iface = %self.iface, driver = %stats.driver, errors, sent, "{why}");
                self.failing.set(1);
                health.set_fault(FAULT, Some(why.clone()));
                board.set_datapath_fault(Some(why.clone()));
                Some(why)
            }
            Some(Change::Recovered) => {
                tracing::info!(iface = %self.iface, "XDP transmits succeed again");
                self.failing.set(0);
                health.set_fault(FAULT, None);
                board.set_datapath_fault(None);
                None
            }
            None => None,
        }
    }
}

/// The Warning on the Node.
pub fn event(why: String) -> Event {
    Event {
        type_: EventType::Warning,
        reason: "XDPTransmitFailing".into(),
        note: Some(why),
        action: "CheckXDPTransmit".into(),
        secondary: None,
    }
}

/// The Node `name`, for Events.
pub fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(errors: u64, sent: u64) -> Sample {
        Sample { errors, sent }
    }

    #[test]
    fn growing_errors_fail_and_a_clean_interval_with_sends_recovers() {
        let mut w = TxWatch::default();
        assert_eq!(w.observe(s(5, 100)), None, "a baseline");
        assert_eq!(w.observe(s(5, 200)), None, "sent, no errors");
        assert_eq!(
            w.observe(s(45, 240)),
            Some(Change::Failing {
                errors: 40,
                sent: 40
            })
        );
        assert!(w.failing());
        assert_eq!(w.observe(s(80, 275)), None, "still failing: said once");
        assert_eq!(w.observe(s(80, 275)), None, "no traffic: no evidence");
        assert!(w.failing());
        assert_eq!(w.observe(s(80, 300)), Some(Change::Recovered));
        assert!(!w.failing());
        // a driver reset (counters back to 0) is a new baseline, not a verdict
        assert_eq!(w.observe(s(0, 310)), None);
        assert_eq!(
            w.observe(s(3, 320)),
            Some(Change::Failing {
                errors: 3,
                sent: 10
            })
        );
    }

    #[test]
    fn the_reason_names_the_interface_the_errors_and_the_fix() {
        let r = reason("eth0", 40, 40);
        assert!(r.contains("eth0") && r.contains("40 xdp tx errors"), "{r}");
        assert!(r.contains("--xdp-mode generic"), "{r}");
        let c = Counters {
            global: vec![("tx", 7), ("redirect", 3), ("pass_not_vip", 100)],
            ..Default::default()
        };
        assert_eq!(sent(&c), 10);
        let e = event(r);
        assert_eq!(
            (e.type_, e.reason.as_str()),
            (EventType::Warning, "XDPTransmitFailing")
        );
        assert_eq!(node_ref("edge-1").kind.as_deref(), Some("Node"));
    }
}
