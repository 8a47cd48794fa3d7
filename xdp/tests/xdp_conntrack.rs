//! Conntrack in the XDP program, by BPF_PROG_TEST_RUN with exact output
//! frames: conntrack is looked up before the VIP (so a retired (VIP, pod) id
//! must turn its entries stale), a SYN neither follows nor inserts an entry
//! (the flow's next packet inserts), a SYN whose flow filter slot is clear
//! does not even look up, a hit counts for the VIP that owns the id, and
//! established flows keep their backend while it exists.
//! Needs root (BPF); skips loudly otherwise.

mod xdp_support;
use xdp_support::fixture::*;

use ringlb_testkit::packet::Frame;
use ringlb_xdp::{
    Datapath, Proto, ServiceEntry, Vip, flow_filter,
    xdp::{XdpDatapath, XdpOptions},
};

/// The production object with VIP4 over 10.1.0.1 and 10.1.0.2, its whole ring
/// on .1; `None` (after a loud SKIP) without root.
fn two_pods() -> Option<(XdpDatapath, Vip)> {
    let mut dp = load(1500, true)?;
    let v = vip4();
    dp.apply(&state(vec![(v, svc(&v, &["10.1.0.1", "10.1.0.2"], 0))]))
        .unwrap();
    Some((dp, v))
}

/// Conntrack is looked up before the VIP, so a deleted VIP must not live on
/// in its conntrack entries: deleting it retires its (VIP, pod) backend ids,
/// also when the pod still backs another VIP.
#[test]
fn a_deleted_vip_stops_forwarding_its_established_flows() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    // B on A's address (another port): the address stays a VIP address, so
    // A's packets still reach conntrack (vip_filter passes them)
    let (a, b) = (
        vip("10.100.0.1", 80, Proto::Tcp),
        vip("10.100.0.1", 443, Proto::Tcp),
    );
    dp.apply(&state(vec![
        (a, svc(&a, &["10.1.0.1"], 0)),
        (b, svc(&b, &["10.1.0.1"], 0)),
    ]))
    .unwrap();
    let to_a = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    let to_b = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 443);
    let (to_a, to_b) = (establish(&dp, &to_a), establish(&dp, &to_b));
    assert_eq!(run(&dp, &to_a.bytes()).0, XDP_TX);
    assert_eq!(counter(&dp, "ct_hit"), 1);

    dp.apply(&state(vec![(b, svc(&b, &["10.1.0.1"], 0))]))
        .unwrap();
    let (verdict, out) = run(&dp, &to_a.bytes());
    assert_eq!(
        verdict, XDP_DROP,
        "A is gone: its flow is not forwarded, and not passed (the address is still B's)"
    );
    assert_eq!(out, to_a.bytes(), "dropped untouched");
    assert_eq!(counter(&dp, "ct_stale"), 1);
    assert_eq!(counter(&dp, "drop_no_service"), 1);
    // the stale entry was deleted: the next packet is simply for no Service
    assert_eq!(run(&dp, &to_a.bytes()).0, XDP_DROP);
    assert_eq!(counter(&dp, "ct_stale"), 1, "entry removed");
    assert_eq!(counter(&dp, "drop_no_service"), 2);
    assert_eq!(counter(&dp, "pass_not_vip"), 0);
    assert_eq!(
        run(&dp, &to_b.bytes()).1,
        encapped(&to_b, "10.0.0.11", "10.1.0.1", 0),
        "B's flow to the same pod is untouched"
    );
    assert_eq!(counter(&dp, "ct_hit"), 2);
}

