//! The kernel IPVS datapath: the same desired state as the XDP datapath
//! (VIP:port:protocol -> pod IPs with weights), programmed into IPVS over
//! generic netlink, with the Maglev scheduler `mh`, and real servers reached by
//! IPIP tunnel or direct routing.
//!
//! ```text
//!  Desired (pure)        plan() (pure)                  IpvsDatapath (I/O)
//!  ServiceKey ->  ---->  Vec<Op>, ordered so no   --->  Kernel: genetlink IPVS +
//!   backends             service is ever without         rtnetlink (VIPs on lo),
//!   + weights            a real server                   or in memory for tests
//!                        (diff against `Held`, what
//!                         the kernel holds)
//! ```
//!
//! - `codec`: the wire format, pure, with byte fixtures and a bounded fuzz.
//! - `model`: services and real servers as values.
//! - `plan`: desired + held -> operations, pure.
//! - `kernel`: the `Kernel` trait; `NetlinkKernel` (sockets) and
//!   `MemoryKernel` (feature `memory-kernel`, tests).
//! - `datapath`: `IpvsDatapath`, the planner over a kernel, re-reading the
//!   kernel after a failed write (the rule of ringlb-xdp's `apply.rs`).
//!
//! - `seam`: `IpvsDatapath` behind the edge agent's `ringlb_datapath::Datapath`
//!   (the seam's `DesiredState` -> [`plan::Desired`]).
//! - `guard`: the nftables table in front of IPVS (source ranges, and drops of
//!   what is addressed to a VIP address but no VIP:port), written by
//!   `IpvsDatapath` when made [`IpvsDatapath::with_guard`].
//!
//! This crate does not depend on ringlb-xdp (that would pull aya into the IPVS
//! path): the seam lives in the light `ringlb-datapath`, and the planner takes its
//! own small [`plan::Desired`].

pub mod codec;
pub mod datapath;
pub mod guard;
pub mod kernel;
pub mod model;
pub mod plan;
pub mod seam;

pub use datapath::{ApplyStats, IpvsDatapath};
pub use kernel::Kernel;
pub use model::{Dest, DestKey, Forward, Proto, Service, ServiceKey};
pub use plan::{Backend, Config, Desired, DestOrder, Held, Op, plan};

use codec::DecodeError;

/// Errors of the IPVS datapath.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("this kernel has no IPVS (modprobe ip_vs ip_vs_mh)")]
    NoIpvs,
    #[error("the IPVS scheduler {name:?} is not available (modprobe ip_vs_{name})")]
    NoScheduler { name: String },
    #[error("service {service}: {reason}")]
    InvalidService { service: String, reason: String },
    #[error("{op} {target}: the kernel answered {}", std::io::Error::from_raw_os_error(-*errno))]
    Kernel {
        op: &'static str,
        target: String,
        errno: i32,
    },
    #[error("netlink {op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("netlink {op}: {source}")]
    Decode {
        op: &'static str,
        #[source]
        source: DecodeError,
    },
    #[error("netlink {op}: no answer in time")]
    Timeout { op: &'static str },
    #[error("the view of IPVS is unknown: {reason}; retrying re-reads it first")]
    ViewUnknown { reason: String },
    #[error(
        "nftables table {} (the IPVS guard): {op}: {detail}",
        guard::ruleset::TABLE
    )]
    Guard { op: String, detail: String },
}

impl Error {
    /// Short, stable label for the `ringlb_datapath_errors_total{kind}` metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::NoIpvs => "no_ipvs",
            Error::NoScheduler { .. } => "no_scheduler",
            Error::InvalidService { .. } => "invalid_service",
            Error::Kernel { .. } => "kernel",
            Error::Io { .. } => "io",
            Error::Decode { .. } => "decode",
            Error::Timeout { .. } => "timeout",
            Error::ViewUnknown { .. } => "view_unknown",
            Error::Guard { .. } => "guard",
        }
    }

    /// -errno of a kernel refusal.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}
