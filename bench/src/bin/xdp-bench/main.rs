//! xdp-bench: the XDP datapath's figures, measured side by side in one run.
//!
//!   cargo build --release -p ringlb-bench --bin xdp-bench
//!   sudo target/release/xdp-bench            # everything (root: BPF, netns)
//!   sudo target/release/xdp-bench --only packet
//!
//! Sections (see docs/bench-xdp.md for method and results):
//!   packet   ns/packet by BPF_PROG_TEST_RUN: ringlb_xdp (conntrack hit, new
//!            flow's SYN and first ACK, not a VIP; 1 and V VIPs) and its
//!            other builds, against XDP_PASS and the MAC-swap XDP_TX floor,
//!            each by two methods (R: one call, repeat=N, kernel average; S:
//!            N calls with repeat=1, mean kernel duration); every output
//!            frame is checked. With --katran-object, Katran's balancer side
//!            by side (S only)
//!   ranges   what spec.loadBalancerSourceRanges and client affinity cost a
//!            packet: one VIP without ranges, with 4 and 8 (a set) and 256
//!            (the trie), and with affinity, in alternating rounds, beside
//!            the floor (method S)
//!   flood    1 M SYNs to one VIP while 1,000 established flows of another
//!            run: how many of those flows moved backend, without and
//!            with the insert budget
//!   veth     packets per second through a veth pair with native XDP:
//!            ringlb_xdp against the floor program on the same pair; the
//!            frames b0 sends back are checked
//!   iptables kube-proxy-style nat rules (N services) in a netns: time per
//!            new flow through PREROUTING, minus the same with 0 services
//!   update   one service change with N services present: our map update
//!            against `iptables-restore` of the equivalent ruleset

use clap::Parser;

mod check;
mod flood;
mod katran;
mod kube;
mod packet;
mod ranges;
mod setup;
mod timing;
mod veth;

#[derive(Parser, Debug)]
#[command(about = "ringlb XDP datapath benchmarks (needs root)")]
pub struct Args {
    /// Only this section: packet, ranges, flood, veth, iptables, update.
    #[arg(long)]
    pub only: Option<String>,
    /// Repetitions for method R (one BPF_PROG_TEST_RUN call).
    #[arg(long, default_value_t = 1_000_000)]
    pub repeat: u32,
    /// Calls for method S (repeat = 1 each).
    #[arg(long, default_value_t = 200_000)]
    pub calls: u32,
    /// VIPs for the packet benchmark.
    #[arg(long, default_value_t = 1000)]
    pub vips: u32,
    /// Backends per VIP.
    #[arg(long, default_value_t = 100)]
    pub backends: u32,
    /// Maglev ring size.
    #[arg(long, default_value_t = 65_537)]
    pub ring: u32,
    /// Service counts for the iptables per-packet comparison.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub iptables_services: Vec<u32>,
    /// Service counts present for the update-latency comparison.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,20000")]
    pub update_services: Vec<u32>,
    /// Ring size of the services that only populate the maps in `update`.
    #[arg(long, default_value_t = 1021)]
    pub filler_ring: u32,
    /// SYNs of the flood section.
    #[arg(long, default_value_t = 1_000_000)]
    pub flood_syns: u32,
    /// Established flows of the flood section (another VIP).
    #[arg(long, default_value_t = 1000)]
    pub flood_flows: u32,
    /// The established flows each send one packet every this many SYNs.
    #[arg(long, default_value_t = 200_000)]
    pub flood_every: u32,
    /// Seconds per program and round of the veth section.
    #[arg(long, default_value_t = 2)]
    pub veth_secs: u64,
    /// Rounds of the veth section (each program once per round, in turn).
    #[arg(long, default_value_t = 5)]
    pub veth_rounds: u32,
    /// Katran's balancer object (balancer.bpf.c compiled by you, see
    /// docs/bench-xdp.md): adds `katran` rows to the packet section.
    #[arg(long, value_name = "PATH")]
    pub katran_object: Option<std::path::PathBuf>,
}

/// One section of the run, as `--only` names it.
type Section = fn(&Args) -> anyhow::Result<()>;

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let want = |s: &str| a.only.as_deref().is_none_or(|o| o == s);
    println!(
        "# xdp-bench ({})\n",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    let sections: [(&str, Section); 6] = [
        ("packet", packet::section_packet),
        ("ranges", ranges::section_ranges),
        ("flood", flood::section_flood),
        ("veth", veth::section_veth),
        ("iptables", kube::section_iptables),
        ("update", kube::section_update),
    ];
    for (name, section) in sections {
        if want(name) {
            section(&a)?;
        }
    }
    Ok(())
}