/// A SYN opens a connection, so it follows the ring and inserts nothing (a
/// SYN flood evicts no entry); the flow's next packet inserts, and any later
/// packet, SYN|ACK included, follows conntrack. A SYN on a 5-tuple whose old
/// entry names another backend rewrites it. A TCP header cut before the flags
/// byte is not taken for a SYN.
#[test]
fn a_syn_follows_the_ring_and_inserts_nothing() {
    let Some((mut dp, v)) = two_pods() else {
        return;
    };
    let syn = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    let ack = syn.clone().established();
    let synack = Frame {
        tcp_flags: 0x12,
        ..syn.clone()
    };
    for _ in 0..3 {
        assert_eq!(
            run(&dp, &syn.bytes()).1,
            encapped(&syn, "10.0.0.11", "10.1.0.1", 0)
        );
    }
    // no entry: the flow filter answers, without a lookup (a kernel without
    // atomic OR runs the build without the filter: every SYN looks up)
    let filtered = if dp.flow_filter() { 3 } else { 0 };
    assert_eq!(counter(&dp, "ct_syn_filtered"), filtered);
    assert_eq!(counter(&dp, "ct_syn_ring"), 3 - filtered);
    assert_eq!(counter(&dp, "ct_miss"), 0, "no SYN inserted");
    assert_eq!(ct_entries(&dp), 0);
    // the handshake's ACK inserts
    assert_eq!(
        run(&dp, &ack.bytes()).1,
        encapped(&ack, "10.0.0.11", "10.1.0.1", 0)
    );
    assert_eq!(counter(&dp, "ct_miss"), 1);
    assert_eq!(ct_entries(&dp), 1);
    // the ring moves the flow's hash to .2; .1 still exists
    dp.apply(&state(vec![(v, svc(&v, &["10.1.0.1", "10.1.0.2"], 1))]))
        .unwrap();
    let (hit0, miss0) = (counter(&dp, "ct_hit"), counter(&dp, "ct_miss"));
    assert_eq!(
        run(&dp, &ack.bytes()).1,
        encapped(&ack, "10.0.0.11", "10.1.0.1", 0)
    );
    assert_eq!(
        run(&dp, &synack.bytes()).1,
        encapped(&synack, "10.0.0.11", "10.1.0.1", 0)
    );
    assert_eq!(
        counter(&dp, "ct_hit"),
        hit0 + 2,
        "ACK and SYN|ACK follow conntrack"
    );

    // a TCP header that ends before its flags byte (inside the IP length):
    // not a SYN, so it follows conntrack too
    let mut cut = syn.bytes();
    let tcp = 14 + 20;
    cut.truncate(tcp + 12);
    cut[16..18].copy_from_slice(&(20u16 + 12).to_be_bytes()); // IPv4 total length
    cut[24..26].copy_from_slice(&[0, 0]);
    let sum = cut[14..34]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    cut[24..26].copy_from_slice(&(!((sum & 0xffff) + (sum >> 16)) as u16).to_be_bytes());
    assert_eq!(run(&dp, &cut).0, XDP_TX);
    assert_eq!(
        counter(&dp, "ct_hit"),
        hit0 + 3,
        "a cut header is not a SYN"
    );

    // a new SYN on the same 5-tuple: the ring decides (.2) and rewrites the
    // entry in place, so the new connection's ACK follows its SYN
    assert_eq!(
        run(&dp, &syn.bytes()).1,
        encapped(&syn, "10.0.0.11", "10.1.0.2", 0)
    );
    assert_eq!(counter(&dp, "ct_syn_rewrite"), 1);
    assert_eq!(counter(&dp, "ct_miss"), miss0, "nothing inserted");
    assert_eq!(counter(&dp, "ct_hit"), hit0 + 3, "the SYN did not use it");
    assert_eq!(
        run(&dp, &ack.bytes()).1,
        encapped(&ack, "10.0.0.11", "10.1.0.2", 0)
    );
    assert_eq!(counter(&dp, "ct_hit"), hit0 + 4, "the new entry");
}

