//! The loader's life cycle in a network namespace: attach to an uplink
//! (pinned tcx links), restart with the pinned maps (flows and services
//! survive, the program is swapped inside the pinned links), uninstall
//! (no program attached, no pin left). Needs root; skips loudly otherwise.

mod support;
use support::*;

use ringlb_node::{Hook, NodeDatapath, NodeOptions, Proto};
use ringlb_testkit::{
    netns::{BpfFs, Netns, in_netns, nsx, sh},
    packet::{Segment, TCP_SYN, eth, ipip},
};

/// Names of the programs in tcx links (type 11), machine-wide: bpftool 7.1
/// neither shows tcx under `net show` nor a link's ifindex. Only this test
/// attaches tcx links in this crate.
fn tcx_progs() -> String {
    let links = sh(&["bpftool", "link", "show"]);
    let mut names = Vec::new();
    for l in links
        .lines()
        .filter(|l| l.contains("type 11") || l.contains("type tcx"))
    {
        let Some(id) = l.split("prog ").nth(1).map(|r| r.trim().to_string()) else {
            continue;
        };
        let p = sh(&["bpftool", "prog", "show", "id", &id]);
        names.extend(
            p.split_whitespace()
                .skip_while(|w| *w != "name")
                .nth(1)
                .map(String::from),
        );
    }
    names.join(" ")
}

#[test]
fn attach_restart_and_uninstall_leave_nothing_behind() {
    if !is_root() {
        eprintln!("SKIP: node lifecycle needs root (CI runs as root)");
        return;
    }
    let ns = Netns::new(&format!("rlbn-life-{}", std::process::id()));
    nsx(
        &ns.0,
        &[
            "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1",
        ],
    );
    nsx(&ns.0, &["ip", "link", "set", "up0", "up"]);
    nsx(&ns.0, &["ip", "link", "set", "up1", "up"]);
    let fs = BpfFs::new("node-life");
    let dir = fs.path().join("ringlb-node");
    let opts = NodeOptions {
        pin_dir: Some(dir.clone()),
        ..NodeOptions::default()
    };

    let mut dp = NodeDatapath::load(&opts).unwrap();
    dp.apply(&services()).unwrap();
    in_netns(&ns.0, || dp.attach_uplink("up0")).unwrap();
    for hook in Hook::BOTH {
        assert!(dir.join(format!("link_up0_{}", hook.label())).exists());
    }
    let shown = tcx_progs();
    assert!(shown.contains("ringlb_node_ingress"), "{shown}");
    assert!(shown.contains("ringlb_node_egress"), "{shown}");
    // a flow, written by the program itself
    let syn = Segment::tcp(sa(CLIENT4), sa("10.100.0.1:80"), TCP_SYN);
    run(
        &dp,
        Hook::Ingress,
        &eth(&ipip(ip(EDGE4), ip(POD4), &syn.l3())),
    );
    drop(dp); // the agent exits: pinned links keep the programs attached
    let shown = tcx_progs();
    assert!(
        shown.contains("ringlb_node_ingress"),
        "still attached: {shown}"
    );

    // restart: same maps, same links
    let mut dp = NodeDatapath::load(&opts).unwrap();
    assert_eq!(dp.programmed(), &services(), "services read back");
    assert_eq!(
        dp.flow(sa(CLIENT4), sa("10.2.0.5:8080"), Proto::Tcp)
            .unwrap(),
        Some(sa("10.100.0.1:80")),
        "flows survive a restart"
    );
    in_netns(&ns.0, || dp.attach_uplink("up0")).unwrap();
    let shown = tcx_progs();
    assert_eq!(
        shown.matches("ringlb_node_ingress").count(),
        1,
        "replaced, not stacked: {shown}"
    );

    dp.uninstall().unwrap();
    assert!(!dir.exists(), "pin dir removed");
    let shown = tcx_progs();
    assert!(!shown.contains("ringlb_node"), "detached: {shown}");
}
