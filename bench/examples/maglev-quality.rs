//! Maglev table quality, ours against the peer crates, as markdown:
//! `cargo run --release -p ringlb-bench --example maglev-quality`
//!
//! For N = 1,000 backends and M = 65,537 (and M = 655,373 where a peer can afford it):
//! the slot spread (max/min slots per backend) and the disruption when 1%, 5% and 10% of
//! the backends fail: the fraction of slots whose backend changed, how much of that is the
//! failed backends' own slots (unavoidable), and the surplus beyond it. Every table is
//! read back slot by slot (peers via `benches/maglev_peers`) and checked first.

use ringlb_maglev::{Backend, Table};

#[path = "../benches/maglev_peers/mod.rs"]
mod maglev_peers;
use maglev_peers::{Peer, assert_valid_maglev, backends, build, counts};

const N: usize = 1_000;
const FAIL_PCT: [usize; 3] = [1, 5, 10];

/// The first `k` backends of a fixed pseudo-random permutation of `0..n` fail.
fn failed(n: usize, k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        idx.swap(i, (s % (i as u64 + 1)) as usize);
    }
    idx.truncate(k);
    idx.sort_unstable();
    idx
}

/// One implementation: builds a table over `nodes` and returns it as indices into `nodes`.
type Builder<'a> = Box<dyn Fn(&[Backend], u32) -> Vec<u32> + 'a>;

struct Row {
    name: String,
    spread: String,
    cells: Vec<String>,
}

fn measure(name: &str, m: u32, nodes: &[Backend], f: &Builder, equal: bool) -> Row {
    let base = f(nodes, m);
    if equal {
        assert_valid_maglev(name, &base, nodes.len());
    }
    let c = counts(&base, nodes.len());
    // Spread in slots per unit of weight, so weighted rows are comparable.
    let per_w: Vec<f64> = c
        .iter()
        .zip(nodes)
        .map(|(&x, b)| f64::from(x) / f64::from(b.weight))
        .collect();
    let (mx, mn) = per_w
        .iter()
        .fold((f64::MIN, f64::MAX), |(a, b), &x| (a.max(x), b.min(x)));
    let spread = format!("{mx:.1}/{mn:.1} = {:.3}", mx / mn);
    let mut cells = Vec::new();
    for pct in FAIL_PCT {
        let gone = failed(nodes.len(), nodes.len() * pct / 100);
        let alive: Vec<Backend> = (0..nodes.len())
            .filter(|i| gone.binary_search(i).is_err())
            .map(|i| nodes[i])
            .collect();
        let after = f(&alive, m);
        let (mut changed, mut own) = (0usize, 0usize);
        for (o, a) in base.iter().zip(&after) {
            let was = nodes[*o as usize];
            if was != alive[*a as usize] {
                changed += 1;
            }
            if gone.binary_search(&(*o as usize)).is_ok() {
                own += 1;
            }
        }
        let mf = f64::from(m);
        cells.push(format!(
            "{:.2}% ({:.2}% + {:.2}%, x{:.2})",
            100.0 * changed as f64 / mf,
            100.0 * own as f64 / mf,
            100.0 * (changed - own) as f64 / mf,
            changed as f64 / own as f64,
        ));
    }
    Row {
        name: name.to_string(),
        spread,
        cells,
    }
}

fn ours() -> Builder<'static> {
    Box::new(|nodes: &[Backend], m: u32| {
        let t = Table::build(nodes, m).expect("build");
        // Our canonical order is by address: map back to the caller's indices.
        let map: Vec<u32> = t
            .backends()
            .iter()
            .map(|b| nodes.iter().position(|x| x == b).expect("same set") as u32)
            .collect();
        t.slots().iter().map(|&s| map[s as usize]).collect()
    })
}

fn peer(p: Peer) -> Builder<'static> {
    Box::new(move |nodes: &[Backend], m: u32| {
        let t = build(p, nodes, m as usize);
        assert_eq!(t.size(), m as usize, "{} picked another M", p.name());
        t.slots(nodes)
    })
}

fn table(m: u32) {
    let nodes = backends(N);
    let weighted: Vec<Backend> = nodes
        .iter()
        .enumerate()
        .map(|(i, b)| Backend {
            weight: 1 + (i % 4) as u32,
            ..*b
        })
        .collect();
    println!("\n### M = {m}, N = {N}\n");
    println!(
        "Disruption cells: slots changed (failed backends' own slots + surplus, changed/own).\n"
    );
    println!("| implementation | max/min slots | 1% fail | 5% fail | 10% fail |");
    println!("|---|---|---|---|---|");
    let mut rows = vec![measure("ringlb", m, &nodes, &ours(), true)];
    let mut skipped = Vec::new();
    for p in Peer::ALL {
        let huge = std::env::var_os("RINGLB_BENCH_HUGE").is_some_and(|v| v == "1");
        if p.build_bytes(N, m as usize) >= (1 << 30) && !huge {
            skipped.push(format!(
                "| {} | skipped: needs {} MB of permutations per build (RINGLB_BENCH_HUGE=1) | | | |",
                p.name(),
                p.build_bytes(N, m as usize) >> 20
            ));
            continue;
        }
        rows.push(measure(p.name(), m, &nodes, &peer(p), true));
    }
    rows.push(measure(
        "ringlb, weights 1..4 (spread per unit weight)",
        m,
        &weighted,
        &ours(),
        false,
    ));
    for r in rows {
        println!("| {} | {} | {} |", r.name, r.spread, r.cells.join(" | "));
    }
    for s in skipped {
        println!("{s}");
    }
}

fn main() {
    println!(
        "## Maglev table quality (`cargo run --release -p ringlb-bench --example maglev-quality`)"
    );
    table(65_537);
    table(655_373);
}
