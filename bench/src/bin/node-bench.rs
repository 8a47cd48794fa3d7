//! node-bench: ns/packet of the node datapath (tc) beside a trivial tc
//! program, side by side in one run.
//!
//!   cargo build --release -p ringlb-bench --bin node-bench
//!   sudo target/release/node-bench             # root: loads BPF programs
//!
//! Every row runs BPF_PROG_TEST_RUN on one frame. R = one call with
//! repeat = N, the kernel's average (the figure the issue asks for); S = N'
//! calls with repeat = 1, mean of the kernel-reported duration (a
//! cross-check that needs no restoring build, but carries the per-call
//! timer cost). The floor (`ringlb_tc_floor`: parse Ethernet + IP + ports,
//! TC_ACT_OK) runs on the same frame as each row, interleaved with it, and
//! the ratio is path / floor. See docs/bench-node.md.
//!
//! The decap and reply rows use the benchmark build of the node programs
//! (`-DRINGLB_BENCH_RESTORE`, node/bpf/node_bench.h), which gives the frame
//! back after each run: repeat reuses one skb, and the production programs
//! would time their own output (the pass-through path) from the second
//! repetition on. The pass-through rows use the production object (it does
//! not change those frames). The "restore" row is the benchmark build on a
//! pass-through frame minus the production object on it: what the save +
//! store alone adds to the decap/reply rows (not the decap row's extra
//! `bpf_skb_adjust_room`, which only a decapsulated frame needs).

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, bail};
use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use clap::Parser;
use ringlb_node::{Hook, NodeDatapath, NodeOptions, NodeState, Proto, abi::Stat};
use ringlb_testkit::packet::{Segment, TCP_ACK, TCP_SYN, eth, ipip};

#[derive(Parser, Debug)]
#[command(about = "ringlb node datapath benchmark (needs root)")]
struct Args {
    /// Repetitions for method R (one BPF_PROG_TEST_RUN call).
    #[arg(long, default_value_t = 1_000_000)]
    repeat: u32,
    /// Calls for method S (repeat = 1 each); 0 = skip S.
    #[arg(long, default_value_t = 100_000)]
    calls: u32,
    /// Rounds: every row, and its floor, is measured once per round
    /// (interleaved); the table shows the median and the range.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

const TC_ACT_OK: u32 = 0;

const EDGE4: &str = "10.0.0.11";
const EDGE6: &str = "2001:db8::11";
const POD4: &str = "10.2.0.5";
const POD6: &str = "2001:db8:2::5";
const VIP4: &str = "10.100.0.1";
const VIP6: &str = "2001:db8:100::1";
const CLIENT4: &str = "192.0.2.7:40000";
const CLIENT6: &str = "[2001:db8:ffff::9]:41000";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}
fn sa(s: &str) -> SocketAddr {
    s.parse().expect("socket address")
}

/// VIP4:80/TCP -> POD4:8080 and VIP6:443/TCP -> POD6:8443.
fn services() -> NodeState {
    let mut s = NodeState::default();
    s.add_backend(ip(VIP4), 80, Proto::Tcp, ip(POD4), 8080)
        .add_backend(ip(VIP6), 443, Proto::Tcp, ip(POD6), 8443);
    s
}

/// A TCP segment whose inner frame is 64 bytes for IPv4 (14 + 20 + 20 + 10),
/// 84 for IPv6: the size class of the XDP benchmark.
fn seg(src: SocketAddr, dst: SocketAddr, flags: u8) -> Segment {
    let mut s = Segment::tcp(src, dst, flags);
    s.payload = vec![0x61; 10];
    s
}

/// Linux's SYN-ACK options: MSS, SACK permitted, timestamps, NOP, window scale.
fn linux_opts(mss: u16) -> Vec<u8> {
    let m = mss.to_be_bytes();
    vec![
        2, 4, m[0], m[1], 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1, 3, 3, 7,
    ]
}

/// What one row measures.
struct Row {
    name: &'static str,
    hook: Hook,
    frame: Vec<u8>,
    /// The path rewrites the frame: R needs the restoring build.
    rewrites: bool,
    /// Counter that must grow by `repeat` in the R run (proof of the path).
    proof: Option<Stat>,
}

