//! The operator's `lookup` against the program itself (BPF_PROG_TEST_RUN),
//! and conntrack per (VIP, backend): for every case the answer of
//! `XdpDatapath::lookup` (taken first: it is read-only) must be what the
//! program then does with the packet, verdict, backend and conntrack counter.
//! Cases the loader never writes itself (an empty ring slot, a ring naming a
//! tombstone, a conntrack entry of another generation) are made by editing the
//! pinned maps, the way an operator with bpftool could. Needs root; skips
//! loudly otherwise.

mod xdp_support;
use xdp_support::fixture::*;
use xdp_support::{BpfFs, one_next_hop, private_bpffs};

use std::net::{IpAddr, SocketAddr};

use aya::maps::{Array, ArrayOfMaps, HashMap, Map, MapData};
use ringlb_nexthop::NextHop;
use ringlb_testkit::packet::Frame;
use ringlb_xdp::{
    Datapath, Proto, Vip, abi, cli,
    lookup::{CtState, Lookup},
    xdp::{XdpDatapath, XdpOptions},
};

fn load(pin: Option<&BpfFs>) -> Option<XdpDatapath> {
    let o = XdpOptions {
        pin_dir: pin.map(|p| p.path().join("ringlb")),
        ..opts(1500, false)
    };
    load_resolving(&o, one_next_hop())
}

fn vip(addr: &str, port: u16) -> Vip {
    Vip {
        addr: ip(addr),
        port,
        proto: Proto::Tcp,
    }
}

/// What happened to a packet, from the program or predicted by `lookup`.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Pass,
    Drop,
    /// Encapsulated to this pod; `true` if conntrack decided.
    To(IpAddr, bool),
}

/// Asks `lookup`, then runs the packet through the program, and checks they
/// agree (including which conntrack counter moved). Returns the outcome.
fn agree(dp: &XdpDatapath, src: &str, dst: &str) -> (Outcome, Lookup) {
    let (src, dst): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
    let said = dp.lookup(&cli::flow(Proto::Tcp, src, dst)).unwrap();
    let predicted = match said {
        Lookup::NotVip { .. } | Lookup::AliasPlain { .. } => Outcome::Pass,
        Lookup::NoBackend { .. } | Lookup::SourceRefused { .. } | Lookup::NoService { .. } => {
            Outcome::Drop
        }
        Lookup::Backend {
            addr, conntrack, ..
        }
        | Lookup::Affinity {
            addr, conntrack, ..
        } => Outcome::To(addr, conntrack == CtState::Hit),
    };
    let want_ct = match said {
        Lookup::Backend { conntrack, .. }
        | Lookup::Affinity { conntrack, .. }
        | Lookup::NoBackend { conntrack, .. } => Some(conntrack),
        // refused before the ring and before the hit is counted: no ct counter
        Lookup::AliasPlain { .. } | Lookup::SourceRefused { .. } => None,
        Lookup::NotVip { conntrack } | Lookup::NoService { conntrack } => Some(match conntrack {
            CtState::Miss => CtState::Off, // the program counts no ct_miss for a non-VIP
            other => other,
        }),
    };
    const COUNTERS: [&str; 5] = [
        "ct_hit",
        "ct_stale",
        "ct_miss",
        "drop_no_backend",
        "drop_no_service",
    ];
    let before: Vec<u64> = COUNTERS.iter().map(|l| counter(dp, l)).collect();
    // an ACK: lookup answers for any packet but a SYN (which never follows a conntrack entry)
    let frame = Frame::tcp(src.ip(), dst.ip(), src.port(), dst.port())
        .established()
        .bytes();
    let mut out = vec![0u8; frame.len() + 128];
    let (verdict, len, _) = dp.test_run(&frame, &mut out, 1).unwrap();
    out.truncate(len);
    let delta: Vec<u64> = COUNTERS
        .iter()
        .zip(&before)
        .map(|(l, b)| counter(dp, l) - b)
        .collect();
    let did = match verdict {
        XDP_PASS => Outcome::Pass,
        XDP_DROP => Outcome::Drop,
        XDP_TX => {
            let d: [u8; 4] = out[14 + 16..14 + 20].try_into().unwrap();
            Outcome::To(IpAddr::from(d), delta[0] == 1)
        }
        v => panic!("verdict {v}"),
    };
    assert_eq!(did, predicted, "{src} -> {dst}: lookup said {said:?}");
    let want_delta = match want_ct {
        None | Some(CtState::Off) => [0, 0, 0],
        Some(CtState::Hit) => [1, 0, 0],
        Some(CtState::Stale { .. }) => [0, 1, 0],
        Some(CtState::Miss) => [0, 0, 1],
    };
    assert_eq!(&delta[..3], &want_delta, "{src} -> {dst}: {said:?}");
    let no_backend = matches!(said, Lookup::NoBackend { .. });
    assert_eq!(delta[3], u64::from(no_backend), "drop_no_backend: {said:?}");
    let no_service = matches!(said, Lookup::NoService { .. });
    assert_eq!(delta[4], u64::from(no_service), "drop_no_service: {said:?}");
    (did, said)
}

