//! What ringlb's two BPF datapaths share, `ringlb-xdp` (the edge) and
//! `ringlb-node` (the worker nodes): the network-order field types their ABI
//! mirrors are made of ([`Be16`], [`RawAddr`]), the L4 protocol of a service
//! ([`Proto`]), and the errors of loading, pinning and attaching a BPF object
//! ([`BpfError`]), which each datapath's own `Error` wraps, and the check of a
//! (maybe pinned) map's capacity against this build ([`check_capacity`]).
//!
//! The C headers (`xdp/bpf/abi.h`, `node/bpf/node_abi.h`) stay the source of
//! truth for every map layout; the types here are the fields both use
//! (`__be16`, `__u32 addr[4]`).

mod abi;
pub mod bpffs;
mod error;
mod layout;

pub use abi::{AF_INET, AF_INET6, Be16, RawAddr};
pub use bpffs::{BpffsMount, MountError, PinDirError, check_pin_dir, mount_bpffs, prepare_pin_dir};
pub use error::{BpfError, map_err, prog_err};
pub use layout::check_capacity;
/// The L4 protocol, defined with the datapath seam (`ringlb-datapath`).
pub use ringlb_datapath::Proto;