fn rows() -> Vec<Row> {
    let (c4, c6) = (sa(CLIENT4), sa(CLIENT6));
    let vip4 = SocketAddr::new(ip(VIP4), 80);
    let vip6 = SocketAddr::new(ip(VIP6), 443);
    let pod4 = SocketAddr::new(ip(POD4), 8080);
    let pod6 = SocketAddr::new(ip(POD6), 8443);
    let tunnel = |s: &Segment, edge, pod| eth(&ipip(ip(edge), ip(pod), &s.l3()));
    let mut synack = seg(pod4, c4, TCP_SYN | TCP_ACK);
    synack.payload.clear();
    synack.options = linux_opts(1460);
    vec![
        Row {
            name: "ingress: IPIP decap + DNAT, flow hit (v4 ACK)",
            hook: Hook::Ingress,
            frame: tunnel(&seg(c4, vip4, TCP_ACK), EDGE4, POD4),
            rewrites: true,
            proof: Some(Stat::Dnat),
        },
        Row {
            name: "ingress: IP6IP6 decap + DNAT, flow hit (v6 ACK)",
            hook: Hook::Ingress,
            frame: tunnel(&seg(c6, vip6, TCP_ACK), EDGE6, POD6),
            rewrites: true,
            proof: Some(Stat::Dnat),
        },
        Row {
            name: "egress: reply pod -> VIP rewrite (v4 ACK)",
            hook: Hook::Egress,
            frame: seg(pod4, c4, TCP_ACK).frame(),
            rewrites: true,
            proof: Some(Stat::ReplySnat),
        },
        Row {
            name: "egress: reply pod -> VIP rewrite (v6 ACK)",
            hook: Hook::Egress,
            frame: seg(pod6, c6, TCP_ACK).frame(),
            rewrites: true,
            proof: Some(Stat::ReplySnat),
        },
        Row {
            name: "egress: SYN-ACK rewrite + MSS clamp 1460 -> 1440 (v4)",
            hook: Hook::Egress,
            frame: synack.frame(),
            rewrites: true,
            proof: Some(Stat::MssClamped),
        },
        Row {
            name: "ingress: IPIP to an address that is no local pod (parse + 1 lookup)",
            hook: Hook::Ingress,
            frame: tunnel(&seg(c4, vip4, TCP_ACK), EDGE4, "10.2.0.99"),
            rewrites: false,
            proof: None,
        },
        Row {
            name: "ingress: IPIP to a local pod, port not served (parse x2 + 2 lookups)",
            hook: Hook::Ingress,
            frame: tunnel(
                &seg(c4, SocketAddr::new(ip(VIP4), 81), TCP_ACK),
                EDGE4,
                POD4,
            ),
            rewrites: false,
            proof: None,
        },
        Row {
            name: "ingress: not ours (plain TCP to a pod)",
            hook: Hook::Ingress,
            frame: seg(sa("10.2.1.9:5555"), pod4, TCP_ACK).frame(),
            rewrites: false,
            proof: None,
        },
        Row {
            name: "egress: not ours (TCP without a flow)",
            hook: Hook::Egress,
            frame: seg(pod4, sa("10.2.1.9:5555"), TCP_ACK).frame(),
            rewrites: false,
            proof: None,
        },
    ]
}

fn load(object: &[u8]) -> anyhow::Result<NodeDatapath> {
    let opts = NodeOptions {
        pin_dir: None,
        ..NodeOptions::default()
    };
    let mut dp = NodeDatapath::load_object(&opts, object).context("loading the node object")?;
    dp.apply(&services())?;
    Ok(dp)
}

/// Creates the flows the rows' replies belong to (one tunnelled SYN each,
/// through the production program).
fn warm(dp: &NodeDatapath) -> anyhow::Result<()> {
    let mut out = vec![0u8; 512];
    for (c, v, edge, pod) in [
        (CLIENT4, SocketAddr::new(ip(VIP4), 80), EDGE4, POD4),
        (CLIENT6, SocketAddr::new(ip(VIP6), 443), EDGE6, POD6),
    ] {
        let f = eth(&ipip(ip(edge), ip(pod), &seg(sa(c), v, TCP_SYN).l3()));
        dp.test_run(Hook::Ingress, &f, &mut out, 1)?;
    }
    Ok(())
}

