//! Compiles the XDP program in `bpf/` (see `ringlb-bpf-build`).

use ringlb_bpf_build::{Object, compile};

/// Every header the program includes: a change to any of them rebuilds it.
const HEADERS: &[&str] = &[
    "bpf/abi.h",
    "bpf/parse.h",
    "bpf/flow_hash.h",
    "bpf/conntrack.h",
    "bpf/vip_filter.h",
    "bpf/failover.h",
    "bpf/flow_filter.h",
    "bpf/bfd_hold.h",
];

fn main() -> anyhow::Result<()> {
    let objects = [Object {
        source: "bpf/xdp_lb.bpf.c",
        name: "xdp_lb.o",
        defines: &[],
    }];
    compile(&objects, HEADERS, &["bpf"])
}
