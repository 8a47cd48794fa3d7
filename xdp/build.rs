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
    "bpf/src_ranges.h",
    "bpf/vip_addr.h",
    "bpf/affinity.h",
];

fn main() -> anyhow::Result<()> {
    let objects = [
        Object {
            source: "bpf/xdp_lb.bpf.c",
            name: "xdp_lb.o",
            defines: &[],
        },
        // for kernels without BPF atomic OR (Linux 5.12), which the flow
        // filter's bit sets need
        Object {
            source: "bpf/xdp_lb.bpf.c",
            name: "xdp_lb_no_flow_filter.o",
            defines: &["-DRINGLB_NO_FLOW_FILTER"],
        },
        Object {
            source: "bpf/probe_atomic_or.bpf.c",
            name: "probe_atomic_or.o",
            defines: &[],
        },
    ];
    compile(&objects, HEADERS, &["bpf"])
}
