//! Loader life cycle against the real kernel: attach natively to a veth,
//! "restart" (drop the loader, load again from the pinned maps), replace the
//! program inside the pinned link, keep conntrack, then uninstall. Needs root;
//! skips loudly otherwise. Uses its own netns and a private bpffs mount.

mod xdp_support;

use std::net::IpAddr;

use ringlb_testkit::packet::Frame;
use ringlb_xdp::{
    Datapath, DesiredState, Programmed, Proto, ServiceEntry, Vip, abi, flow_filter,
    lookup::{CtState, Lookup},
    maps::kernel::PinnedFlowFilter,
    xdp::{AttachMode, XdpDatapath},
};
use xdp_support::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn desired() -> DesiredState {
    let v = Vip {
        addr: ip("10.100.0.1"),
        port: 80,
        proto: Proto::Tcp,
    };
    let s = ServiceEntry::new(
        &v,
        vec![ip("10.1.0.1"), ip("10.1.0.2")],
        vec![0, 1, 0, 1, 1, 0, 1],
    )
    .unwrap();
    DesiredState {
        services: [(v, s)].into_iter().collect(),
    }
}

#[test]
fn restart_keeps_maps_and_conntrack_and_replaces_the_program_in_place() {
    let Some((bpffs, _ns)) = bpffs_and_netns("the XDP pinning test", "pin") else {
        return;
    };
    veth_pair("pa", "pb");

    let (programmed_before, first_prog) = first_process_attaches_and_pins(&bpffs);
    let dp = second_process_reads_back_and_replaces(&bpffs, &programmed_before, first_prog);
    the_operator_cli_reads_the_pinned_maps(&bpffs);
    let dp = a_restart_keeps_the_generation_high_water_mark(&bpffs, dp);

    cli(&bpffs, &["uninstall"]);
    drop(dp); // our own link fd was the last reference
    assert_eq!(xdp_prog_id("pa"), None, "detached");
    assert!(!bpffs.path().join("ringlb").exists(), "pins removed");
}

/// The first process: applies, attaches natively to `pa`, forwards a packet,
/// exits. Returns what it programmed and the id of its program.
fn first_process_attaches_and_pins(bpffs: &BpfFs) -> (Programmed, u64) {
    let mut dp = load_pinned(bpffs.path()).unwrap();
    dp.apply(&desired()).unwrap();
    // (auto would pick generic: pb runs no XDP program; auto_mode.rs)
    assert_eq!(dp.attach("pa", AttachMode::Native).unwrap(), "native");
    let first_prog = xdp_prog_id("pa").expect("program attached");
    // the handshake: the SYN, then the ACK that inserts the conntrack entry
    let f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    let mut out = vec![0u8; 256];
    for f in [f.clone(), f.established()] {
        let (verdict, _, _) = dp.test_run(&f.bytes(), &mut out, 1).unwrap();
        assert_eq!(verdict, 3);
    }
    let programmed_before = dp.programmed().clone();
    drop(dp); // the process exits: pinned link and maps stay

    assert_eq!(
        xdp_prog_id("pa"),
        Some(first_prog),
        "still attached after the loader is gone"
    );
    for m in abi::map::ALL {
        assert!(bpffs.path().join("ringlb").join(m).exists(), "{m} pinned");
    }
    (programmed_before, first_prog)
}

/// The second process: state is read back, the link gets the new program.
fn second_process_reads_back_and_replaces(
    bpffs: &BpfFs,
    programmed_before: &Programmed,
    first_prog: u64,
) -> XdpDatapath {
    let mut dp = load_pinned(bpffs.path()).unwrap();
    let p = dp.programmed();
    assert_eq!(
        p.backends().collect::<Vec<_>>(),
        programmed_before.backends().collect::<Vec<_>>(),
        "ids and their owners read back from the rings"
    );
    assert_eq!(
        p.vips.keys().collect::<Vec<_>>(),
        programmed_before.vips.keys().collect::<Vec<_>>()
    );
    for (v, pv) in &p.vips {
        assert_eq!(
            pv.ring, programmed_before.vips[v].ring,
            "ring of {v} read back"
        );
    }
    assert_eq!(p.last_generation, programmed_before.last_generation);
    let (raw_s, family) = abi::RawAddr::from_ip(ip("192.0.2.7"));
    let flow = abi::Flow {
        saddr: raw_s,
        daddr: abi::RawAddr::from_ip(ip("10.100.0.1")).0,
        sport: abi::Be16::from_host(40000),
        dport: abi::Be16::from_host(80),
        proto: 6,
        family,
        flags: 0,
        pad: 0,
    };
    assert!(
        matches!(
            dp.lookup(&flow).unwrap(),
            Lookup::Backend {
                conntrack: CtState::Hit,
                ..
            }
        ),
        "the conntrack entry survived the restart"
    );
    // the restarted loader set every flow filter byte (the surviving entry
    // may be missing from it); the edge's rebuild over the pins, after the
    // attach, keeps exactly the live key's slot
    let (slots, set0, set1) = dp
        .with_flow_filter(|f| (f.slots(), f.count(0), f.count(1)))
        .unwrap();
    assert_eq!(
        (set0, set1),
        (slots, slots),
        "every SYN looks up until a rebuild"
    );
    assert_eq!(dp.attach("pa", AttachMode::Native).unwrap(), "replaced");
    let st = PinnedFlowFilter::open(&bpffs.path().join("ringlb"))
        .unwrap()
        .rebuild()
        .unwrap();
    assert_eq!((st.keys, st.set), (1, 1));
    assert!(
        dp.with_flow_filter(|f| f.maybe(flow_filter::flow_hash(&flow)))
            .unwrap(),
        "the surviving entry's slot"
    );
    let second_prog = xdp_prog_id("pa").expect("still attached");
    assert_ne!(second_prog, first_prog, "new program inside the same link");
    // same desired state: everything was read back, nothing is written
    assert_eq!(
        dp.apply(&desired()).unwrap(),
        Default::default(),
        "a restart re-applies nothing"
    );
    assert_eq!(
        dp.apply(&desired()).unwrap(),
        Default::default(),
        "idempotent"
    );
    dp
}

