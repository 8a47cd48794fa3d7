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

/// The program id in every BPF link on the machine (`prog N` of `bpftool link show`).
/// Other tests attach node programs at the same time, so the assertions below only
/// look for the ids of this test's own programs.
fn linked_progs() -> Vec<String> {
    sh(&["bpftool", "link", "show"])
        .lines()
        .filter_map(|l| l.split("prog ").nth(1))
        .filter_map(|r| r.split_whitespace().next())
        .map(String::from)
        .collect()
}

/// What `bpftool <kind> show pinned <path>` says of a pinned link or map.
fn bpftool_show_pinned(kind: &str, path: &std::path::Path) -> String {
    sh(&[
        "bpftool",
        kind,
        "show",
        "pinned",
        &path.display().to_string(),
    ])
}

/// The program id of the pinned link `path`, and that program's name.
fn pinned_prog(path: &std::path::Path) -> (String, String) {
    let link = bpftool_show_pinned("link", path);
    let id = link
        .split("prog ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no prog in {link}"))
        .to_string();
    let prog = sh(&["bpftool", "prog", "show", "id", &id]);
    let name = prog
        .split_whitespace()
        .skip_while(|w| *w != "name")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (id, name)
}

/// (program id, name) behind each of the uplink's two pinned links.
fn pinned_progs(dir: &std::path::Path) -> Vec<(String, String)> {
    Hook::BOTH
        .iter()
        .map(|hook| pinned_prog(&dir.join(format!("link_up0_{}", hook.label()))))
        .collect()
}

#[test]
fn attach_restart_and_uninstall_leave_nothing_behind() {
    if !require_root("node lifecycle (bpffs, netns, BPF)") {
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
    let first = pinned_progs(&dir);
    let names: Vec<&str> = first.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["ringlb_node_ingress", "ringlb_node_egress"]);
    // a flow, written by the program itself
    let syn = Segment::tcp(sa(CLIENT4), sa("10.100.0.1:80"), TCP_SYN);
    run(
        &dp,
        Hook::Ingress,
        &eth(&ipip(ip(EDGE4), ip(POD4), &syn.l3())),
    );
    drop(dp); // the agent exits: pinned links keep the programs attached
    let linked = linked_progs();
    for (id, name) in &first {
        assert!(
            linked.contains(id),
            "{name} (prog {id}) still attached: {linked:?}"
        );
    }

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
    let second = pinned_progs(&dir);
    let linked = linked_progs();
    for ((old, name), (new, _)) in first.iter().zip(&second) {
        assert_ne!(old, new, "{name}: a new program in the pinned link");
        assert!(
            !linked.contains(old),
            "{name}: the old program is replaced, not stacked: {linked:?}"
        );
        assert_eq!(
            linked.iter().filter(|l| *l == new).count(),
            1,
            "{name}: one link"
        );
    }

    dp.uninstall().unwrap();
    assert!(!dir.exists(), "pin dir removed");
    let linked = linked_progs();
    for (id, name) in first.iter().chain(&second) {
        assert!(
            !linked.contains(id),
            "{name} (prog {id}) detached: {linked:?}"
        );
    }
}

/// An upgrade that added a counter: the pinned `node_stats` of the older build
/// (one counter fewer) is replaced, the other pinned maps are kept, and the new
/// counter counts.
#[test]
fn a_pinned_counter_map_of_an_older_build_is_replaced() {
    if !require_root("node lifecycle (bpffs, netns, BPF)") {
        return;
    }
    let fs = BpfFs::new("node-stats-upgrade");
    let dir = fs.path().join("ringlb-node");
    std::fs::create_dir_all(&dir).unwrap();
    let stats = dir.join("node_stats");
    let older = (ringlb_node::abi::STAT_MAX - 1).to_string();
    sh(&[
        "bpftool",
        "map",
        "create",
        &stats.display().to_string(),
        "type",
        "percpu_array",
        "key",
        "4",
        "value",
        "8",
        "entries",
        &older,
        "name",
        "node_stats",
    ]);
    let opts = NodeOptions {
        pin_dir: Some(dir.clone()),
        ..NodeOptions::default()
    };
    let dp = NodeDatapath::load(&opts).expect("loads over the older counter map");
    assert_eq!(
        dp.counters().unwrap().len(),
        ringlb_node::abi::Stat::ALL.len()
    );
    let shown = bpftool_show_pinned("map", &stats);
    assert!(
        shown.contains(&format!("max_entries {}", ringlb_node::abi::STAT_MAX)),
        "the pinned map is the new one: {shown}"
    );
    dp.uninstall().unwrap();
}
