//! How the edge agent stops: a **drain** takes the edge out of service (RFC 8326
//! GRACEFUL_SHUTDOWN, the drain time, withdraw, Cease), a **restart** keeps it in
//! service across a new agent (an upgrade): the BGP sessions close without a
//! NOTIFICATION and nothing is withdrawn, so a ToR with graceful restart (RFC 4724)
//! keeps the edge's routes for the BGPPeer's `gracefulRestart.restartTime` while
//! the pinned XDP program and maps (or the IPVS services) forward on; the next agent
//! re-reads the maps, re-announces and sends End-of-RIB.
//!
//! ```text
//!  SIGINT ─────────────────────────────────────────────> drain
//!  SIGTERM, --on-sigterm drain ────────────────────────> drain
//!  SIGTERM, --on-sigterm restart, Node cordoned ───────> drain
//!            (or the Node cannot be read within 3 s)
//!  SIGTERM, --on-sigterm restart, a peer without
//!           gracefulRestart (or no peer at all) ───────> drain
//!  SIGTERM, --on-sigterm restart, Node schedulable ────> restart
//! ```

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, api::ListParams};
use ringlb_bgp::Speaker;
use tokio::signal::unix::{SignalKind, signal};

use super::{DatapathKind, RunArgs};

/// What SIGTERM means (`--on-sigterm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OnSigterm {
    /// Take the edge out of service: GRACEFUL_SHUTDOWN, --drain, withdraw, Cease.
    #[default]
    Drain,
    /// Hitless restart for an upgrade: close BGP without NOTIFICATION, withdraw
    /// nothing, leave the datapath forwarding; a cordoned Node still drains.
    Restart,
}

/// The signal that stopped the agent loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Term,
    Int,
}

/// What the agent does on its way out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Drain,
    Restart,
}

/// The decision, pure. `cordoned`: the Node's `spec.unschedulable`, `None` when
/// it could not be read; `all_gr`: every BGP peer has graceful restart (without it
/// a peer would drop the routes at once, and a drain is the gentler way out).
/// Returns the exit and why, for the log.
pub fn decide(
    flag: OnSigterm,
    sig: Stop,
    cordoned: Option<bool>,
    all_gr: bool,
) -> (Exit, &'static str) {
    match (sig, flag, cordoned) {
        (Stop::Int, _, _) => (Exit::Drain, "SIGINT always drains"),
        (Stop::Term, OnSigterm::Drain, _) => (Exit::Drain, "--on-sigterm drain"),
        (Stop::Term, OnSigterm::Restart, _) if !all_gr => (
            Exit::Drain,
            "a BGPPeer of this node has no gracefulRestart: draining instead of restarting",
        ),
        (Stop::Term, OnSigterm::Restart, Some(true)) => (
            Exit::Drain,
            "the Node is cordoned: taking the edge out of service",
        ),
        (Stop::Term, OnSigterm::Restart, Some(false)) => (
            Exit::Restart,
            "--on-sigterm restart and the Node is schedulable",
        ),
        (Stop::Term, OnSigterm::Restart, None) => (
            Exit::Drain,
            "the Node could not be read, so it may be leaving: draining (the safe side)",
        ),
    }
}

/// The Node's `spec.unschedulable` (cordon), read once with a short deadline. A
/// list with a `metadata.name` field selector, as the agent's Node reflector does:
/// the chart's RBAC grants list/watch on nodes, not get.
pub async fn node_cordoned(client: &Client, name: &str) -> Option<bool> {
    let nodes = Api::<Node>::all(client.clone());
    let lp = ListParams::default().fields(&format!("metadata.name={name}"));
    match tokio::time::timeout(Duration::from_secs(3), nodes.list(&lp)).await {
        Ok(Ok(l)) => match l.items.into_iter().next() {
            Some(n) => Some(n.spec.and_then(|s| s.unschedulable).unwrap_or(false)),
            None => {
                tracing::warn!(node = name, "reading the Node at SIGTERM: no such Node");
                None
            }
        },
        Ok(Err(e)) => {
            tracing::warn!(error = %e, node = name, "reading the Node at SIGTERM");
            None
        }
        Err(_) => {
            tracing::warn!(node = name, "reading the Node at SIGTERM timed out");
            None
        }
    }
}