/// A conntrack hit skips the vips lookup and counts the packet for the VIP
/// that owns the backend id now: after a ring-size change (a new ring, a new
/// vip_id) an established flow counts for its VIP, not for the old vip_id,
/// which another VIP may have taken.
#[test]
fn established_flows_count_for_their_vip_after_a_ring_size_change() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let (a, b) = (vip4(), vip("10.100.0.2", 80, Proto::Tcp));
    let ring = |v: &Vip, m: usize| ServiceEntry::new(v, vec![ip("10.1.0.1")], vec![0; m]).unwrap();
    dp.apply(&state(vec![(a, ring(&a, 13))])).unwrap();
    let old_id = dp.programmed().vips[&a].vip_id;
    let f = establish(
        &dp,
        &Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80),
    );
    // A gets a ring of another size (a new vip_id); B is created and takes
    // A's old vip_id
    dp.apply(&state(vec![(a, ring(&a, 17))])).unwrap();
    dp.apply(&state(vec![(a, ring(&a, 17)), (b, ring(&b, 13))]))
        .unwrap();
    assert_ne!(dp.programmed().vips[&a].vip_id, old_id);
    assert_eq!(dp.programmed().vips[&b].vip_id, old_id, "B reuses the id");
    for _ in 0..3 {
        assert_eq!(
            run(&dp, &f.bytes()).1,
            encapped(&f, "10.0.0.11", "10.1.0.1", 0)
        );
    }
    assert_eq!(counter(&dp, "ct_hit"), 3, "the flow kept its backend");
    let c = dp.read_counters().unwrap();
    let packets = |v: Vip| {
        c.per_vip
            .iter()
            .find(|(x, _, _)| *x == v)
            .map_or(0, |e| e.1)
    };
    assert_eq!(packets(a), 3, "counted for A (the new ring's counters)");
    assert_eq!(packets(b), 0, "not for B, which has A's old vip_id");
}

