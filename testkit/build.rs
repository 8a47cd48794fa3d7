//! Compiles the test-only BPF programs (see `ringlb-bpf-build`): the programs in
//! `bpf/`, and benchmark builds of the production XDP and node programs (never
//! attached; see the headers of `xdp/bpf/xdp_lb.bpf.c` and
//! `node/bpf/node_bench.h`).

use ringlb_bpf_build::{Object, compile};

/// The production program's headers: its benchmark builds follow them.
const XDP_HEADERS: &[&str] = &[
    "../xdp/bpf/abi.h",
    "../xdp/bpf/parse.h",
    "../xdp/bpf/flow_hash.h",
    "../xdp/bpf/conntrack.h",
    "../xdp/bpf/vip_filter.h",
    "../xdp/bpf/failover.h",
    "../xdp/bpf/flow_filter.h",
    "../xdp/bpf/bfd_hold.h",
    "../xdp/bpf/src_ranges.h",
    "../xdp/bpf/vip_addr.h",
    "../xdp/bpf/affinity.h",
];

/// The node program's headers: its benchmark build follows them.
const NODE_HEADERS: &[&str] = &[
    "../node/bpf/node_abi.h",
    "../node/bpf/node_parse.h",
    "../node/bpf/node_nat.h",
    "../node/bpf/node_maps.h",
    "../node/bpf/node_mss.h",
    "../node/bpf/node_icmp.h",
    "../node/bpf/node_bench.h",
];

fn main() -> anyhow::Result<()> {
    let objects = [
        Object {
            source: "bpf/xdp_floor.bpf.c",
            name: "xdp_floor.o",
            defines: &[],
        },
        Object {
            source: "bpf/tc_floor.bpf.c",
            name: "tc_floor.o",
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
        // the program without the flow filter (every SYN looks up; the
        // production build for kernels without atomic OR,
        // ringlb_xdp::xdp::objects::XDP_LB_NO_FLOW_FILTER): its two
        // benchmark builds
        Object {
            source: "../xdp/bpf/xdp_lb.bpf.c",
            name: "xdp_lb_no_flow_filter_bench.o",
            defines: &["-DRINGLB_BENCH_RESTORE", "-DRINGLB_NO_FLOW_FILTER"],
        },
        Object {
            source: "../xdp/bpf/xdp_lb.bpf.c",
            name: "xdp_lb_no_flow_filter_bench_miss.o",
            defines: &[
                "-DRINGLB_BENCH_RESTORE",
                "-DRINGLB_BENCH_NO_CT_INSERT",
                "-DRINGLB_NO_FLOW_FILTER",
            ],
        },
        // a larger flow filter: 2^20 slots per half (2 x 1 MiB)
        Object {
            source: "../xdp/bpf/xdp_lb.bpf.c",
            name: "xdp_lb_flow_filter_20.o",
            defines: &["-DRINGLB_FLOW_FILTER_BITS=20"],
        },
    ];
    compile(&objects, XDP_HEADERS, &["../xdp/bpf"])?;
    // restores the frame so repeat > 1 times the decap / reply path
    let node = [Object {
        source: "../node/bpf/node.bpf.c",
        name: "node_bench.o",
        defines: &["-DRINGLB_BENCH_RESTORE"],
    }];
    compile(&node, NODE_HEADERS, &["../node/bpf"])
}