/// The restart exit: BGP sessions closed without NOTIFICATION, nothing withdrawn,
/// the datapath left as it is, and BFD held by it (`crate::bfd_hold`).
pub async fn restart(speaker: Arc<Speaker>, bgp_task: tokio::task::JoinHandle<()>) {
    bgp_task.abort();
    let _ = bgp_task.await;
    if let Some(speaker) = sole(speaker).await {
        // Up BFD sessions of peers behind the XDP interface: left to the program
        // (bfd_hold), without AdminDown; the rest get AdminDown
        let held = speaker.bfd_hold_or_admin_down().await;
        tracing::info!(
            held = held.len(),
            "BFD: Up sessions handed to the datapath, the rest sent AdminDown"
        );
        speaker.abandon()
    }
    tracing::info!(
        "edge agent stopped for a restart: routes left to the peers' graceful restart, datapath forwarding"
    );
}

/// The speaker, once nothing else holds it. The tasks that shared it are aborted
/// by then, but an aborted task drops what it holds only when the runtime next
/// polls it, so this waits up to a second. `None` (logged): the sessions end with
/// the process, without a Cease.
async fn sole(mut speaker: Arc<Speaker>) -> Option<Speaker> {
    for _ in 0..20 {
        match Arc::try_unwrap(speaker) {
            Ok(s) => return Some(s),
            Err(shared) => speaker = shared,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!(
        holders = Arc::strong_count(&speaker),
        "speaker still shared at exit; sessions close with the process, without a Cease"
    );
    None
}

/// After a drain's withdrawal, how long an IPVS edge keeps its services before
/// removing them: the peers' time to act on the withdrawal (a ToR under load took
/// ~0.5 s in the IPVS lab). The chart's grace period is the drain time + 15 s.
pub const IPVS_LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// The drain exit: GRACEFUL_SHUTDOWN, the drain time, withdraw, Cease; XDP's
/// program and maps stay (the caller removes IPVS services afterwards).
pub async fn drain(args: &RunArgs, speaker: Arc<Speaker>, bgp_task: tokio::task::JoinHandle<()>) {
    tracing::info!(drain = ?args.drain, "shutting down: draining BGP");
    let mut term = match signal(SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "no SIGTERM handler for the drain");
            speaker.drain(args.drain).await;
            return;
        }
    };
    tokio::select! {
        _ = speaker.drain(args.drain) => {}
        _ = term.recv() => { tracing::warn!("second signal: cutting the drain short"); speaker.withdraw_all(); }
    }
    bgp_task.abort();
    let _ = bgp_task.await;
    if let Some(speaker) = sole(speaker).await {
        speaker.shutdown().await
    }
    match args.datapath {
        DatapathKind::Xdp => {
            tracing::info!(
                "edge agent stopped; XDP program and maps stay pinned for the next start"
            )
        }
        DatapathKind::Ipvs => tracing::info!("edge agent stopped; removing its IPVS services"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigterm_restarts_only_when_asked_and_the_node_is_not_cordoned() {
        use Exit::*;
        let d = |f, s, c| decide(f, s, c, true).0;
        assert_eq!(d(OnSigterm::Drain, Stop::Term, Some(false)), Drain);
        assert_eq!(d(OnSigterm::Drain, Stop::Term, None), Drain);
        assert_eq!(d(OnSigterm::Restart, Stop::Term, Some(false)), Restart);
        assert_eq!(d(OnSigterm::Restart, Stop::Term, None), Drain);
        assert_eq!(d(OnSigterm::Restart, Stop::Term, Some(true)), Drain);
        assert_eq!(d(OnSigterm::Restart, Stop::Int, Some(false)), Drain);
        let no_gr = decide(OnSigterm::Restart, Stop::Term, Some(false), false);
        assert_eq!(no_gr.0, Drain, "{}", no_gr.1);
    }
}