#[test]
fn conntrack_keeps_flows_on_their_backend_while_it_exists() {
    let Some((mut dp, v)) = two_pods() else {
        return;
    };
    let old = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    let new = Frame::tcp(ip("192.0.2.8"), ip("10.100.0.1"), 40000, 80);
    // the handshake's ACK inserts; later packets are ACKs
    let old = establish(&dp, &old);
    assert_eq!(
        run(&dp, &old.bytes()).1,
        encapped(&old, "10.0.0.11", "10.1.0.1", 0)
    );
    // the ring now sends everything to .2, but .1 still exists
    dp.apply(&state(vec![(v, svc(&v, &["10.1.0.1", "10.1.0.2"], 1))]))
        .unwrap();
    let (verdict, out) = run(&dp, &old.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(
        out,
        encapped(&old, "10.0.0.11", "10.1.0.1", 0),
        "established flow stays"
    );
    assert_eq!(
        run(&dp, &new.bytes()).1,
        encapped(&new, "10.0.0.11", "10.1.0.2", 0)
    );
    assert_eq!(counter(&dp, "ct_hit"), 2);
    // .1 is removed: its flows move to the ring's choice
    dp.apply(&state(vec![(v, svc(&v, &["10.1.0.2"], 0))]))
        .unwrap();
    assert_eq!(
        run(&dp, &old.bytes()).1,
        encapped(&old, "10.0.0.11", "10.1.0.2", 0)
    );
    assert_eq!(counter(&dp, "ct_stale"), 1);
    // a new pod inherits .1's id (new generation); the flow stays on .2
    dp.apply(&state(vec![(v, svc(&v, &["10.1.0.2", "10.1.0.3"], 0))]))
        .unwrap();
    let id3 = dp.programmed().backend(&v, ip("10.1.0.3")).unwrap().id;
    assert_eq!(id3, 1, "id of the removed backend is reused");
    assert_eq!(
        run(&dp, &old.bytes()).1,
        encapped(&old, "10.0.0.11", "10.1.0.2", 0)
    );
}

#[test]
fn stale_conntrack_never_follows_a_reused_backend_id() {
    let Some((mut dp, v)) = two_pods() else {
        return;
    };
    let f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    let f = establish(&dp, &f);
    assert_eq!(
        run(&dp, &f.bytes()).1,
        encapped(&f, "10.0.0.11", "10.1.0.1", 0)
    );
    // remove .1 (its id is freed; nothing re-inserts the flow meanwhile) ...
    dp.apply(&state(vec![(v, svc(&v, &["10.1.0.2"], 0))]))
        .unwrap();
    // ... and hand the id to .9 with the ring pointing at .2
    dp.apply(&state(vec![(v, svc(&v, &["10.1.0.2", "10.1.0.9"], 0))]))
        .unwrap();
    assert_eq!(dp.programmed().backend(&v, ip("10.1.0.9")).unwrap().id, 1);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(
        out,
        encapped(&f, "10.0.0.11", "10.1.0.2", 0),
        "not to the id's new owner"
    );
    assert_eq!(counter(&dp, "ct_stale"), 1);
}

/// Conntrack is looked up before the VIP, so turning conntrack off for a VIP
/// must retire its existing entries: the loader gives every id of the VIP a
/// new generation (after the VIP entry), and an established flow follows the
/// ring from its next packet on. Fails if the flip only rewrites the VIP.
#[test]
fn turning_conntrack_off_unpins_established_flows() {
    let Some((mut dp, v)) = two_pods() else {
        return;
    };
    let pods = ["10.1.0.1", "10.1.0.2"];
    let syn = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    assert_eq!(
        run(&dp, &syn.bytes()).1,
        encapped(&syn, "10.0.0.11", "10.1.0.1", 0)
    );
    let ack = syn.established();
    for _ in 0..2 {
        assert_eq!(
            run(&dp, &ack.bytes()).1,
            encapped(&ack, "10.0.0.11", "10.1.0.1", 0)
        );
    }
    assert_eq!(counter(&dp, "ct_hit"), 1, "the flow is pinned");
    // conntrack off, and the ring now sends the flow to .2 (.1 still exists)
    let before = dp
        .programmed()
        .backend(&v, ip("10.1.0.1"))
        .copied()
        .unwrap();
    dp.apply(&state(vec![(v, svc(&v, &pods, 1).without_conntrack())]))
        .unwrap();
    let after = dp
        .programmed()
        .backend(&v, ip("10.1.0.1"))
        .copied()
        .unwrap();
    let stale = counter(&dp, "ct_stale");
    assert_eq!(
        run(&dp, &ack.bytes()).1,
        encapped(&ack, "10.0.0.11", "10.1.0.2", 0),
        "the established flow follows the ring"
    );
    assert_eq!(counter(&dp, "ct_stale"), stale + 1, "its entry went stale");
    assert_eq!(counter(&dp, "ct_hit"), 1);
    // and it stays there; nothing re-pins it
    assert_eq!(
        run(&dp, &ack.bytes()).1,
        encapped(&ack, "10.0.0.11", "10.1.0.2", 0)
    );
    assert_eq!(counter(&dp, "ct_hit"), 1, "no entry inserted");
    // how: same id, same pod, a new generation
    assert_eq!(after.id, before.id);
    assert_ne!(after.generation, before.generation);
}

/// The handshake: `syn` (which inserts nothing), then its ACK (which inserts
/// the flow's entry). Returns the ACK frame for the flow's later packets.
fn establish(dp: &ringlb_xdp::xdp::XdpDatapath, syn: &Frame) -> Frame {
    assert_eq!(run(dp, &syn.bytes()).0, XDP_TX, "SYN");
    let ack = syn.clone().established();
    assert_eq!(run(dp, &ack.bytes()).0, XDP_TX, "the handshake's ACK");
    ack
}

/// Entries in the conntrack map.
fn ct_entries(dp: &ringlb_xdp::xdp::XdpDatapath) -> usize {
    let m: aya::maps::HashMap<_, ringlb_xdp::abi::Flow, ringlb_xdp::abi::CtValue> =
        dp.maps().map(ringlb_xdp::abi::map::CONNTRACK).unwrap();
    m.keys().count()
}

/// Traffic to an address no VIP has (the node's own: BGP, SSH) is passed
/// before conntrack: an entry a deleted VIP left is not even looked at
/// (`ct_stale` stays 0), and a VIP added later on that address is forwarded
/// from its first packet (its filter bit is set before its entry).
#[test]
fn traffic_for_no_vip_address_skips_conntrack() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let (a, b) = (vip4(), vip("10.100.0.2", 80, Proto::Tcp));
    dp.apply(&state(vec![
        (a, svc(&a, &["10.1.0.1"], 0)),
        (b, svc(&b, &["10.1.0.1"], 0)),
    ]))
    .unwrap();
    let to_a = establish(
        &dp,
        &Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80),
    );
    dp.apply(&state(vec![(b, svc(&b, &["10.1.0.1"], 0))]))
        .unwrap();
    let (verdict, out) = run(&dp, &to_a.bytes());
    assert_eq!((verdict, out), (XDP_PASS, to_a.bytes()), "passed untouched");
    assert_eq!(counter(&dp, "pass_not_vip"), 1);
    assert_eq!(counter(&dp, "ct_stale"), 0, "conntrack not looked up");
    let node = Frame::tcp(ip("192.0.2.7"), ip("10.0.0.11"), 40000, 22).established();
    assert_eq!(run(&dp, &node.bytes()).0, XDP_PASS);
    assert_eq!(counter(&dp, "pass_not_vip"), 2);
    // one service at a time (apply_service sets the bit, no full rebuild)
    let c = vip("10.100.0.3", 80, Proto::Tcp);
    dp.apply_service(&c, Some(&svc(&c, &["10.1.0.1"], 0)))
        .unwrap();
    let to_c = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.3"), 40000, 80);
    assert_eq!(
        run(&dp, &to_c.bytes()).1,
        encapped(&to_c, "10.0.0.11", "10.1.0.1", 0)
    );
}

