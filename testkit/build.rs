//! Compiles the test-only BPF programs (see `ringlb-bpf-build`): the programs in
//! `bpf/`, and benchmark builds of the production XDP program (never attached;
//! see the header of `xdp/bpf/xdp_lb.bpf.c`).

use ringlb_bpf_build::{Object, compile};

/// The production program's headers: its benchmark builds follow them.
const XDP_HEADERS: &[&str] = &[
    "../xdp/bpf/abi.h",
    "../xdp/bpf/parse.h",
    "../xdp/bpf/flow_hash.h",
];

fn main() -> anyhow::Result<()> {
    let objects = [
        Object {
            source: "bpf/xdp_floor.bpf.c",
            name: "xdp_floor.o",
            defines: &[],
        },
        Object {
            source: "bpf/tc_decap.bpf.c",
            name: "tc_decap.o",
            defines: &[],
        },
        // restores the packet so repeat > 1 times the encap path
        Object {
            source: "../xdp/bpf/xdp_lb.bpf.c",
            name: "xdp_lb_bench.o",
            defines: &["-DRINGLB_BENCH_RESTORE"],
        },
        // ... and never inserts into conntrack
        Object {
            source: "../xdp/bpf/xdp_lb.bpf.c",
            name: "xdp_lb_bench_miss.o",
            defines: &["-DRINGLB_BENCH_RESTORE", "-DRINGLB_BENCH_NO_CT_INSERT"],
        },
    ];
    compile(&objects, XDP_HEADERS, &["../xdp/bpf"])
}
