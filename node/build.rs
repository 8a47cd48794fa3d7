//! Compiles the node datapath in `bpf/` (see `ringlb-bpf-build`).

use ringlb_bpf_build::{Object, compile};

/// Every header the program includes: a change to any of them rebuilds it.
const HEADERS: &[&str] = &[
    "bpf/node_abi.h",
    "bpf/node_parse.h",
    "bpf/node_nat.h",
    "bpf/node_maps.h",
    "bpf/node_mss.h",
    "bpf/node_icmp.h",
    "bpf/node_bench.h",
];

fn main() -> anyhow::Result<()> {
    let objects = [Object {
        source: "bpf/node.bpf.c",
        name: "node.o",
        defines: &[],
    }];
    compile(&objects, HEADERS, &["bpf"])
}
