//! Loader life cycle against the real kernel: attach natively to a veth,
//! "restart" (drop the loader, load again from the pinned maps), replace the
//! program inside the pinned link, keep conntrack, then uninstall. Needs root;
//! skips loudly otherwise. Uses its own netns and a private bpffs mount.

mod xdp_support;

use std::net::IpAddr;

use ringlb_edge::datapath::{
    Datapath, DesiredState, Proto, ServiceEntry, Vip, abi,
    nexthop::{NextHop, StaticResolver},
    packet::Frame,
    xdp::{AttachMode, XdpDatapath, XdpOptions, objects},
};
use xdp_support::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn opts(pin: &std::path::Path) -> XdpOptions {
    XdpOptions {
        pin_dir: Some(pin.join("ringlb")),
        src4: Some("10.0.0.11".parse().unwrap()),
        src6: None,
        mtu: 1500,
        fib_fallback: false,
        object: objects::XDP_LB,
    }
}

fn resolver() -> Box<StaticResolver> {
    Box::new(StaticResolver {
        default: Some(NextHop {
            ifindex: 0,
            smac: [2, 0, 0, 0, 0, 1],
            dmac: [2, 0, 0, 0, 0, 2],
        }),
        ..Default::default()
    })
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
    if !is_root() {
        eprintln!("SKIP: the XDP pinning test needs root (bpffs mount, netns, BPF)");
        return;
    }
    let bpffs = BpfFs::new("pin");
    let ns = Netns::new(&format!("rlbpin-{}", std::process::id()));
    enter_netns(&ns.0);
    sh(&[
        "ip", "link", "add", "pa", "type", "veth", "peer", "name", "pb",
    ]);
    sh(&["ip", "link", "set", "pa", "up"]);
    sh(&["ip", "link", "set", "pb", "up"]);

    // first process
    let mut dp = XdpDatapath::load(&opts(bpffs.path()), resolver()).unwrap();
    dp.apply(&desired()).unwrap();
    assert_eq!(dp.attach("pa", AttachMode::Auto).unwrap(), "native");
    let first_prog = xdp_prog_id("pa").expect("program attached");
    let f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    let mut out = vec![0u8; 256];
    let (verdict, _, _) = dp.test_run(&f.bytes(), &mut out, 1).unwrap();
    assert_eq!(verdict, 3);
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

    // second process: state is read back, the link gets the new program
    let mut dp = XdpDatapath::load(&opts(bpffs.path()), resolver()).unwrap();
    let p = dp.programmed();
    assert_eq!(
        p.backends,
        programmed_before
            .backends
            .iter()
            .map(|(a, b)| (
                *a,
                ringlb_edge::datapath::state::ProgrammedBackend { refs: 0, ..*b }
            ))
            .collect()
    );
    assert_eq!(
        p.vips.keys().collect::<Vec<_>>(),
        programmed_before.vips.keys().collect::<Vec<_>>()
    );
    let (raw_s, family) = abi::RawAddr::from_ip(ip("192.0.2.7"));
    let flow = abi::Flow {
        saddr: raw_s,
        daddr: abi::RawAddr::from_ip(ip("10.100.0.1")).0,
        sport: abi::Be16::from_host(40000),
        dport: abi::Be16::from_host(80),
        proto: 6,
        family,
        pad: [0; 2],
    };
    let (_, from_ct) = dp.lookup(&flow).unwrap().expect("flow known");
    assert!(from_ct, "the conntrack entry survived the restart");
    assert_eq!(dp.attach("pa", AttachMode::Auto).unwrap(), "replaced");
    let second_prog = xdp_prog_id("pa").expect("still attached");
    assert_ne!(second_prog, first_prog, "new program inside the same link");
    // same desired state: the rings are rewritten (not read back), nothing else
    let st = dp.apply(&desired()).unwrap();
    assert_eq!(
        (st.backends_written, st.vips_written, st.rings_created),
        (0, 0, 0),
        "{st:?}"
    );
    assert_eq!(st.slots_written, 7);
    assert_eq!(
        dp.apply(&desired()).unwrap(),
        Default::default(),
        "idempotent"
    );

    // the operator CLI reads the same pinned maps
    let cli = |args: &[&str]| {
        let pin = bpffs.path().join("ringlb");
        let mut v = vec![
            env!("CARGO_BIN_EXE_ringlb-edge"),
            "datapath",
            "--pin-dir",
            pin.to_str().unwrap(),
        ];
        v.extend_from_slice(args);
        sh(&v)
    };
    let dump = cli(&["dump", "--slots"]);
    assert!(
        dump.contains("VIP 10.100.0.1:80/tcp") && dump.contains("ring 7"),
        "{dump}"
    );
    assert!(
        dump.contains("10.1.0.1") && dump.contains("10.1.0.2") && dump.contains("slots"),
        "{dump}"
    );
    let counters = cli(&["counters"]);
    assert!(
        counters.contains("tx") && counters.contains("10.100.0.1:80/tcp"),
        "{counters}"
    );
    let lookup = cli(&[
        "lookup",
        "--src",
        "192.0.2.7:40000",
        "--dst",
        "10.100.0.1:80",
    ]);
    assert!(lookup.contains("(conntrack entry)"), "{lookup}");
    let lookup = cli(&[
        "lookup",
        "--src",
        "192.0.2.7:40000",
        "--dst",
        "10.100.0.9:80",
    ]);
    assert!(lookup.contains("not a VIP"), "{lookup}");
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_ringlb-edge"))
        .args(["datapath", "--pin-dir", "/nonexistent/ringlb", "dump"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("not pinned"),
        "clear error"
    );

    // Removing the backend with the newest generation, then restarting, must not let
    // a new backend reuse that generation (stale conntrack entries carry it).
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
    let mut dp = XdpDatapath::load(&opts(bpffs.path()), resolver()).unwrap();
    assert!(
        dp.programmed().last_generation >= high_water,
        "restart forgot the generation high-water mark: {} < {high_water}",
        dp.programmed().last_generation
    );
    dp.apply(&one).unwrap();

    cli(&["uninstall"]);
    drop(dp); // our own link fd was the last reference
    assert_eq!(xdp_prog_id("pa"), None, "detached");
    assert!(!bpffs.path().join("ringlb").exists(), "pins removed");
}