/// Pod P backs VIPs A and B. P leaves A only: A's established flow to P is
/// rebalanced (its conntrack entry is stale), B's flow to P stays.
#[test]
fn a_pod_leaving_one_vip_keeps_its_flows_of_the_other_vip() {
    let Some(mut dp) = load(None) else { return };
    let (a, b) = (vip("10.100.0.1", 80), vip("10.100.0.2", 80));
    let (p, q) = ("10.1.0.1", "10.1.0.2");
    dp.apply(&state(vec![
        (a, svc(&a, &[p, q], 0)),
        (b, svc(&b, &[p, q], 0)),
    ]))
    .unwrap();
    let to_a = ("192.0.2.7:40000", "10.100.0.1:80");
    let to_b = ("192.0.2.7:40000", "10.100.0.2:80");
    assert_eq!(agree(&dp, to_a.0, to_a.1).0, Outcome::To(ip(p), false));
    assert_eq!(agree(&dp, to_b.0, to_b.1).0, Outcome::To(ip(p), false));
    assert_eq!(agree(&dp, to_a.0, to_a.1).0, Outcome::To(ip(p), true));

    // P leaves A; B's ring moves to Q too, but P still backs B
    dp.apply(&state(vec![
        (a, svc(&a, &[q], 0)),
        (b, svc(&b, &[p, q], 1)),
    ]))
    .unwrap();
    let (out, said) = agree(&dp, to_a.0, to_a.1);
    assert_eq!(out, Outcome::To(ip(q), false), "A's flow leaves P");
    assert!(found_stale(&said), "{said:?}");
    assert_eq!(
        agree(&dp, to_b.0, to_b.1).0,
        Outcome::To(ip(p), true),
        "B's established flow stays on P"
    );
    // and A's flow is pinned to Q from now on
    assert_eq!(agree(&dp, to_a.0, to_a.1).0, Outcome::To(ip(q), true));
}

/// `lookup` named a backend for the flow after finding its conntrack entry
/// stale.
fn found_stale(said: &Lookup) -> bool {
    matches!(
        said,
        Lookup::Backend {
            conntrack: CtState::Stale { .. },
            ..
        }
    )
}

fn pinned(dir: &BpfFs, name: &str) -> MapData {
    MapData::from_pin(dir.path().join("ringlb").join(name)).unwrap()
}

