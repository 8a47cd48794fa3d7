//! Section `ranges`: what `spec.loadBalancerSourceRanges` costs a packet
//! (method S, production object): one VIP and the same packets without source
//! ranges, with 4 and with 8 prefixes (a set, scanned in place; the client's
//! prefix last, so every one is compared) and with 256 (the LPM trie), in
//! rounds that run them all in turn, beside the MAC-swap floor; and a refused
//! source (dropped); and the same VIP with client affinity (no ranges), whose
//! new flows hash the client's address. Every frame is checked, as in `packet`.

use std::net::IpAddr;

use anyhow::{Context, ensure};
use ringlb_xdp::{Datapath, DesiredState, SourceRange};

use crate::Args;
use crate::check;
use crate::setup::{XDP_TX, ack, desired, load, syn, syn_frame};
use crate::timing::method_s;

const XDP_DROP: u32 = 1;
const ROUNDS: usize = 5;

/// `d` with `n` source ranges on every VIP: the benchmark clients'
/// 192.168.0.0/16 last, after `n - 1` other prefixes (10.x.y.0/24).
fn with_ranges(d: &DesiredState, n: u32) -> DesiredState {
    let mut ranges: Vec<SourceRange> = (0..n - 1)
        .map(|i| {
            let a = IpAddr::from([10, (i >> 8) as u8, i as u8, 0]);
            SourceRange::new(a, 24).expect("a /24")
        })
        .collect();
    ranges.push(SourceRange::new(IpAddr::from([192, 168, 0, 0]), 16).expect("a /16"));
    let mut out = d.clone();
    for (vip, e) in out.services.iter_mut() {
        *e = e.clone().with_source_ranges(vip, ranges.iter().copied());
    }
    out
}

/// `d` with client affinity (`sessionAffinity: ClientIP`) on every VIP: the
/// ring slot is the hash of the client's address.
fn with_affinity(d: &DesiredState) -> DesiredState {
    let mut out = d.clone();
    for e in out.services.values_mut() {
        *e = e.clone().with_client_affinity(10_800);
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn section_ranges(a: &Args) -> anyhow::Result<()> {
    let cpu = ringlb_testkit::bench::pin_to_current_cpu().context("sched_setaffinity")?;
    let open = desired(1, a.backends, a.ring)?;
    let configs = [
        ("no ranges", open.clone()),
        ("4 ranges (set)", with_ranges(&open, 4)),
        ("8 ranges (set)", with_ranges(&open, 8)),
        ("256 ranges (trie)", with_ranges(&open, 256)),
        ("none; client affinity", with_affinity(&open)),
    ];
    let nb = a.backends;
    let enc = |i: &[u8], o: &[u8]| check::encapped(i, o, 0, nb).map(|_| ());
    let mut dp = load(ringlb_xdp::xdp::objects::XDP_LB, &open)?;
    // the flow of the hit rows: established (its entry inserted by the ACK)
    for p in [syn(0, 7), ack(0, 7)] {
        let mut out = [0u8; 256];
        let (verdict, len, _) = ringlb_xdp::xdp::test_run(dp.program()?, &p, &mut out, 1)?;
        ensure!(verdict == XDP_TX, "handshake: verdict {verdict}");
        enc(&p, &out[..len])?;
    }
    let refused = {
        let mut f = syn_frame(0, 7).established();
        f.src = IpAddr::from([198, 51, 100, 7]);
        f.bytes()
    };
    // rounds of every configuration in turn: the machine's drift spreads
    // over all three instead of landing on one
    let mut hit = vec![Vec::new(); configs.len()];
    let mut ring = vec![Vec::new(); configs.len()];
    let mut drop = Vec::new();
    let mut floor_s = Vec::new();
    let mut floor = aya::Ebpf::load(ringlb_testkit::objects::XDP_FLOOR)?;
    let fp: &mut aya::programs::Xdp = floor
        .program_mut("ringlb_floor")
        .context("ringlb_floor")?
        .try_into()?;
    fp.load()?;
    for round in 0..ROUNDS {
        floor_s.push(method_s(
            fp,
            a.calls,
            XDP_TX,
            |_| syn(0, 0),
            check::macs_swapped,
        )?);
        for (k, (name, d)) in configs.iter().enumerate() {
            dp.apply(d).with_context(|| format!("apply {name}"))?;
            let prog = dp.program()?;
            hit[k].push(method_s(prog, a.calls, XDP_TX, |_| ack(0, 7), enc)?);
            // a SYN goes the ring path (VIP entry, check, ring); it inserts nothing
            ring[k].push(method_s(prog, a.calls, XDP_TX, |_| syn(0, 7), enc)?);
            if k == 1 {
                drop.push(method_s(
                    prog,
                    a.calls,
                    XDP_DROP,
                    |_| refused.clone(),
                    check::unchanged,
                )?);
            }
        }
        eprintln!("ranges: round {} of {ROUNDS} done", round + 1);
    }
    let dropped = dp
        .read_counters()?
        .global
        .iter()
        .find(|(l, _)| *l == "drop_source_range")
        .map_or(0, |x| x.1);
    ensure!(
        dropped == u64::from(a.calls) * ROUNDS as u64,
        "drop_source_range counted {dropped}"
    );
    println!(
        "## source ranges and client affinity (BPF_PROG_TEST_RUN, method S, production object)\n"
    );
    println!(
        "One VIP ({} backends, ring {}); S = {} calls with repeat=1, mean kernel-reported duration; \
         the median of {ROUNDS} rounds, each round running the floor and every configuration in turn \
         (re-applied: the same VIP and flow, the ranges changed). Pinned to CPU {cpu}. \
         The hit is an ACK of an established flow (conntrack hit); the ring row a SYN (the VIP entry, \
         the check, the Maglev ring; it inserts nothing).\n",
        a.backends, a.ring, a.calls
    );
    println!("| path | the VIP's source ranges; affinity | S ns/pkt | vs neither |");
    println!("|---|---|---|---|");
    println!(
        "| MAC swap + XDP_TX (floor) | - | {:.1} | - |",
        median(floor_s)
    );
    for (rows, path) in [(&hit, "conntrack hit (ACK)"), (&ring, "ring (SYN)")] {
        let base = median(rows[0].clone());
        for (k, (name, _)) in configs.iter().enumerate() {
            let m = median(rows[k].clone());
            println!("| {path} | {name} | {m:.1} | {:+.1} |", m - base);
        }
    }
    println!(
        "| refused source: XDP_DROP | 4 ranges (set) | {:.1} | - |\n",
        median(drop)
    );
    Ok(())
}