/// The operator CLI (`ringlb-edge datapath ...`) on the pinned maps in `bpffs`.
fn cli(bpffs: &BpfFs, args: &[&str]) -> String {
    let pin = bpffs.path().join("ringlb");
    let mut v = vec!["datapath", "--pin-dir", pin.to_str().unwrap()];
    v.extend_from_slice(args);
    run_cli(&v).expect("datapath CLI")
}

/// The operator CLI reads the same pinned maps.
fn the_operator_cli_reads_the_pinned_maps(bpffs: &BpfFs) {
    let dump = cli(bpffs, &["dump", "--slots"]);
    assert!(
        dump.contains("VIP 10.100.0.1:80/tcp") && dump.contains("ring 7"),
        "{dump}"
    );
    assert!(
        dump.contains("10.1.0.1") && dump.contains("10.1.0.2") && dump.contains("slots"),
        "{dump}"
    );
    let counters = cli(bpffs, &["counters"]);
    assert!(
        counters.contains("tx") && counters.contains("10.100.0.1:80/tcp"),
        "{counters}"
    );
    let lookup = |dst| cli(bpffs, &["lookup", "--src", "192.0.2.7:40000", "--dst", dst]);
    let to_vip = lookup("10.100.0.1:80");
    assert!(to_vip.contains("from the conntrack entry"), "{to_vip}");
    let elsewhere = lookup("10.100.0.9:80");
    assert!(elsewhere.contains("not a VIP"), "{elsewhere}");
    let missing = run_cli(&["datapath", "--pin-dir", "/nonexistent/ringlb", "dump"])
        .expect_err("no pinned maps there");
    let missing = missing.to_string();
    assert!(
        missing.contains("no pinned map at /nonexistent/ringlb/") && missing.contains("--pin-dir"),
        "clear error naming the path and the flag: {missing}"
    );
}

/// Removing the backend with the newest generation, then restarting, must not let
/// a new backend reuse that generation (stale conntrack entries carry it).
fn a_restart_keeps_the_generation_high_water_mark(
    bpffs: &BpfFs,
    mut dp: XdpDatapath,
) -> XdpDatapath {
    let v = *desired().services.keys().next().unwrap();
    let one = DesiredState {
        services: [(
            v,
            ServiceEntry::new(&v, vec![ip("10.1.0.1")], vec![0; 7]).unwrap(),
        )]
        .into_iter()
        .collect(),
    };
    dp.apply(&one).unwrap();
    let high_water = dp.programmed().last_generation;
    assert!(high_water >= 2, "two backends were assigned generations");
    drop(dp);
    let mut dp = load_pinned(bpffs.path()).unwrap();
    assert!(
        dp.programmed().last_generation >= high_water,
        "restart forgot the generation high-water mark: {} < {high_water}",
        dp.programmed().last_generation
    );
    dp.apply(&one).unwrap();
    dp
}