#[test]
fn lookup_agrees_with_the_program_in_every_case() {
    let Some(fs) = private_bpffs("the xdp lookup test (BPF, bpffs)", "lookup") else {
        return;
    };
    let Some(mut dp) = load(Some(&fs)) else {
        return;
    };
    let (a, w, n) = (
        vip("10.100.0.1", 80),
        vip("10.100.0.5", 0),
        vip("10.100.0.9", 80),
    );
    let (p, q) = ("10.1.0.1", "10.1.0.2");
    dp.apply(&state(vec![
        (a, svc(&a, &[p, q], 0)),
        (w, svc(&w, &[q], 0)),
        (n, svc(&n, &[p], 0).without_conntrack()),
    ]))
    .unwrap();

    // a VIP address on a port no VIP has: dropped (passed, it would loop)
    let (out, said) = agree(&dp, "192.0.2.7:1", "10.100.0.1:81");
    assert_eq!(out, Outcome::Drop);
    assert_eq!(
        said,
        Lookup::NoService {
            conntrack: CtState::Miss
        }
    );
    // not a VIP address at all
    assert_eq!(agree(&dp, "192.0.2.7:1", "10.100.0.3:80").0, Outcome::Pass);
    // the port-0 wildcard, miss then hit
    let (out, said) = agree(&dp, "192.0.2.7:1", "10.100.0.5:8443");
    assert_eq!(out, Outcome::To(ip(q), false));
    assert!(
        matches!(said, Lookup::Backend { vip, .. } if vip == w),
        "{said:?}"
    );
    assert_eq!(
        agree(&dp, "192.0.2.7:1", "10.100.0.5:8443").0,
        Outcome::To(ip(q), true)
    );
    // conntrack off: the ring decides every time
    for _ in 0..2 {
        let (out, said) = agree(&dp, "192.0.2.7:2", "10.100.0.9:80");
        assert_eq!(out, Outcome::To(ip(p), false));
        assert!(
            matches!(
                said,
                Lookup::Backend {
                    conntrack: CtState::Off,
                    ..
                }
            ),
            "{said:?}"
        );
    }

    // a conntrack entry of another generation (the id was reused): ignored
    let flow = ("192.0.2.8:3", "10.100.0.1:80");
    assert_eq!(agree(&dp, flow.0, flow.1).0, Outcome::To(ip(p), false));
    let p_id = dp.programmed().backend(&a, ip(p)).unwrap().id;
    let q_id = dp.programmed().backend(&a, ip(q)).unwrap().id;
    let mut ct: HashMap<MapData, abi::Flow, abi::CtValue> =
        HashMap::try_from(Map::LruHashMap(pinned(&fs, "conntrack"))).unwrap();
    let key = cli::flow(Proto::Tcp, flow.0.parse().unwrap(), flow.1.parse().unwrap());
    let q_gen = dp.programmed().backend(&a, ip(q)).unwrap().generation;
    ct.insert(
        key,
        abi::CtValue {
            backend_id: q_id,
            generation: q_gen + 100,
        },
        0,
    )
    .unwrap();
    let (out, said) = agree(&dp, flow.0, flow.1);
    assert_eq!(out, Outcome::To(ip(p), false), "the ring, not Q");
    assert_eq!(
        said,
        Lookup::Backend {
            vip: a,
            id: p_id,
            addr: ip(p),
            conntrack: CtState::Stale {
                id: q_id,
                generation: q_gen + 100
            },
            slot: match said {
                Lookup::Backend { slot, .. } => slot,
                _ => None,
            },
        }
    );

    // the ring names a tombstone (family 0): dropped, also for the
    // established flow whose entry now points at a dead slot
    let mut backends: Array<MapData, abi::BackendValue> =
        Array::try_from(Map::Array(pinned(&fs, "backends"))).unwrap();
    backends
        .set(
            p_id,
            abi::BackendValue {
                generation: 999,
                ..Default::default()
            },
            0,
        )
        .unwrap();
    let (out, said) = agree(&dp, flow.0, flow.1);
    assert_eq!(out, Outcome::Drop);
    assert!(
        matches!(said, Lookup::NoBackend { id, conntrack: CtState::Stale { .. }, .. } if id == p_id),
        "{said:?}"
    );
    assert_eq!(agree(&dp, "192.0.2.9:4", "10.100.0.1:80").0, Outcome::Drop);

    // an empty ring slot (id 0) on the wildcard VIP: dropped
    let rings: ArrayOfMaps<MapData, Array<MapData, u32>> =
        ArrayOfMaps::try_from(Map::ArrayOfMaps(pinned(&fs, "rings"))).unwrap();
    let mut ring = rings.get(&dp.programmed().vips[&w].vip_id, 0).unwrap();
    for s in 0..13 {
        ring.set(s, 0, 0).unwrap();
    }
    let (out, said) = agree(&dp, "192.0.2.7:5", "10.100.0.5:9000");
    assert_eq!(out, Outcome::Drop);
    assert!(
        matches!(
            said,
            Lookup::NoBackend {
                id: 0,
                conntrack: CtState::Miss,
                ..
            }
        ),
        "{said:?}"
    );
    // the flow that conntrack pinned to Q on the wildcard VIP still goes there
    assert_eq!(
        agree(&dp, "192.0.2.7:1", "10.100.0.5:8443").0,
        Outcome::To(ip(q), true)
    );
    dp.uninstall().unwrap();
}

