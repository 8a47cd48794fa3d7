//! ringlb's test kit, for tests and benchmarks only (never a dependency of a
//! program): network namespaces and commands (`netns`), packet builders for
//! BPF_PROG_TEST_RUN fixtures (`packet`), the test pods' client (`pod`), test-only
//! BPF objects (`objects`), what the benchmark programs share (`bench`), and what a
//! test that cannot run here does (`tier`).

pub mod bench;
pub mod cargo;
pub mod fuzz;
pub mod netns;
pub mod packet;
pub mod pod;
pub mod tier;

/// The `XdpOptions::vip_capacity` of tests that program a few VIPs: the per-VIP
/// per-CPU counters are then a few hundred allocations, not 65,536 each, which
/// most of all shortens the kernel matrix's emulated guests.
pub const TEST_VIP_CAPACITY: u32 = 256;

/// Test-only BPF objects (built by build.rs from `bpf/`).
pub mod objects {
    use aya::include_bytes_aligned;
    /// MAC swap + XDP_TX (`ringlb_floor`), XDP_PASS (`ringlb_pass`) and XDP_DROP
    /// (`ringlb_drop`): the floor of the XDP benchmark, and the programs veth
    /// XDP_TX needs on the peer.
    pub static XDP_FLOOR: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp_floor.o"));
    /// Floors of the node (tc) benchmark: parse Ethernet + IP + ports and
    /// TC_ACT_OK (`ringlb_tc_floor`), and TC_ACT_OK alone (`ringlb_tc_ok`).
    pub static TC_FLOOR: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tc_floor.o"));
    /// tc decapsulation for test backends (`ringlb_decap`).
    pub static TC_DECAP: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tc_decap.o"));
    /// The production XDP program built to restore the packet, so repeat > 1 times
    /// the encapsulation path (benchmarks only).
    pub static XDP_LB_BENCH: &[u8] =
        include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp_lb_bench.o"));
    /// As `XDP_LB_BENCH`, and it never inserts into conntrack.
    pub static XDP_LB_BENCH_MISS: &[u8] =
        include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp_lb_bench_miss.o"));
    /// Benchmark builds of the production XDP program without the flow filter
    /// (`-DRINGLB_NO_FLOW_FILTER`: every SYN looks conntrack up; the program
    /// itself is `ringlb_xdp::xdp::objects::XDP_LB_NO_FLOW_FILTER`).
    pub static XDP_LB_NO_FLOW_FILTER_BENCH: &[u8] =
        include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp_lb_no_flow_filter_bench.o"));
    pub static XDP_LB_NO_FLOW_FILTER_BENCH_MISS: &[u8] = include_bytes_aligned!(concat!(
        env!("OUT_DIR"),
        "/xdp_lb_no_flow_filter_bench_miss.o"
    ));
    /// The production XDP program with a larger flow filter (2^20 slots per half).
    pub static XDP_LB_FLOW_FILTER_20: &[u8] =
        include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp_lb_flow_filter_20.o"));
    /// The node programs (`ringlb-node`) built to give the frame back after each
    /// run, so repeat > 1 times the decap and reply paths (benchmarks only).
    pub static NODE_BENCH: &[u8] =
        include_bytes_aligned!(concat!(env!("OUT_DIR"), "/node_bench.o"));
}
