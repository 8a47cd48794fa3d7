//! BFD metrics, registered under the program's `ringlb_` prefix:
//!
//! - `ringlb_bfd_session_state{peer}`: 0 AdminDown, 1 Down, 2 Init, 3 Up (RFC 5880).
//! - `ringlb_bfd_transitions_total{peer,state}`: state changes, by the new state.
//! - `ringlb_bfd_detection_time_milliseconds{peer}`: the negotiated detection time.
//! - `ringlb_bfd_packets_sent_total{peer}`, `ringlb_bfd_packets_received_total{peer}`.
//! - `ringlb_bfd_packets_dropped_total{reason}`: malformed, wrong TTL, unknown session
//!   (no peer label: the source of garbage is not ours to enumerate).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::Labels;

#[derive(Clone, Default)]
pub struct BfdMetrics {
    pub session_state: Family<Labels, Gauge>,
    pub transitions: Family<Labels, Counter>,
    pub detection_time_ms: Family<Labels, Gauge>,
    pub sent: Family<Labels, Counter>,
    pub received: Family<Labels, Counter>,
    pub dropped: Family<Labels, Counter>,
}

impl BfdMetrics {
    pub fn register(registry: &mut Registry) -> BfdMetrics {
        let m = BfdMetrics::default();
        let sub = registry.sub_registry_with_prefix("bfd");
        sub.register(
            "session_state",
            "BFD session state per peer: 0 AdminDown, 1 Down, 2 Init, 3 Up",
            m.session_state.clone(),
        );
        sub.register(
            "transitions",
            "BFD state changes, by the new state",
            m.transitions.clone(),
        );
        sub.register(
            "detection_time_milliseconds",
            "Negotiated BFD detection time",
            m.detection_time_ms.clone(),
        );
        sub.register("packets_sent", "BFD Control packets sent", m.sent.clone());
        sub.register(
            "packets_received",
            "Valid BFD Control packets received",
            m.received.clone(),
        );
        sub.register(
            "packets_dropped",
            "BFD packets dropped (malformed, wrong TTL, unknown session), by reason",
            m.dropped.clone(),
        );
        m
    }

    pub fn drop(&self, reason: &str) {
        self.dropped
            .get_or_create(&vec![("reason".to_string(), reason.to_string())])
            .inc();
    }

    pub fn transition(&self, peer: &str, state: &str) {
        self.transitions
            .get_or_create(&vec![
                ("peer".to_string(), peer.to_string()),
                ("state".to_string(), state.to_string()),
            ])
            .inc();
    }
}