/// A resolver that counts its calls and whose answer for one address can be
/// changed (a neighbour's MAC moving).
#[derive(Clone, Default)]
struct Counting {
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    moved: std::sync::Arc<std::sync::Mutex<Option<IpAddr>>>,
}

impl ringlb_nexthop::Resolver for Counting {
    fn resolve(&self, addr: IpAddr) -> Result<NextHop, ringlb_nexthop::Error> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let moved = *self.moved.lock().unwrap() == Some(addr);
        Ok(NextHop {
            ifindex: 0,
            smac: [2, 0, 0, 0, 0, 1],
            dmac: [2, 0, 0, 0, 0, if moved { 9 } else { 2 }],
            vlan: None,
        })
    }
}

/// A pod in three services has three backend ids but one next hop: a refresh
/// resolves it once and rewrites all three entries when it moves.
#[test]
fn next_hops_are_resolved_once_per_pod_not_per_id() {
    use std::sync::atomic::Ordering::SeqCst;
    let r = Counting::default();
    let Some(mut dp) = load_resolving(&opts(1500, false), Box::new(r.clone())) else {
        return;
    };
    let (a, b, c) = (
        vip("10.100.0.1", 80),
        vip("10.100.0.1", 443),
        vip("10.100.0.2", 80),
    );
    let (p, q) = ("10.1.0.1", "10.1.0.2");
    dp.apply(&state(vec![
        (a, svc(&a, &[p, q], 0)),
        (b, svc(&b, &[p, q], 1)),
        (c, svc(&c, &[p], 0)),
    ]))
    .unwrap();
    assert_eq!(
        dp.programmed().backends().count(),
        5,
        "one id per (VIP, pod)"
    );
    r.calls.store(0, SeqCst);
    assert_eq!(dp.refresh_next_hops().unwrap(), 0, "nothing moved");
    assert_eq!(r.calls.load(SeqCst), 2, "two pods, two resolutions");
    *r.moved.lock().unwrap() = Some(ip(p));
    r.calls.store(0, SeqCst);
    assert_eq!(
        dp.refresh_next_hops().unwrap(),
        3,
        "P's three ids rewritten"
    );
    assert_eq!(r.calls.load(SeqCst), 2);
    // and the program uses the new MAC for every VIP P backs
    let frame = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.2"), 1, 80).bytes();
    let mut out = vec![0u8; frame.len() + 128];
    let (verdict, _, _) = dp.test_run(&frame, &mut out, 1).unwrap();
    assert_eq!(verdict, XDP_TX);
    assert_eq!(&out[..6], &[2, 0, 0, 0, 0, 9]);
}

