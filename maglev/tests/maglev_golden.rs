//! Freezes the Maglev tables and the flow hash across processes, machines and releases.
//!
//! `maglev/testdata/maglev/golden.txt` holds flow-hash vectors, offset/skip vectors and
//! tables for several backend sets and sizes (small ones in full, large ones as per-backend
//! counts, the first slots and an FNV-1a digest of every slot). If this test fails, an
//! upgrade would move flows to other backends: fix the code, don't re-bless, unless the
//! change is deliberate (and then say so in the release notes). Regenerate with
//! `RINGLB_BLESS=1 cargo nextest run -p ringlb-maglev --test maglev_golden`.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;

use ringlb_maglev::hash::backend_offset_skip;
use ringlb_maglev::{Backend, Table, flow_hash};

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/maglev/golden.txt")
}

fn v4(i: u32) -> IpAddr {
    IpAddr::from((0x0a00_0000 | i).to_be_bytes())
}

fn v6(i: u32) -> IpAddr {
    IpAddr::from(std::net::Ipv6Addr::from(
        (0x2001_0db8_u128 << 96) | u128::from(i),
    ))
}

fn fnv1a64(slots: &[u32]) -> u64 {
    slots
        .iter()
        .flat_map(|s| s.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

struct Case {
    name: &'static str,
    size: u32,
    backends: Vec<Backend>,
}

fn cases() -> Vec<Case> {
    let eq = |n: u32, port: u16| -> Vec<Backend> {
        (1..=n)
            .map(|i| Backend {
                addr: v4(i),
                port,
                weight: 1,
            })
            .collect()
    };
    vec![
        Case {
            name: "v4-3-equal",
            size: 251,
            backends: eq(3, 8080),
        },
        Case {
            name: "mixed-5-weighted",
            size: 251,
            backends: vec![
                Backend {
                    addr: v4(1),
                    port: 80,
                    weight: 1,
                },
                Backend {
                    addr: v4(2),
                    port: 80,
                    weight: 2,
                },
                Backend {
                    addr: v6(1),
                    port: 80,
                    weight: 3,
                },
                Backend {
                    addr: v6(2),
                    port: 443,
                    weight: 4,
                },
                Backend {
                    addr: v6(3),
                    port: 443,
                    weight: 0,
                },
            ],
        },
        Case {
            name: "v4-10-equal",
            size: 65_537,
            backends: eq(10, 80),
        },
        Case {
            name: "v6-100-weighted",
            size: 65_537,
            backends: (1..=100)
                .map(|i| Backend {
                    addr: v6(i),
                    port: 9000,
                    weight: 1 + i % 7,
                })
                .collect(),
        },
        Case {
            name: "v4-1000-equal",
            size: 65_537,
            backends: eq(1000, 80),
        },
        Case {
            name: "v4-50-equal-max",
            size: 1_048_573,
            backends: eq(50, 53),
        },
    ]
}

fn render() -> String {
    let mut out = String::new();
    let w = &mut out;
    writeln!(w, "# ringlb Maglev golden vectors. DO NOT EDIT BY HAND.").unwrap();
    writeln!(
        w,
        "# Regenerate: RINGLB_BLESS=1 cargo nextest run -p ringlb-maglev --test maglev_golden"
    )
    .unwrap();
    writeln!(
        w,
        "# A change here moves flows to other backends across an upgrade."
    )
    .unwrap();
    writeln!(
        w,
        "\n# flow_hash <src> <dst> <sport> <dport> <proto> = <hash hex>"
    )
    .unwrap();
    let flows: [(&str, &str, u16, u16, u8); 6] = [
        ("10.0.0.1", "10.0.0.2", 80, 12345, 6),
        ("192.0.2.7", "198.51.100.1", 40000, 443, 6),
        ("192.0.2.7", "198.51.100.1", 40000, 53, 17),
        ("2001:db8::1", "2001:db8::ff", 443, 65535, 6),
        ("::", "::", 0, 0, 0),
        ("255.255.255.255", "0.0.0.0", 65535, 1, 255),
    ];
    for (s, d, sp, dp, p) in flows {
        let h = flow_hash(s.parse().unwrap(), d.parse().unwrap(), sp, dp, p);
        writeln!(w, "flow_hash {s} {d} {sp} {dp} {p} = {h:08x}").unwrap();
    }
    writeln!(w, "\n# offset_skip <addr> <port> <M> = <offset> <skip>").unwrap();
    for (a, p) in [(v4(1), 80u16), (v4(2), 80), (v6(1), 443), (v4(1), 81)] {
        for m in [251u32, 65_537, 1_048_573] {
            let (o, s) = backend_offset_skip(a, p, m);
            writeln!(w, "offset_skip {a} {p} {m} = {o} {s}").unwrap();
        }
    }
    for c in cases() {
        // Reverse the input to show the order does not matter.
        let mut input = c.backends.clone();
        input.reverse();
        let t = Table::build(&input, c.size).expect("golden case builds");
        writeln!(
            w,
            "\ntable {} M={} N={}",
            c.name,
            c.size,
            t.backends().len()
        )
        .unwrap();
        if t.backends().len() <= 10 {
            for (i, b) in t.backends().iter().enumerate() {
                writeln!(w, "backend {i} {} {} weight={}", b.addr, b.port, b.weight).unwrap();
            }
        }
        let counts: Vec<String> = t.slot_counts().iter().map(u32::to_string).collect();
        writeln!(w, "counts {}", counts.join(" ")).unwrap();
        writeln!(w, "fnv1a64 {:016x}", fnv1a64(t.slots())).unwrap();
        let n = if c.size <= 251 { t.slots().len() } else { 64 };
        for chunk in t.slots()[..n].chunks(32) {
            let s: Vec<String> = chunk.iter().map(u32::to_string).collect();
            writeln!(w, "slots {}", s.join(" ")).unwrap();
        }
    }
    out
}

#[test]
fn golden_tables_and_hashes() {
    let got = render();
    let path = golden_path();
    if std::env::var_os("RINGLB_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
        eprintln!("blessed {}", path.display());
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; create it with RINGLB_BLESS=1 cargo nextest run -p ringlb-maglev --test maglev_golden",
            path.display()
        )
    });
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        assert_eq!(g, w, "golden mismatch at {}:{}", path.display(), i + 1);
    }
    assert_eq!(
        got.lines().count(),
        want.lines().count(),
        "golden line count"
    );
}