/// The interface is deleted and re-created under the same name while the
/// edge is down: the pinned link is defunct (the kernel detached it with the
/// old device). The next attach must notice, unpin it and attach afresh to the
/// new interface, instead of failing until an operator runs `uninstall`.
#[test]
fn a_defunct_pinned_link_is_replaced_by_a_fresh_attach() {
    use ringlb_xdp::batch::{if_index, pinned_link_ifindex};
    let Some((bpffs, _ns)) = bpffs_and_netns("the XDP pinning test", "defunct") else {
        return;
    };
    veth_pair("da", "db");
    let pin = bpffs.path().join("ringlb").join("link_da");

    let mut dp = load_pinned(bpffs.path()).unwrap();
    dp.apply(&desired()).unwrap();
    assert_eq!(dp.attach("da", AttachMode::Native).unwrap(), "native");
    let old_index = if_index("da");
    assert_eq!(pinned_link_ifindex(&pin).unwrap().1, old_index);
    drop(dp);

    sh(&["ip", "link", "del", "da"]);
    veth_pair("da", "db");
    let new_index = if_index("da");
    assert_ne!(new_index, old_index, "a new interface");
    assert_eq!(xdp_prog_id("da"), None, "nothing on the new interface yet");
    assert!(pin.exists(), "the old link is still pinned");
    assert_eq!(
        pinned_link_ifindex(&pin).unwrap().1,
        0,
        "the pinned link is defunct"
    );

    let mut dp = load_pinned(bpffs.path()).unwrap();
    let how = dp
        .attach("da", AttachMode::Native)
        .expect("attach over a defunct pinned link");
    assert_eq!(how, "native", "a fresh link, not an update of the dead one");
    let prog = xdp_prog_id("da").expect("the program drives the new interface");
    assert_eq!(
        pinned_link_ifindex(&pin).unwrap().1,
        new_index,
        "the pin now holds the new link"
    );
    let ours = dp.program().unwrap().info().unwrap().id();
    assert_eq!(
        prog,
        u64::from(ours),
        "the program on the interface is ours"
    );
    drop(dp);

    // and the next restart updates that link in place
    let mut dp = load_pinned(bpffs.path()).unwrap();
    assert_eq!(dp.attach("da", AttachMode::Native).unwrap(), "replaced");
    assert_ne!(
        xdp_prog_id("da"),
        Some(prog),
        "new program in the same link"
    );
    dp.uninstall().unwrap();
    assert_eq!(xdp_prog_id("da"), None, "detached");
}

