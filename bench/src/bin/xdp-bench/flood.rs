//! Section `flood`: 1 M packets from new sources to VIP A while established
//! flows of VIP B keep sending; B's ring changed before the flood (its
//! backends doubled, the old ones all kept), so a flow whose conntrack entry
//! the flood evicts follows the new ring and moves. Two floods: SYNs (never
//! followed by an ACK: a spoofed SYN flood) and ACKs (each a new flow's
//! first non-SYN packet, which inserts unless the VIP's insert budget is
//! spent). Counts the flows that moved, for each build of the production
//! program, without and with the insert budget, in one run.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Context, bail, ensure};
use ringlb_maglev::{Backend, Table, flow_hash};
use ringlb_xdp::{
    Datapath, DesiredState,
    xdp::{XdpDatapath, test_run},
};

use crate::Args;
use crate::check;
use crate::setup::{
    XDP_TX, ack, backend_addr, counter, load_budgeted, service, syn, syn_frame, variants,
};

const A: u32 = 0;
const B: u32 = 1;
/// Flow numbers of B's established flows (sources apart from the flood's).
const FLOW0: u32 = 4_000_000;

/// Sends `p` for VIP `vip` (backends `0..nb`): the backend it went to.
fn send(dp: &XdpDatapath, p: &[u8], vip: u32, nb: u32) -> anyhow::Result<Ipv4Addr> {
    let mut out = [0u8; 256];
    let (verdict, len, _) = test_run(dp.program()?, p, &mut out, 1)?;
    ensure!(verdict == XDP_TX, "verdict {verdict}");
    check::encapped(p, &out[..len], vip, nb)
}

/// B's flows whose backend on B's new ring differs from their backend now:
/// those a lost conntrack entry would move.
fn exposed(a: &Args, now: &BTreeMap<u32, Ipv4Addr>) -> anyhow::Result<usize> {
    let bs: Vec<Backend> = (0..2 * a.backends)
        .map(|b| Backend {
            addr: backend_addr(B, b),
            port: 8080,
            weight: 1,
        })
        .collect();
    let table = Table::build(&bs, a.ring).context("maglev table")?;
    let mut n = 0;
    for (k, was) in now {
        let f = syn_frame(B, *k);
        let to = table
            .lookup(flow_hash(f.src, f.dst, f.sport, f.dport, 6))
            .addr;
        n += usize::from(to != IpAddr::V4(*was));
    }
    Ok(n)
}

/// What floods VIP A.
#[derive(Clone, Copy)]
enum Flood {
    Syn,
    Ack,
}

impl Flood {
    fn packet(self, n: u32) -> Vec<u8> {
        match self {
            Flood::Syn => syn(A, n),
            Flood::Ack => ack(A, n),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Flood::Syn => "SYN",
            Flood::Ack => "ACK",
        }
    }
}

struct Outcome {
    moved: usize,
    exposed: usize,
    rounds: u32,
    syn_ring: u64,
    over_budget: u64,
    hits: u64,
    misses: u64,
    secs: f64,
}