/// A SYN flood to one VIP (more SYNs than this CPU's conntrack LRU list
/// holds, none followed by an ACK) evicts no established flow of another
/// VIP: SYNs insert nothing (`ct_syn_ring` counts them), so every flow's entry
/// is still there and its next packet hits. The program before (SYNs
/// inserting) lost every such entry to the flood.
#[test]
fn a_syn_flood_evicts_no_established_flow() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    // one CPU: the LRU keeps a list per CPU, and the flood must overflow ours
    ringlb_testkit::bench::pin_to_current_cpu().unwrap();
    let cpus = aya::util::nr_cpus().unwrap() as u32;
    let (a, b) = (vip4(), vip("10.100.0.2", 80, Proto::Tcp));
    dp.apply(&state(vec![
        (a, svc(&a, &["10.1.0.1", "10.1.0.2"], 0)),
        (b, svc(&b, &["10.1.0.3", "10.1.0.4"], 0)),
    ]))
    .unwrap();
    let flows: Vec<Frame> = (0..100u16)
        .map(|k| {
            establish(
                &dp,
                &Frame::tcp(ip("192.0.2.9"), ip("10.100.0.2"), 20000 + k, 80),
            )
        })
        .collect();
    assert_eq!(ct_entries(&dp), 100);
    let flood = ringlb_xdp::abi::CT_SIZE / cpus * 5 / 4;
    let _dispatched = keep_in_xdp_dispatcher(&mut dp);
    let mut syn = Frame::tcp(ip("198.51.100.1"), ip("10.100.0.1"), 1, 80);
    for i in 0..flood {
        syn.src = std::net::IpAddr::V4(std::net::Ipv4Addr::from(0xc633_0000 + (i >> 16)));
        syn.sport = (i & 0xffff) as u16;
        assert_eq!(run(&dp, &syn.bytes()).0, XDP_TX, "SYN {i}");
    }
    assert_eq!(
        counter(&dp, "ct_syn_ring") + counter(&dp, "ct_syn_filtered"),
        u64::from(flood) + 100
    );
    assert_eq!(ct_entries(&dp), 100, "the flood inserted nothing");
    let hits = counter(&dp, "ct_hit");
    for f in &flows {
        assert_eq!(run(&dp, &f.bytes()).0, XDP_TX);
    }
    assert_eq!(
        counter(&dp, "ct_hit"),
        hits + 100,
        "every flow still has its entry"
    );
}

/// The flow filter's slot of the only conntrack entry.
fn only_slot(dp: &XdpDatapath) -> u32 {
    let keys = dp.maps().conntrack_keys().unwrap();
    assert_eq!(keys.len(), 1);
    let bits = dp.with_flow_filter(|f| f.bits()).unwrap();
    flow_filter::slot_of(flow_filter::flow_hash(&keys[0]), bits)
}