/// The average ns of one test run of `hook` over `frame`, `repeat` times;
/// checks the verdict. Returns (ns, bytes out).
fn node_r(
    dp: &NodeDatapath,
    hook: Hook,
    frame: &[u8],
    repeat: u32,
) -> anyhow::Result<(f64, usize)> {
    let mut out = vec![0u8; frame.len() + 256];
    let (v, len, d) = dp.test_run(hook, frame, &mut out, repeat)?;
    if v != TC_ACT_OK {
        bail!("verdict {v}, expected TC_ACT_OK");
    }
    Ok((d.as_nanos() as f64, len))
}

fn floor_r(prog: &SchedClassifier, frame: &[u8], repeat: u32) -> anyhow::Result<f64> {
    let mut out = vec![0u8; frame.len() + 64];
    let mut o = TestRunOptions::new();
    o.data_in = Some(frame);
    o.data_out = Some(&mut out);
    o.repeat = repeat;
    let r = prog.test_run(o)?;
    if r.return_value != TC_ACT_OK {
        bail!("floor verdict {}", r.return_value);
    }
    Ok(r.duration.as_nanos() as f64)
}

/// Method S: `calls` calls with repeat = 1 on the production object.
fn node_s(dp: &NodeDatapath, hook: Hook, frame: &[u8], calls: u32) -> anyhow::Result<f64> {
    let mut total = 0.0;
    for _ in 0..calls {
        total += node_r(dp, hook, frame, 1)?.0;
    }
    Ok(total / f64::from(calls))
}

fn floor_s(prog: &SchedClassifier, frame: &[u8], calls: u32) -> anyhow::Result<f64> {
    let mut total = 0.0;
    for _ in 0..calls {
        total += floor_r(prog, frame, 1)?;
    }
    Ok(total / f64::from(calls))
}

