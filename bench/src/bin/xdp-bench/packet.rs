//! Section `packet`: ns/packet by BPF_PROG_TEST_RUN, the builds of the
//! production program side by side, against the floors.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use ringlb_xdp::{
    abi,
    xdp::{XdpDatapath, test_run},
};

use crate::Args;
use crate::check;
use crate::katran;
use crate::setup::{
    Variant, XDP_PASS, XDP_TX, ack, counter, desired, load_budgeted, syn, variants, vip_addr,
};
use crate::timing::{handshakes, method_s};

type Prog = aya::programs::Xdp;

/// Method R: one call with `repeat`; the kernel's average. Checks the verdict
/// and the output frame (`check(input, output)`).
fn method_r(
    prog: &Prog,
    pkt: &[u8],
    repeat: u32,
    want: u32,
    check: impl Fn(&[u8], &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let mut out = vec![0u8; pkt.len() + 64];
    let (verdict, len, d) = test_run(prog, pkt, &mut out, repeat)?;
    if verdict != want {
        bail!("verdict {verdict}, expected {want}");
    }
    check(pkt, &out[..len])?;
    Ok(d.as_nanos() as f64)
}

/// As [`handshakes`], but the SYNs of `batch` flows go first, then their
/// ACKs: between a flow's SYN and its ACK, the other flows' SYNs (a round
/// trip with other traffic in it), so the SYN does not warm the lines its
/// ACK's insert uses, as it does back to back.
fn handshakes_batched(
    prog: &Prog,
    vip: u32,
    backends: u32,
    first: u32,
    n: u32,
    batch: u32,
) -> anyhow::Result<(f64, f64)> {
    let (mut s, mut a) = (Duration::ZERO, Duration::ZERO);
    let mut out = [0u8; 256];
    let mut dst = vec![Ipv4Addr::UNSPECIFIED; batch as usize];
    let mut start = first;
    while start < first + n {
        let end = (start + batch).min(first + n);
        for (k, total) in [(0, &mut s), (1, &mut a)] {
            for i in start..end {
                let p = if k == 0 { syn(vip, i) } else { ack(vip, i) };
                let (verdict, len, d) = test_run(prog, &p, &mut out, 1)?;
                if verdict != XDP_TX {
                    bail!("flow {i} packet {k}: verdict {verdict}");
                }
                let to = check::encapped(&p, &out[..len], vip, backends)
                    .with_context(|| format!("flow {i}"))?;
                let slot = &mut dst[(i - start) as usize];
                if k == 1 && *slot != to {
                    bail!("flow {i}: SYN to {slot}, its ACK to {to}");
                }
                *slot = to;
                *total += d;
            }
        }
        start = end;
    }
    let n = f64::from(n);
    Ok((s.as_nanos() as f64 / n, a.as_nanos() as f64 / n))
}

/// Runs `timed` (a method-R call) and checks that it moved each of the
/// program's counters `labels`, and the packets of VIP `vip` if given, by
/// exactly `repeat`. A restoring build's output is its input, so these
/// counters, read outside the timed call, are what shows the path every
/// repetition took (encapsulated, conntrack hit, passed).
fn counted(
    dp: &XdpDatapath,
    labels: &[&str],
    vip: Option<IpAddr>,
    repeat: u32,
    timed: impl FnOnce() -> anyhow::Result<f64>,
) -> anyhow::Result<f64> {
    let read = |dp: &XdpDatapath| -> anyhow::Result<Vec<u64>> {
        let mut v = labels
            .iter()
            .map(|l| counter(dp, l))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if let Some(addr) = vip {
            let c = dp.read_counters()?;
            v.push(
                c.per_vip
                    .iter()
                    .filter(|x| x.0.addr == addr)
                    .map(|x| x.1)
                    .sum(),
            );
        }
        Ok(v)
    };
    let before = read(dp)?;
    let ns = timed()?;
    for (k, (b, a)) in before.iter().zip(read(dp)?).enumerate() {
        let what = labels.get(k).copied().unwrap_or("the VIP's packets");
        if a - b != u64::from(repeat) {
            bail!("{what} moved by {}, expected {repeat}", a - b);
        }
    }
    Ok(ns)
}

fn floors(a: &Args) -> anyhow::Result<()> {
    let mut floor = aya::Ebpf::load(ringlb_testkit::objects::XDP_FLOOR)?;
    for (name, path, want) in [
        ("ringlb_pass", "XDP_PASS", XDP_PASS),
        ("ringlb_floor", "MAC swap + XDP_TX (floor)", XDP_TX),
    ] {
        let prog: &mut Prog = floor.program_mut(name).context(name)?.try_into()?;
        prog.load()?;
        let chk = |i: &[u8], o: &[u8]| {
            if want == XDP_PASS {
                check::unchanged(i, o)
            } else {
                check::macs_swapped(i, o)
            }
        };
        // R runs the program `repeat` times over one buffer: the floor's
        // output is the input with its MACs swapped `repeat` times
        let r = method_r(prog, &syn(0, 0), a.repeat, want, |i, o| {
            if want == XDP_TX && a.repeat % 2 == 1 {
                check::macs_swapped(i, o)
            } else {
                check::unchanged(i, o)
            }
        })?;
        let s = method_s(prog, a.calls, want, |_| syn(0, 0), chk)?;
        println!("| {name} | {path} | - | {r:.1} | {s:.1} |");
    }
    Ok(())
}

/// Rows of one program variant with `vips` VIPs, as table lines.
fn rows(
    a: &Args,
    v: &Variant,
    d: &ringlb_xdp::DesiredState,
    vips: u32,
    cpus: u32,
) -> anyhow::Result<Vec<String>> {
    let target = vips / 2;
    let nb = a.backends;
    let to = |i: &[u8], o: &[u8]| check::encapped(i, o, target, nb);
    let enc = |i: &[u8], o: &[u8]| to(i, o).map(|_| ());
    // R: the restoring bench build, flow established first (SYN + ACK)
    let t = Instant::now();
    let bench = load_budgeted(v.bench, d, v.budget)?;
    eprintln!("{} {vips} VIPs: maps {:?}", v.name, t.elapsed());
    let prog = bench.program()?;
    method_r(prog, &syn(target, 7), 1, XDP_TX, check::unchanged)?;
    method_r(prog, &ack(target, 7), 1, XDP_TX, check::unchanged)?;
    let to_vip = Some(vip_addr(target));
    let hit_r = counted(&bench, &["tx", "ct_hit"], to_vip, a.repeat, || {
        method_r(prog, &ack(target, 7), a.repeat, XDP_TX, check::unchanged)
    })
    .with_context(|| format!("{}: R hit", v.name))?;
    drop(bench);
    let miss = load_budgeted(v.miss, d, v.budget)?;
    let miss_r = counted(&miss, &["tx"], to_vip, a.repeat, || {
        method_r(
            miss.program()?,
            &syn(target, 7),
            a.repeat,
            XDP_TX,
            check::unchanged,
        )
    })
    .with_context(|| format!("{}: R SYN", v.name))?;
    drop(miss);
    // S: the production object
    let prod = load_budgeted(v.prod, d, v.budget)?;
    let prog = prod.program()?;
    handshakes(prog, target, 7, 1, to)?;
    let hit_s = method_s(prog, a.calls, XDP_TX, |_| ack(target, 7), enc)?;
    let not_vip = |n| crate::setup::not_vip(target, n);
    let pass_r = counted(&prod, &["pass_not_vip"], None, a.repeat, || {
        method_r(prog, &not_vip(7), a.repeat, XDP_PASS, check::unchanged)
    })
    .with_context(|| format!("{}: R not a VIP", v.name))?;
    let pass_s = method_s(prog, a.calls, XDP_PASS, not_vip, check::unchanged)?;
    // New flows: SYN, then its first ACK. Two regimes of the LRU, which the
    // test runs on this CPU's list (capacity CT_SIZE / possible CPUs): with
    // free entries, and full, where every insert first evicts.
    let cap = abi::CT_SIZE / cpus;
    let room = a.calls.min(cap / 2);
    let (syn_s, ack_s) = handshakes(prog, target, 100, room / 2, to)?;
    let (syn_b, ack_b) = handshakes_batched(prog, target, nb, 100 + room / 2, room / 2, 256)?;
    let fill = cap + cap / 10 - room; // past capacity: from here on, inserts evict
    handshakes(prog, target, 100 + room, fill, to)?;
    let (syn_full, ack_full) = handshakes(prog, target, 100 + room + fill, a.calls.min(cap), to)?;
    // the filter as the LRU-full SYNs found it, then rebuilt from this CPU's
    // full LRU list (what the edge does every interval)
    let fill0 = prod.with_flow_filter(|f| f.count(f.active()))?;
    let rb = prod.rebuild_flow_filter()?;
    eprintln!(
        "{}: flow filter {fill0} set after the run; rebuilt from {} keys in {:?}: {} of {} slots set ({:.1} %)",
        v.name,
        rb.keys,
        rb.took,
        rb.set,
        rb.slots,
        100.0 * rb.fill()
    );
    let n = v.name;
    Ok(vec![
        format!("| {n} | conntrack hit (ACK) | {vips} | {hit_r:.1} | {hit_s:.1} |"),
        format!("| {n} | not a VIP: XDP_PASS | {vips} | {pass_r:.1} | {pass_s:.1} |"),
        format!("| {n} | new flow: SYN | {vips} | {miss_r:.1} | {syn_s:.1} |"),
        format!("| {n} | new flow: its first ACK | {vips} | - | {ack_s:.1} |"),
        format!("| {n} | new flow, 256 SYNs then their ACKs: SYN | {vips} | - | {syn_b:.1} |"),
        format!(
            "| {n} | new flow, 256 SYNs then their ACKs: first ACK | {vips} | - | {ack_b:.1} |"
        ),
        format!("| {n} | new flow, LRU full: SYN | {vips} | - | {syn_full:.1} |"),
        format!("| {n} | new flow, LRU full: its first ACK | {vips} | - | {ack_full:.1} |"),
    ])
}

pub(crate) fn section_packet(a: &Args) -> anyhow::Result<()> {
    // One CPU for the whole section: the conntrack LRU keeps a free list per
    // CPU, and the "LRU full" rows must know which list they fill.
    let cpu = ringlb_testkit::bench::pin_to_current_cpu().context("sched_setaffinity")?;
    let cpus = u32::try_from(aya::util::nr_cpus().map_err(|(_, e)| e)?)?;
    let katran = a.katran_object.as_deref().map(katran::read).transpose()?;
    println!("## packet path (BPF_PROG_TEST_RUN, 64-byte TCP packets)\n");
    println!(
        "R = one call, repeat={}, kernel average; S = calls with repeat=1 ({} for the floor, hit and not-VIP rows), \
         mean of the kernel-reported duration. Pinned to CPU {cpu} of {cpus} possible. \
         `no_flow_filter` = ringlb_xdp without the flow filter (the build for kernels before 5.12). \
         Every output frame is checked (outer header, destination a backend of the VIP, inner packet; \
         a flow's SYN and ACK to the same backend); an R call's frame is the input (restoring builds; the floor: \
         its MACs swapped `repeat` times), and its counters must have moved by exactly `repeat` (tx and the \
         VIP's packets, ct_hit for the hit; pass_not_vip).\n",
        a.repeat, a.calls
    );
    // Warm-up, not printed: the first program timed after start-up came out
    // slower than the same program later in the run (by up to 1.5x on a
    // SYN), whichever program it was; one untimed pass of the first
    // program's rows takes that penalty instead.
    if let Some(first) = variants().first() {
        let d = desired(1, a.backends, a.ring)?;
        rows(a, first, &d, 1, cpus).context("warm-up")?;
    }
    println!("| program | path | VIPs | R ns/pkt | S ns/pkt |");
    println!("|---|---|---|---|---|");
    floors(a)?;
    for vips in [1, a.vips] {
        let t = Instant::now();
        let d = desired(vips, a.backends, a.ring)?;
        eprintln!(
            "{vips} VIPs x {} backends, ring {}: tables {:?}",
            a.backends,
            a.ring,
            t.elapsed()
        );
        for v in variants() {
            for line in rows(a, &v, &d, vips, cpus)? {
                println!("{line}");
            }
        }
        if let Some(object) = &katran {
            katran::rows(a, object, &d, vips, cpus)?;
        }
    }
    println!(
        "\nR for ringlb_xdp uses the benchmark builds (-DRINGLB_BENCH_RESTORE, and -DRINGLB_BENCH_NO_CT_INSERT for the SYN row: \
         the ring lookup without any insert); S uses the production objects. \
         ringlb_xdp inserts on a flow's first ACK, not on its SYN.\n"
    );
    if let Some(path) = &a.katran_object {
        println!(
            "`katran` = Katran's balancer_ingress from {} (S only: its encapsulation cannot be undone for R), \
             maps programmed as KatranLb does (same VIPs, backends and ring contents; LRU of 8,000,000 / {cpus} entries \
             per CPU); frames checked by Katran's own layout (outer source 172.16.x.y, the router MAC) and its \
             counters: tx / pass / the VIP's packets, LRU misses only on the SYNs, none on a per-CPU LRU fallback.\n",
            path.display()
        );
    }
    Ok(())
}