/// The flow filter decides whether a SYN looks its 5-tuple up: with the
/// slot of an old entry (naming another backend than the ring) forged clear,
/// the SYN does not look up, so it cannot rewrite the entry, and its ACK
/// follows the old entry; with the slot set (as every insert leaves it) the
/// SYN rewrites the entry and its ACK follows the SYN.
#[test]
fn a_syn_looks_up_only_when_its_flow_filter_slot_is_set() {
    let Some((mut dp, v)) = two_pods() else {
        return;
    };
    require_flow_filter(&dp);
    let syn = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    let ack = establish(&dp, &syn);
    let slot = only_slot(&dp);
    // the ACK's insert set the slot in both halves
    dp.with_flow_filter(|f| assert!(f.get(0, slot) && f.get(1, slot)))
        .unwrap();
    // the ring moves the flow to .2; the old entry names .1
    dp.apply(&state(vec![(v, svc(&v, &["10.1.0.1", "10.1.0.2"], 1))]))
        .unwrap();
    // forged: the active half says "no entry"
    dp.with_flow_filter(|f| {
        f.fill(f.active(), false);
    })
    .unwrap();
    let filtered = counter(&dp, "ct_syn_filtered");
    assert_eq!(
        run(&dp, &syn.bytes()).1,
        encapped(&syn, "10.0.0.11", "10.1.0.2", 0)
    );
    assert_eq!(counter(&dp, "ct_syn_filtered"), filtered + 1, "no lookup");
    assert_eq!(counter(&dp, "ct_syn_rewrite"), 0, "the entry was not seen");
    assert_eq!(
        run(&dp, &ack.bytes()).1,
        encapped(&ack, "10.0.0.11", "10.1.0.1", 0),
        "the old entry, untouched"
    );
    // a rebuild puts the live entry's slot back: the SYN looks up again,
    // rewrites the entry, and the ACK follows the SYN's backend
    let st = dp.rebuild_flow_filter().unwrap();
    assert_eq!((st.keys, st.set), (1, 1));
    assert_eq!(
        run(&dp, &syn.bytes()).1,
        encapped(&syn, "10.0.0.11", "10.1.0.2", 0)
    );
    assert_eq!(counter(&dp, "ct_syn_filtered"), filtered + 1);
    assert_eq!(counter(&dp, "ct_syn_rewrite"), 1);
    assert_eq!(
        run(&dp, &ack.bytes()).1,
        encapped(&ack, "10.0.0.11", "10.1.0.2", 0)
    );
}

/// Every insert sets its slot in both halves; a rebuild keeps the slot of
/// every live key (also one inserted after it began: set in both halves) and
/// clears the rest, so a SYN of a flow whose entry is gone skips the lookup.
#[test]
fn a_flow_filter_rebuild_keeps_every_live_key_and_clears_the_rest() {
    let Some((dp, _)) = two_pods() else {
        return;
    };
    require_flow_filter(&dp);
    assert_eq!(dp.with_flow_filter(|f| f.count(0) + f.count(1)).unwrap(), 0);
    let flow = |k: u16| Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 30000 + k, 80);
    for k in 0..200 {
        establish(&dp, &flow(k));
    }
    let keys = dp.maps().conntrack_keys().unwrap();
    assert_eq!(keys.len(), 200);
    let bits = dp.with_flow_filter(|f| f.bits()).unwrap();
    let slot = |k: &ringlb_xdp::abi::Flow| flow_filter::slot_of(flow_filter::flow_hash(k), bits);
    dp.with_flow_filter(|f| {
        assert!(keys.iter().all(|k| f.get(0, slot(k)) && f.get(1, slot(k))));
    })
    .unwrap();
    // 150 entries go (as LRU eviction would drop them)
    let id = {
        let ct: aya::maps::HashMap<
            &aya::maps::MapData,
            ringlb_xdp::abi::Flow,
            ringlb_xdp::abi::CtValue,
        > = dp.maps().map(ringlb_xdp::abi::map::CONNTRACK).unwrap();
        aya::maps::IterableMap::map(&ct).info().unwrap().id()
    };
    let mut ct: aya::maps::HashMap<_, ringlb_xdp::abi::Flow, ringlb_xdp::abi::CtValue> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(
            aya::maps::MapData::from_id(id).unwrap(),
        ))
        .unwrap();
    let (gone, live) = keys.split_at(150);
    for k in gone {
        ct.remove(k).unwrap();
    }
    let st = dp.rebuild_flow_filter().unwrap();
    assert_eq!(st.keys, 50);
    let live_slots: std::collections::BTreeSet<u32> = live.iter().map(slot).collect();
    dp.with_flow_filter(|f| {
        let a = f.active();
        assert_eq!(a, st.active);
        assert!(live.iter().all(|k| f.get(a, slot(k))), "a live key lost");
        assert_eq!(
            f.count(a) as usize,
            live_slots.len(),
            "only live keys' slots"
        );
    })
    .unwrap();
    // a gone flow's new SYN: no lookup; a live one's: lookup
    let filtered = counter(&dp, "ct_syn_filtered");
    let ring0 = counter(&dp, "ct_syn_ring");
    for (i, k) in keys.iter().enumerate() {
        let f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), k.sport.to_host(), 80);
        assert_eq!(run(&dp, &f.bytes()).0, XDP_TX, "SYN {i}");
    }
    let gone_clear = gone
        .iter()
        .filter(|k| !live_slots.contains(&slot(k)))
        .count() as u64;
    assert_eq!(counter(&dp, "ct_syn_filtered"), filtered + gone_clear);
    assert_eq!(counter(&dp, "ct_syn_ring"), ring0 + 200 - gone_clear);
    // an entry inserted now sets both halves: the next rebuild keeps it
    establish(&dp, &flow(999));
    let st = dp.rebuild_flow_filter().unwrap();
    assert_eq!(st.keys, 51);
    let keys = dp.maps().conntrack_keys().unwrap();
    dp.with_flow_filter(|f| assert!(keys.iter().all(|k| f.get(f.active(), slot(k)))))
        .unwrap();
}