/// On a conntrack hit the program counts the packet for the VIP that owns
/// the backend id, without looking at `vips`; `lookup` names that VIP, also
/// when an exact VIP:port appeared after a wildcard VIP's flow began. A
/// retired id's entry is reported stale; once no VIP has the address, the
/// packet is passed before conntrack (vip_filter).
#[test]
fn lookup_names_the_owning_vip_and_a_deleted_vips_stale_entry() {
    let Some(mut dp) = load(None) else { return };
    let (w, e) = (vip("10.100.0.5", 0), vip("10.100.0.5", 8443));
    let (p, q) = ("10.1.0.1", "10.1.0.2");
    dp.apply(&state(vec![(w, svc(&w, &[p], 0))])).unwrap();
    let flow = ("192.0.2.7:40000", "10.100.0.5:8443");
    assert_eq!(agree(&dp, flow.0, flow.1).0, Outcome::To(ip(p), false));

    dp.apply(&state(vec![(w, svc(&w, &[p], 0)), (e, svc(&e, &[q], 0))]))
        .unwrap();
    let (out, said) = agree(&dp, flow.0, flow.1);
    assert_eq!(
        out,
        Outcome::To(ip(p), true),
        "the flow stays with the wildcard's pod"
    );
    assert!(
        matches!(said, Lookup::Backend { vip, .. } if vip == w),
        "named for the wildcard VIP that owns it: {said:?}"
    );
    let other = ("192.0.2.7:40001", "10.100.0.5:8443");
    assert_eq!(
        agree(&dp, other.0, other.1).0,
        Outcome::To(ip(q), false),
        "new flows: the exact VIP"
    );

    // the exact VIP goes, the wildcard stays: the address is still a VIP
    // address, so the flow's entry is looked up and found stale
    dp.apply(&state(vec![(w, svc(&w, &[q], 0))])).unwrap();
    let (out, said) = agree(&dp, flow.0, flow.1);
    assert_eq!(out, Outcome::To(ip(q), false), "the ring decides again");
    assert!(found_stale(&said), "{said:?}");

    // no VIP on the address any more: vip_filter passes the packet before
    // conntrack (no ct_stale, nothing deleted)
    dp.apply(&state(vec![])).unwrap();
    let (out, said) = agree(&dp, flow.0, flow.1);
    assert_eq!(out, Outcome::Pass);
    assert_eq!(
        said,
        Lookup::NotVip {
            conntrack: CtState::Miss
        },
        "{said:?}"
    );
}

/// More rings than the loader stages at once (each staged ring holds a file
/// descriptor until it enters the map of maps), under a limit of 1,000 open
/// files: applied in one plan, every VIP forwards to its pod; removed in one
/// plan, none does.
#[test]
fn more_rings_than_are_staged_at_once_all_arrive_and_all_go() {
    let o = XdpOptions {
        vip_capacity: 1_200,
        ..opts(1500, false)
    };
    let Some(mut dp) = load_with(&o) else {
        return;
    };
    // this test's own process (nextest runs one per test)
    let pid = std::process::id().to_string();
    let st = std::process::Command::new("prlimit")
        .args(["--pid", &pid, "--nofile=1000:1000"])
        .status()
        .expect("running prlimit (util-linux)");
    assert!(st.success(), "prlimit --nofile=1000:1000");
    let vips: Vec<Vip> = (0..1_100u32)
        .map(|i| vip(&format!("10.100.{}.{}", i / 200, i % 200 + 1), 80))
        .collect();
    let pods = ["10.1.0.1", "10.1.0.2"];
    let all = state(
        vips.iter()
            .enumerate()
            .map(|(i, v)| (*v, svc(v, &pods, (i % 2) as u32)))
            .collect(),
    );
    let st = dp.apply(&all).unwrap();
    assert_eq!(st.rings_created, 1_100);
    let forward = |dp: &XdpDatapath, i: usize| {
        let frame = Frame::tcp(ip("192.0.2.7"), vips[i].addr, 1, 80).bytes();
        let mut out = vec![0u8; frame.len() + 128];
        let (verdict, _, _) = dp.test_run(&frame, &mut out, 1).unwrap();
        (verdict, out)
    };
    for i in [0, 511, 512, 700, 1_099] {
        let (verdict, out) = forward(&dp, i);
        assert_eq!(verdict, XDP_TX, "VIP {i}");
        // the outer IPv4 header's destination: the VIP's pod
        assert_eq!(
            IpAddr::from([out[30], out[31], out[32], out[33]]),
            ip(pods[i % 2]),
            "VIP {i}"
        );
    }
    let st = dp.apply(&state(vec![])).unwrap();
    assert_eq!(st.rings_deleted, 1_100);
    for i in [0, 700, 1_099] {
        assert_eq!(forward(&dp, i).0, XDP_PASS, "VIP {i} is gone");
    }
}