fn run_one(a: &Args, prod: &'static [u8], flood: Flood, budget: u32) -> anyhow::Result<Outcome> {
    let nb = a.backends;
    let mut d = DesiredState::default();
    for v in [A, B] {
        let (vip, s) = service(v, nb, a.ring, 0)?;
        d.services.insert(vip, s);
    }
    let mut dp = load_budgeted(prod, &d, budget)?;
    // B's flows: the handshake, then one more packet each (a hit)
    let mut was = BTreeMap::new();
    for k in FLOW0..FLOW0 + a.flood_flows {
        let to = send(&dp, &syn(B, k), B, nb)?;
        ensure!(
            send(&dp, &ack(B, k), B, nb)? == to,
            "flow {k}: ACK elsewhere"
        );
        ensure!(
            send(&dp, &ack(B, k), B, nb)? == to,
            "flow {k}: ACK elsewhere"
        );
        was.insert(k, to);
    }
    // B's ring changes: twice the backends, every old one kept
    let (vb, sb) = service(B, 2 * nb, a.ring, 0)?;
    dp.apply_service(&vb, Some(&sb))?;
    let exposed = exposed(a, &was)?;
    let (syn0, over0, hit0, miss0) = (
        syns_without_insert(&dp)?,
        counter(&dp, "ct_over_budget")?,
        counter(&dp, "ct_hit")?,
        counter(&dp, "ct_miss")?,
    );
    let mut moved = BTreeSet::new();
    let mut rounds = 0;
    let t = std::time::Instant::now();
    let mut round = |dp: &XdpDatapath| -> anyhow::Result<()> {
        for (k, to) in &was {
            if send(dp, &ack(B, *k), B, 2 * nb)? != *to {
                moved.insert(*k);
            }
        }
        rounds += 1;
        Ok(())
    };
    for i in 0..a.flood_syns {
        send(&dp, &flood.packet(i), A, nb).with_context(|| format!("{} {i}", flood.name()))?;
        if (i + 1) % a.flood_every == 0 {
            round(&dp)?;
        }
    }
    round(&dp)?;
    let secs = t.elapsed().as_secs_f64();
    if counter(&dp, "drop_no_backend")? != 0 {
        bail!("drops during the flood");
    }
    Ok(Outcome {
        moved: moved.len(),
        exposed,
        rounds,
        syn_ring: syns_without_insert(&dp)? - syn0,
        over_budget: counter(&dp, "ct_over_budget")? - over0,
        hits: counter(&dp, "ct_hit")? - hit0,
        misses: counter(&dp, "ct_miss")? - miss0,
        secs,
    })
}

/// SYNs forwarded by the ring without an insert: after a lookup
/// (`ct_syn_ring`) or without one (`ct_syn_filtered`, the flow filter).
fn syns_without_insert(dp: &XdpDatapath) -> anyhow::Result<u64> {
    Ok(counter(dp, "ct_syn_ring")? + counter(dp, "ct_syn_filtered")?)
}

pub(crate) fn section_flood(a: &Args) -> anyhow::Result<()> {
    let cpu = ringlb_testkit::bench::pin_to_current_cpu().context("sched_setaffinity")?;
    let budget = ringlb_xdp::xdp::auto_ct_insert_budget()?;
    println!("## Floods of new flows: established flows of another VIP\n");
    println!(
        "BPF_PROG_TEST_RUN on CPU {cpu}, production objects. VIP B: {} established flows (SYN, ACK, ACK), then B's ring \
         changes ({} -> {} backends, all old ones kept). Then {} packets to VIP A from new sources: SYNs never followed \
         by an ACK, or ACKs (each a new flow's first packet after the handshake); every {} of them, and once at the end, \
         each of B's flows sends an ACK. Every output is checked (outer header, a backend of the VIP). `moved` = B's \
         flows whose ACK reached another backend than before the flood; `exposed` = those B's new ring would move if \
         their entry were lost. Insert budget: new conntrack entries per VIP per CPU per window of at least a \
         second (0 = no limit; \
         {budget} is the edge's default, `--ct-insert-budget=auto`, on this machine).\n",
        a.flood_flows,
        a.backends,
        2 * a.backends,
        a.flood_syns,
        a.flood_every
    );
    println!(
        "| flood | program | insert budget | moved | exposed | ACK rounds | ct_syn_ring + ct_syn_filtered | ct_over_budget | ct_hit | ct_miss | seconds |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for flood in [Flood::Syn, Flood::Ack] {
        // (variants with a budget of their own measure its cost per packet)
        for v in variants().into_iter().filter(|v| v.budget == 0) {
            for b in [0, budget] {
                let o = run_one(a, v.prod, flood, b)?;
                println!(
                    "| {} | {} | {} | **{}** of {} | {} | {} | {} | {} | {} | {} | {:.1} |",
                    flood.name(),
                    v.name,
                    b,
                    o.moved,
                    a.flood_flows,
                    o.exposed,
                    o.rounds,
                    o.syn_ring,
                    o.over_budget,
                    o.hits,
                    o.misses,
                    o.secs
                );
            }
        }
    }
    println!();
    Ok(())
}