/// The loader gives a kernel the build its verifier takes: the flow filter's
/// atomic OR from Linux 5.12 on, the build without the filter before, and
/// either one forwards a new flow's handshake to the same backend.
#[test]
fn the_loader_picks_the_build_this_kernel_verifies() {
    let Some((dp, _)) = two_pods() else {
        return;
    };
    let has = kernel_has_atomic_or();
    assert_eq!(ringlb_xdp::xdp::probe_atomic_or().is_ok(), has);
    assert_eq!(dp.flow_filter(), has);
    let syn = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    let ack = establish(&dp, &syn);
    assert_eq!(
        run(&dp, &ack.bytes()).1,
        encapped(&ack, "10.0.0.11", "10.1.0.1", 0)
    );
    let label = if has {
        "ct_syn_filtered"
    } else {
        "ct_syn_ring"
    };
    assert_eq!(counter(&dp, label), 1, "the SYN went by {label}");
}

/// CLOCK_MONOTONIC (the clock of bpf_ktime_get_ns) in ns.
fn monotonic_ns() -> u64 {
    ringlb_xdp::bfd_hold::monotonic_now().as_nanos() as u64
}

/// A flood of new flows that are not SYNs (spoofed ACKs) would insert an
/// entry each: a VIP inserts at most its budget per CPU per second, and a
/// new flow past it is forwarded by the ring without an entry
/// (`ct_over_budget`), to the same backend every time. The budget is per VIP:
/// another VIP still inserts, and its established flow keeps its entry; a
/// VIP that takes a deleted one's vip_id starts with a budget of its own.
#[test]
fn new_flows_past_a_vips_insert_budget_go_by_the_ring_without_an_entry() {
    // a window of the budget lasts a second from the VIP's first insert: an
    // attempt slower than that (a slow emulated kernel) is run again
    for _ in 0..3 {
        match insert_budget_attempt() {
            None | Some(true) => return, // None: not root, skipped loudly
            Some(false) => {
                eprintln!("the attempt took a second or more: the budget's window closed; again")
            }
        }
    }
    panic!("three attempts took a second or more");
}

/// The inserts each CPU's open window of `vip_id` has counted.
fn budget_used(dp: &XdpDatapath, vip_id: u32) -> Vec<u32> {
    let m: aya::maps::PerCpuArray<_, ringlb_xdp::abi::CtBudget> =
        dp.maps().map(ringlb_xdp::abi::map::CT_BUDGET).unwrap();
    m.get(&vip_id, 0).unwrap().iter().map(|b| b.used).collect()
}

