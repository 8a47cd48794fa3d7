//! Maglev table build and lookup, ours side by side with the crates a user would pick
//! instead, in one run: `cargo bench -p ringlb-bench --bench maglev`.
//!
//! Before timing anything, every table (ours and each peer's) is read back slot by slot
//! and checked to be a valid equal-weight Maglev table (every slot filled, every backend
//! floor(M/N) or ceil(M/N) slots), so no peer looks fast by doing something else.
//!
//! `maglev` 0.2 and `hash-rings` materialise all permutations (N*M usizes): at M=655,373
//! and N=1,000 that is 5.2 GB per build, so those two cells are skipped unless
//! `RINGLB_BENCH_HUGE=1` is set. Sample counts are kept small so the whole run takes a
//! few minutes on a busy 2-core machine.

use std::hint::black_box;
use std::net::IpAddr;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ringlb_maglev::{Table, flow_hash};

mod maglev_peers;
use maglev_peers::{Peer, assert_valid_maglev, backends, build};

const CASES: [(u32, usize); 4] = [
    (65_537, 10),
    (65_537, 100),
    (65_537, 1_000),
    (655_373, 1_000),
];

fn huge_ok(peer: Peer, n: usize, m: u32) -> bool {
    peer.build_bytes(n, m as usize) < (1 << 30)
        || std::env::var_os("RINGLB_BENCH_HUGE").is_some_and(|v| v == "1")
}

fn validate() {
    for (m, n) in CASES {
        let nodes = backends(n);
        let ours = Table::build(&nodes, m).expect("build");
        assert_eq!(
            ours.backends(),
            &nodes[..],
            "our canonical order is the input order here"
        );
        assert_valid_maglev("ringlb", ours.slots(), n);
        for peer in Peer::ALL {
            if !huge_ok(peer, n, m) {
                eprintln!(
                    "validate: skipping {} at M={m} N={n}: needs {} MB of permutations",
                    peer.name(),
                    peer.build_bytes(n, m as usize) >> 20
                );
                continue;
            }
            let t = build(peer, &nodes, m as usize);
            assert_eq!(t.size(), m as usize, "{} picked another M", peer.name());
            assert_valid_maglev(peer.name(), &t.slots(&nodes), n);
        }
    }
    eprintln!("validate: every table is a valid Maglev table (all slots, floor/ceil shares)");
}

fn bench_build(c: &mut Criterion) {
    validate();
    for (m, n) in CASES {
        let nodes = backends(n);
        let mut g = c.benchmark_group(format!("build M={m} N={n}"));
        g.bench_function("ringlb", |b| {
            b.iter(|| Table::build(black_box(&nodes), black_box(m)).unwrap())
        });
        for peer in Peer::ALL {
            if huge_ok(peer, n, m) {
                g.bench_function(peer.name(), |b| {
                    b.iter(|| build(peer, black_box(&nodes), black_box(m as usize)))
                });
            }
        }
        g.finish();
    }
}

fn bench_lookup(c: &mut Criterion) {
    let (m, n) = (65_537u32, 1_000usize);
    let nodes = backends(n);
    let ours = Table::build(&nodes, m).unwrap();
    // 4096 distinct flows / keys, cycled, so nothing is constant-folded or cache-trivial.
    let flows: Vec<(IpAddr, u16)> = (0..4096u32)
        .map(|i| {
            (
                IpAddr::from((0xc000_0200 ^ i.wrapping_mul(2_654_435_761)).to_be_bytes()),
                i as u16,
            )
        })
        .collect();
    let dst = IpAddr::from([198, 51, 100, 1]);
    let hashes: Vec<u32> = flows
        .iter()
        .map(|&(s, p)| flow_hash(s, dst, p, 443, 6))
        .collect();
    let mut g = c.benchmark_group(format!("lookup M={m} N={n}"));
    g.bench_function("ringlb flow_hash+lookup", |b| {
        let mut i = 0usize;
        b.iter(|| {
            let (s, p) = flows[i & 4095];
            i += 1;
            *ours.lookup(flow_hash(black_box(s), dst, p, 443, 6))
        })
    });
    g.bench_function("ringlb lookup (hash given)", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i += 1;
            *ours.lookup(black_box(hashes[i & 4095]))
        })
    });
    for peer in Peer::ALL {
        let t = build(peer, &nodes, m as usize);
        g.bench_function(format!("{} get(u64)", peer.name()), |b| {
            let mut k = 0u64;
            b.iter(|| {
                k += 1;
                t.get(black_box(k))
            })
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_build, bench_lookup
}
criterion_main!(benches);