/// Median, min, max.
fn stats(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

struct Measured {
    path: Vec<f64>,
    floor: Vec<f64>,
    path_s: Option<f64>,
    floor_s: Option<f64>,
}

fn measure(a: &Args, rows: &[Row]) -> anyhow::Result<(Vec<Measured>, Vec<f64>, Vec<f64>)> {
    let bench = load(ringlb_testkit::objects::NODE_BENCH)?;
    let prod = load(ringlb_node::objects::NODE)?;
    warm(&bench)?;
    warm(&prod)?;
    let mut floors = aya::Ebpf::load(ringlb_testkit::objects::TC_FLOOR)?;
    for name in ["ringlb_tc_floor", "ringlb_tc_ok"] {
        let p: &mut SchedClassifier = floors.program_mut(name).context(name)?.try_into()?;
        p.load()?;
    }
    let prog = |name: &str| -> anyhow::Result<&SchedClassifier> {
        Ok(floors.program(name).context("floor")?.try_into()?)
    };
    let (floor, ok) = (prog("ringlb_tc_floor")?, prog("ringlb_tc_ok")?);

    // behaviour first (repeat = 1, production object): rewriting rows change
    // the frame, the others leave it alone
    for r in rows {
        let mut out = vec![0u8; r.frame.len() + 256];
        let (_, len, _) = prod.test_run(r.hook, &r.frame, &mut out, 1)?;
        let changed = out[..len] != r.frame[..];
        if changed != r.rewrites {
            bail!(
                "{}: frame changed = {changed}, expected {}",
                r.name,
                r.rewrites
            );
        }
    }
    let mut m: Vec<Measured> = rows
        .iter()
        .map(|_| Measured {
            path: vec![],
            floor: vec![],
            path_s: None,
            floor_s: None,
        })
        .collect();
    let (mut ok_r, mut restore) = (vec![], vec![]);
    let pass = &rows[rows.len() - 1];
    for _ in 0..a.rounds {
        ok_r.push(floor_r(ok, &rows[0].frame, a.repeat)?);
        for (r, mm) in rows.iter().zip(m.iter_mut()) {
            mm.floor.push(floor_r(floor, &r.frame, a.repeat)?);
            let dp = if r.rewrites { &bench } else { &prod };
            let before = r.proof.map(|s| dp.counter(s)).transpose()?;
            let (ns, len) = node_r(dp, r.hook, &r.frame, a.repeat)?;
            if len != r.frame.len() {
                bail!(
                    "{}: {len} bytes out, the restoring build must give back {}",
                    r.name,
                    r.frame.len()
                );
            }
            if let (Some(s), Some(b)) = (r.proof, before) {
                let n = dp.counter(s)? - b;
                if n < u64::from(a.repeat) {
                    bail!("{}: {s:?} grew by {n}, expected {}", r.name, a.repeat);
                }
            }
            mm.path.push(ns);
        }
        let b = node_r(&bench, pass.hook, &pass.frame, a.repeat)?.0;
        let p = node_r(&prod, pass.hook, &pass.frame, a.repeat)?.0;
        restore.push(b - p);
    }
    if a.calls > 0 {
        for (r, mm) in rows.iter().zip(m.iter_mut()) {
            mm.floor_s = Some(floor_s(floor, &r.frame, a.calls)?);
            mm.path_s = Some(node_s(&prod, r.hook, &r.frame, a.calls)?);
        }
    }
    Ok((m, ok_r, restore))
}

/// The lab's minimal decap (`ringlb_decap`: parse + bpf_skb_adjust_room +
/// one counter, no maps, no NAT) by S on the v4 and v6 tunnelled frames: what
/// removing the outer header costs by itself. (It has no restoring build, so
/// only S applies.)
fn minimal_decap(rows: &[Row], calls: u32) -> anyhow::Result<(f64, f64)> {
    let mut e = aya::Ebpf::load(ringlb_testkit::objects::TC_DECAP)?;
    let p: &mut SchedClassifier = e.program_mut("ringlb_decap").context("decap")?.try_into()?;
    p.load()?;
    Ok((
        floor_s(p, &rows[0].frame, calls)?,
        floor_s(p, &rows[1].frame, calls)?,
    ))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    if a.rounds == 0 || a.repeat == 0 {
        bail!("--rounds and --repeat must be > 0");
    }
    let cpu = ringlb_testkit::bench::pin_to_current_cpu().context("sched_setaffinity")?;
    println!(
        "# node-bench ({})\n",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    println!("load average before: {}; pinned to CPU {cpu}\n", loadavg());
    let rows = rows();
    let (m, mut ok_r, mut restore) = measure(&a, &rows)?;
    println!(
        "R = one call, repeat={}, kernel average, median (min-max) of {} rounds; floor = \
         ringlb_tc_floor on the same frame, interleaved; S = {} calls with repeat=1, \
         production object (mean kernel duration).\n",
        a.repeat, a.rounds, a.calls
    );
    println!("| path | frame bytes | R ns/pkt | floor R | R / floor | S ns/pkt | floor S |");
    println!("|---|---|---|---|---|---|---|");
    let (okm, okl, okh) = stats(&mut ok_r);
    println!(
        "| `ringlb_tc_ok` (TC_ACT_OK only: the test-run loop) | {} | {okm:.1} ({okl:.1}-{okh:.1}) | - | - | - | - |",
        rows[0].frame.len()
    );
    for (r, mut mm) in rows.iter().zip(m) {
        let (pm, pl, ph) = stats(&mut mm.path);
        let (fm, _, _) = stats(&mut mm.floor);
        let s = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.1}"));
        println!(
            "| {} | {} | {pm:.1} ({pl:.1}-{ph:.1}) | {fm:.1} | **{:.2}** | {} | {} |",
            r.name,
            r.frame.len(),
            pm / fm,
            s(mm.path_s),
            s(mm.floor_s)
        );
    }
    if a.calls > 0 {
        let (d4, d6) = minimal_decap(&rows, a.calls)?;
        println!(
            "| minimal decap (testkit `ringlb_decap`: parse + adjust_room, no maps, no NAT), v4 / v6 | {} / {} | - | - | - | {d4:.1} / {d6:.1} | - |",
            rows[0].frame.len(),
            rows[1].frame.len()
        );
    }
    let (rm, rl, rh) = stats(&mut restore);
    println!(
        "\nrestore overhead of the benchmark build (save + store of the frame, on a pass-through frame): \
         {rm:.1} ns ({rl:.1}-{rh:.1}); the decap rows add one bpf_skb_adjust_room on top.\n"
    );
    println!("load average after: {}", loadavg());
    Ok(())
}
