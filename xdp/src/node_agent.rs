//! Whether the node agent's tc ingress program runs on an interface: the edge
//! passes the packets of pods on its own node up its XDP interface, and only
//! that program delivers them (docs/datapath.md, Pods on edge nodes).

use aya::programs::{SchedClassifier, tc::TcAttachType};

/// The prefix of the node agent's program names (`ringlb_node_ingress`; the
/// kernel keeps 15 characters of a name).
const NODE_PROGRAM: &str = "ringlb_node_";

/// `Some(true)` when a tcx ingress program of the node agent is attached to
/// `iface` (in the calling thread's network namespace), `Some(false)` when
/// none is, `None` when this cannot be asked (no tcx before Linux 6.6, where
/// the node agent attaches through a clsact qdisc instead, or no such
/// interface).
pub fn ingress_attached(iface: &str) -> Option<bool> {
    let (_, progs) = SchedClassifier::query_tcx(iface, TcAttachType::Ingress).ok()?;
    Some(
        progs
            .iter()
            .any(|p| p.name_as_str().is_some_and(|n| n.starts_with(NODE_PROGRAM))),
    )
}
