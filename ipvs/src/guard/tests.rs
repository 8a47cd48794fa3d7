//! The guard over nftables in memory: when it writes, what its counters add up
//! to across rewrites, and how it recovers a table someone else removed.

use std::net::IpAddr;

use super::nft::MemoryNft;
use super::ruleset::{DROP_NO_SERVICE, removal};
use super::*;
use crate::model::Proto;

fn key(port: u16) -> ServiceKey {
    ServiceKey {
        addr: "10.100.0.1".parse::<IpAddr>().unwrap(),
        port,
        proto: Proto::Tcp,
    }
}

fn ranges(net: &str) -> BTreeSet<SourceRange> {
    let (a, p) = net.split_once('/').unwrap();
    [SourceRange::new(a.parse().unwrap(), p.parse().unwrap()).unwrap()].into()
}

fn guard() -> (Guard, MemoryNft) {
    let nft = MemoryNft::default();
    (Guard::new(Box::new(nft.clone())), nft)
}

fn global(c: &GuardCounters, label: &str) -> u64 {
    c.global.iter().find(|(l, _)| *l == label).unwrap().1
}

#[test]
fn writes_only_what_changed() {
    let (mut g, nft) = guard();
    g.admit(key(80), true, None);
    assert!(g.sync().unwrap(), "first sync writes");
    assert!(!g.sync().unwrap(), "unchanged: nothing written");
    g.admit(key(443), true, Some(&ranges("192.0.2.0/24")));
    assert!(g.sync().unwrap());
    let s = nft.state();
    assert_eq!(s.applied.len(), 2);
    let table = s.table.as_deref().unwrap();
    assert!(
        table.contains("10.100.0.1 . tcp . 443 : jump src_10.100.0.1_tcp_443")
            && table.contains("ip saddr { 192.0.2.0/24 } accept"),
        "{table}"
    );
    assert_eq!(g.held().unwrap().script, table);
}

/// The kernel's counters start at 0 with every rewrite; the guard's totals go on.
/// A VIP:port that goes away leaves its refusals in `drop_source_range`.
#[test]
fn counters_stay_monotonic_across_rewrites() {
    let (mut g, nft) = guard();
    g.admit(key(80), true, None);
    g.admit(key(443), true, Some(&ranges("192.0.2.0/24")));
    g.sync().unwrap();
    {
        let mut s = nft.state();
        s.counters.insert(DROP_NO_SERVICE.into(), 5);
        s.counters.insert("src_10.100.0.1_tcp_443".into(), 3);
    }
    let c = g.counters().unwrap();
    assert_eq!(global(&c, DROP_NO_SERVICE), 5);
    assert_eq!(global(&c, DROP_SOURCE_RANGE), 3);
    assert_eq!(c.per_service, [(key(443), 3)]);

    // narrowed: a new table, its counters at 0 in the kernel
    g.admit(key(443), true, Some(&ranges("192.0.2.0/25")));
    g.sync().unwrap();
    assert_eq!(nft.state().counters[DROP_NO_SERVICE], 0);
    nft.state().counters.insert(DROP_NO_SERVICE.into(), 2);
    nft.state()
        .counters
        .insert("src_10.100.0.1_tcp_443".into(), 1);
    let c = g.counters().unwrap();
    assert_eq!(global(&c, DROP_NO_SERVICE), 7);
    assert_eq!(c.per_service, [(key(443), 4)]);

    // the restricted port goes: its 4 stay in the global count only
    g.admit(key(443), false, None);
    g.sync().unwrap();
    let c = g.counters().unwrap();
    assert_eq!(global(&c, DROP_SOURCE_RANGE), 4);
    assert!(c.per_service.is_empty());
    assert_eq!(
        c.global.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        [
            "drop_no_service",
            "drop_vip_icmp",
            "drop_vip_other",
            "drop_source_range"
        ]
    );
}

/// `nft flush ruleset` by someone else: the next counter read or sync writes the
/// table again.
#[test]
fn a_table_removed_behind_its_back_is_written_again() {
    let (mut g, nft) = guard();
    g.admit(key(443), true, Some(&ranges("192.0.2.0/24")));
    g.sync().unwrap();
    nft.state().table = None;
    let c = g.counters().unwrap();
    assert_eq!(c.per_service, [(key(443), 0)]);
    assert!(nft.state().table.is_some(), "written again by the read");
    nft.state().table = None;
    assert!(g.sync().unwrap(), "written again by a sync");
    assert_eq!(nft.state().applied.len(), 3);
}

/// A refused script leaves the table unknown: the next sync writes it although
/// the state did not change.
#[test]
fn a_failed_write_is_retried_by_the_next_sync() {
    let (mut g, nft) = guard();
    g.admit(key(80), true, None);
    nft.state().fail_apply = true;
    let e = g.sync().unwrap_err();
    assert_eq!(e.metric_label(), "guard");
    assert!(e.to_string().contains("inet ringlb_guard"), "{e}");
    assert!(g.held().is_none());
    nft.state().fail_apply = false;
    assert!(g.sync().unwrap());
    nft.state().fail_read = true;
    assert!(g.sync().is_err(), "a failed read fails the sync too");
    assert!(g.counters().is_err());
}

/// Nothing served: the table is removed if it is there, and nothing is written
/// if it is not.
#[test]
fn nothing_served_is_no_table() {
    let (mut g, nft) = guard();
    assert!(!g.sync().unwrap(), "no table, none wanted");
    assert!(nft.state().applied.is_empty());
    g.admit(key(80), true, None);
    g.sync().unwrap();
    g.admit_all(Admitted::new());
    assert!(g.sync().unwrap());
    let s = nft.state();
    assert_eq!(s.applied.last().unwrap(), &removal());
    assert!(s.table.is_none());
}
