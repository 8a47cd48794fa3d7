//! Per-peer Prometheus metrics, registered into the program's registry (which adds the
//! `ringlb_` prefix): `ringlb_bgp_session_state{peer}` (BGP4-MIB numbering, 6 =
//! Established), `ringlb_bgp_updates_sent_total`, `ringlb_bgp_updates_received_total`,
//! `ringlb_bgp_prefixes_advertised`, `ringlb_bgp_session_flaps_total`,
//! `ringlb_bgp_errors_total{peer,error}` and `ringlb_bgp_last_error_timestamp_seconds`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub type Labels = Vec<(String, String)>;

#[derive(Clone, Default)]
pub struct BgpMetrics {
    pub session_state: Family<Labels, Gauge>,
    pub updates_sent: Family<Labels, Counter>,
    pub updates_received: Family<Labels, Counter>,
    pub prefixes_advertised: Family<Labels, Gauge>,
    pub flaps: Family<Labels, Counter>,
    pub errors: Family<Labels, Counter>,
    pub last_error_ts: Family<Labels, Gauge>,
}

impl BgpMetrics {
    pub fn register(registry: &mut Registry) -> BgpMetrics {
        let m = BgpMetrics::default();
        let sub = registry.sub_registry_with_prefix("bgp");
        sub.register(
            "session_state",
            "BGP FSM state per peer: 1 Idle, 2 Connect, 3 Active, 4 OpenSent, 5 OpenConfirm, 6 Established",
            m.session_state.clone(),
        );
        sub.register(
            "updates_sent",
            "UPDATE messages sent",
            m.updates_sent.clone(),
        );
        sub.register(
            "updates_received",
            "UPDATE messages received",
            m.updates_received.clone(),
        );
        sub.register(
            "prefixes_advertised",
            "Prefixes currently in the peer's Adj-RIB-Out",
            m.prefixes_advertised.clone(),
        );
        sub.register(
            "session_flaps",
            "Times the session left Established",
            m.flaps.clone(),
        );
        sub.register(
            "errors",
            "Session errors by kind (NOTIFICATION sent/received, TCP, decode)",
            m.errors.clone(),
        );
        sub.register(
            "last_error_timestamp_seconds",
            "Unix time of the last session error",
            m.last_error_ts.clone(),
        );
        m
    }

    pub fn peer(peer: &str) -> Labels {
        vec![("peer".to_string(), peer.to_string())]
    }

    pub fn error(&self, peer: &str, kind: &str) {
        let mut l = Self::peer(peer);
        l.push(("error".to_string(), kind.to_string()));
        self.errors.get_or_create(&l).inc();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        self.last_error_ts.get_or_create(&Self::peer(peer)).set(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_with_prefix_and_peer_label() {
        let mut r = Registry::with_prefix("ringlb");
        let m = BgpMetrics::register(&mut r);
        m.session_state
            .get_or_create(&BgpMetrics::peer("10.0.0.1"))
            .set(6);
        m.error("10.0.0.1", "hold_timer_expired");
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &r).unwrap();
        assert!(
            s.contains("ringlb_bgp_session_state{peer=\"10.0.0.1\"} 6"),
            "{s}"
        );
        assert!(
            s.contains("ringlb_bgp_errors_total{peer=\"10.0.0.1\",error=\"hold_timer_expired\"} 1"),
            "{s}"
        );
    }
}