/// Pinned maps of an older release with another `backends` size (131,072
/// before backend ids were per (VIP, pod)) are refused at load with an error
/// that says what to do, instead of failing later on a write past the end.
#[test]
fn pinned_maps_of_another_size_are_refused_clearly() {
    let Some((bpffs, _)) = old_pin::<abi::BackendValue>("layout", abi::map::BACKENDS, 131_072)
    else {
        return;
    };
    let e = match load_pinned(bpffs.path()) {
        Ok(_) => panic!("a backends map of 131072 entries was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("backends") && e.contains("131072") && e.contains("uninstall"),
        "{e}"
    );
}

/// A pinned flow filter of an older layout (one byte per slot: 64 + 512 KiB)
/// is replaced at load by this build's (one bit per slot), not misread: its
/// contents are derived state, and every SYN looks up until the rebuild.
#[test]
fn a_pinned_flow_filter_of_an_older_layout_is_replaced() {
    type OldFilter = [u8; abi::FLOW_FILTER_HEADER + (2 << 18)];
    let Some((bpffs, dir)) = old_pin::<OldFilter>("ffold", abi::map::FLOW_FILTER, 1) else {
        return;
    };
    let dp = load_pinned(bpffs.path()).expect("load over the old pin");
    let pinned = aya::maps::MapData::from_pin(dir.join(abi::map::FLOW_FILTER)).unwrap();
    assert_eq!(
        pinned.info().unwrap().value_size() as usize,
        abi::FLOW_FILTER_VALUE_SIZE
    );
    let (bits, set0, set1) = dp
        .with_flow_filter(|f| (f.bits(), f.count(0), f.count(1)))
        .unwrap();
    assert_eq!(bits, abi::FLOW_FILTER_BITS);
    assert_eq!(
        (set0, set1),
        (1 << bits, 1 << bits),
        "all \"maybe\" until a rebuild"
    );
}

/// An older build's pinned `stats` has fewer counters (this one's last
/// counter would find no slot): it is replaced, like the flow filter. (The
/// stand-in is a plain array of the old length; the loader looks at the
/// length only.)
#[test]
fn a_pinned_stats_map_with_fewer_counters_is_replaced() {
    let Some((bpffs, dir)) = old_pin::<u64>("statsold", abi::map::STATS, abi::STAT_MAX - 1) else {
        return;
    };
    let dp = load_pinned(bpffs.path()).expect("load over the old pin");
    let pinned = aya::maps::MapData::from_pin(dir.join(abi::map::STATS)).unwrap();
    assert_eq!(pinned.info().unwrap().max_entries(), abi::STAT_MAX);
    let counters = dp.read_counters().unwrap();
    assert!(
        counters.global.iter().any(|(l, _)| *l == "ct_over_budget"),
        "the newest counter is read"
    );
}

/// A draining pod (still a backend, no ring slot: it only keeps its
/// established flows) keeps its id across a restart, and when it finally
/// leaves, its flows turn stale and go to the ring's choice. The id's owner
/// comes from the loader's pinned `owners` map: no ring names it.
#[test]
fn a_draining_pod_keeps_its_flows_across_a_restart_until_it_leaves() {
    let Some(bpffs) = private_bpffs("the XDP pinning test (bpffs mount, BPF)", "drain") else {
        return;
    };
    let v = Vip {
        addr: ip("10.100.0.1"),
        port: 80,
        proto: Proto::Tcp,
    };
    let (p, q) = (ip("10.1.0.1"), ip("10.1.0.2"));
    let entry = |backends: Vec<IpAddr>, target: u32| DesiredState {
        services: [(v, ServiceEntry::new(&v, backends, vec![target; 7]).unwrap())]
            .into_iter()
            .collect(),
    };
    // ACKs: a SYN never follows a conntrack entry
    let f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80).established();
    let flow = ringlb_xdp::cli::flow(
        Proto::Tcp,
        "192.0.2.7:40000".parse().unwrap(),
        "10.100.0.1:80".parse().unwrap(),
    );
    let outer_dst = |dp: &XdpDatapath| {
        let mut out = vec![0u8; 256];
        let (verdict, _, _) = dp.test_run(&f.bytes(), &mut out, 1).unwrap();
        assert_eq!(verdict, 3);
        IpAddr::from(<[u8; 4]>::try_from(&out[14 + 16..14 + 20]).unwrap())
    };

    let mut dp = load_pinned(bpffs.path()).unwrap();
    dp.apply(&entry(vec![p, q], 0)).unwrap();
    assert_eq!(outer_dst(&dp), p);
    let draining = entry(vec![p, q], 1); // P drains: no slot, still a backend
    dp.apply(&draining).unwrap();
    assert_eq!(outer_dst(&dp), p, "established flow stays on P");
    let p_id = dp.programmed().backend(&v, p).unwrap().id;
    drop(dp);

    let mut dp = load_pinned(bpffs.path()).unwrap();
    assert_eq!(
        dp.programmed().backend(&v, p).map(|b| b.id),
        Some(p_id),
        "P's id read back, though no ring names it"
    );
    assert_eq!(
        dp.apply(&draining).unwrap(),
        Default::default(),
        "nothing to rewrite"
    );
    assert!(matches!(
        dp.lookup(&flow).unwrap(),
        Lookup::Backend { addr, conntrack: CtState::Hit, .. } if addr == p
    ));
    assert_eq!(outer_dst(&dp), p);
    // P leaves: its id is deleted, the flow is rebalanced to Q
    let st = dp.apply(&entry(vec![q], 0)).unwrap();
    assert_eq!(st.backends_deleted, 1, "{st:?}");
    assert!(matches!(
        dp.lookup(&flow).unwrap(),
        Lookup::Backend { addr, conntrack: CtState::Stale { .. }, .. } if addr == q
    ));
    assert_eq!(outer_dst(&dp), q);
    dp.uninstall().unwrap();
    assert!(
        !bpffs.path().join("ringlb").exists(),
        "owners pin removed too"
    );
}

/// The `datapath` subcommand as `ringlb-edge` parses and runs it; its output.
fn run_cli(args: &[&str]) -> Result<String, ringlb_xdp::Error> {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Sub,
    }
    #[derive(clap::Subcommand)]
    enum Sub {
        Datapath(ringlb_xdp::cli::DatapathArgs),
    }
    use clap::Parser;
    let Sub::Datapath(dp) =
        Cli::try_parse_from(std::iter::once("ringlb-edge").chain(args.iter().copied()))
            .expect("arguments parse")
            .command;
    let mut out = Vec::new();
    ringlb_xdp::cli::run(&dp, &mut out)?;
    Ok(String::from_utf8(out).expect("utf-8"))
}

/// A private bpffs whose `ringlb/<name>` is an ARRAY of `entries` values of
/// `V`, pinned as an older release left it; the bpffs and that directory.
/// `None`, skipped loudly, without root.
fn old_pin<V: aya::Pod>(
    tag: &str,
    name: &str,
    entries: u32,
) -> Option<(BpfFs, std::path::PathBuf)> {
    use aya::maps::{Array, IterableMap, MapData};
    let bpffs = private_bpffs("the XDP pinning test (bpffs mount, BPF)", tag)?;
    let dir = bpffs.path().join("ringlb");
    std::fs::create_dir_all(&dir).unwrap();
    let old = Array::<MapData, V>::create(entries, 0).unwrap();
    old.map().pin(dir.join(name)).unwrap();
    Some((bpffs, dir))
}