/// One attempt of the test above; `Some(false)` if A's flood took a second
/// or more, `None` without root.
fn insert_budget_attempt() -> Option<bool> {
    const BUDGET: u32 = 5;
    let mut dp = load_with(&XdpOptions {
        ct_insert_budget: BUDGET,
        ..opts(1500, false)
    })?;
    // the budget is per CPU: the flood runs on one CPU, or a migration in the
    // middle of it would give it a second CPU's budget too
    ringlb_testkit::bench::pin_to_current_cpu().expect("sched_setaffinity");
    let (a, b) = (vip4(), vip("10.100.0.2", 80, Proto::Tcp));
    let pods = ["10.1.0.1", "10.1.0.2"];
    dp.apply(&state(vec![(a, svc(&a, &pods, 0)), (b, svc(&b, &pods, 0))]))
        .unwrap();
    let backend_of = |f: &Frame, out: &[u8]| {
        pods.into_iter()
            .find(|p| out == encapped(f, "10.0.0.11", p, 0))
            .unwrap_or_else(|| panic!("{f:?}: not encapsulated to a pod of its VIP"))
    };
    let est = establish(
        &dp,
        &Frame::tcp(ip("192.0.2.9"), ip("10.100.0.2"), 50000, 80),
    );
    // 20 new flows' ACKs to A (no SYN before: a spoofed flood)
    let flood: Vec<Frame> = (0..20)
        .map(|i| Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000 + i, 80).established())
        .collect();
    let start = monotonic_ns();
    let first: Vec<&str> = flood
        .iter()
        .map(|f| {
            let (verdict, out) = run(&dp, &f.bytes());
            assert_eq!(verdict, XDP_TX);
            backend_of(f, &out)
        })
        .collect();
    // B still inserts: the budget is A's
    let late = Frame::tcp(ip("192.0.2.9"), ip("10.100.0.2"), 50001, 80).established();
    assert_eq!(run(&dp, &late.bytes()).0, XDP_TX);
    if monotonic_ns() - start >= 1_000_000_000 {
        return Some(false);
    }
    assert_eq!(counter(&dp, "ct_over_budget"), 20 - u64::from(BUDGET));
    assert_eq!(counter(&dp, "ct_miss"), 1 + 20 + 1, "every new flow missed");
    assert_eq!(
        ct_entries(&dp),
        BUDGET as usize + 2,
        "A's budget, B's two flows"
    );
    // the flows without an entry keep their backend by the ring alone
    for (f, was) in flood.iter().zip(&first) {
        assert_eq!(backend_of(f, &run(&dp, &f.bytes()).1), *was);
    }
    let hits = counter(&dp, "ct_hit");
    assert_eq!(run(&dp, &est.bytes()).0, XDP_TX);
    assert_eq!(counter(&dp, "ct_hit"), hits + 1, "B's flow kept its entry");

    // A goes, and C takes its vip_id: C starts with a budget of its own, not
    // with the rest of A's spent window (read in the map itself: the two
    // applies may take longer than the window on a slow kernel)
    let a_id = dp.programmed().vips[&a].vip_id;
    let spent = budget_used(&dp, a_id);
    assert_eq!(spent.iter().sum::<u32>(), BUDGET, "A's window: {spent:?}");
    dp.apply(&state(vec![(b, svc(&b, &pods, 0))])).unwrap();
    let c = vip("10.100.0.3", 80, Proto::Tcp);
    dp.apply(&state(vec![(b, svc(&b, &pods, 0)), (c, svc(&c, &pods, 0))]))
        .unwrap();
    assert_eq!(dp.programmed().vips[&c].vip_id, a_id, "C reuses A's id");
    let left = budget_used(&dp, a_id);
    assert!(
        left.iter().all(|&u| u == 0),
        "A's window outlived A: {left:?}"
    );
    let (over, entries) = (counter(&dp, "ct_over_budget"), ct_entries(&dp));
    let to_c = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.3"), 40000, 80).established();
    assert_eq!(run(&dp, &to_c.bytes()).0, XDP_TX);
    assert_eq!(counter(&dp, "ct_over_budget"), over, "C had room");
    assert_eq!(ct_entries(&dp), entries + 1, "C's first new flow inserted");
    Some(true)
}
