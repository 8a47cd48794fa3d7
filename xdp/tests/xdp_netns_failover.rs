//! A failover VIP with real TCP through two XDP edges in network namespaces:
//!
//! ```text
//!  client 10.202.1.2 --- tor (router) --- edge A 10.202.0.11   VIP_A -> remote VIP_B
//!                          |   |   \----- edge B 10.202.4.11   VIP_B (own), alias VIP_A -> pods
//!                        pod1  pod2       tc ringlb_decap, VIP_A on lo
//! ```
//! client -> tor -> edge A (XDP: ring -> remote VIP_B, IPIP to VIP_B) -> tor ->
//! edge B (XDP: IPIP to its own VIP, inner VIP_A is an alias: re-encapsulated to
//! a pod) -> tor -> pod (tc decap) -> the reply from VIP_A straight to the client.
//! Region A has no pods; region B's pods serve A's VIP. Then A's pods return
//! with B's VIP kept as a draining backend: the failed-over connections stay on
//! B, new ones stay in A. Needs root.

mod xdp_support;

use std::{
    collections::BTreeSet,
    io::BufReader,
    net::{IpAddr, TcpStream},
};

use ringlb_testkit::pod::{ask, connect};
use ringlb_xdp::{
    Datapath, DesiredState, Proto, ServiceEntry, Vip,
    xdp::{XdpDatapath, XdpOptions},
};
use xdp_support::fixture::counter;
use xdp_support::*;

const VIP_A: &str = "10.202.100.1";
const VIP_B: &str = "10.202.100.2";
const POD1: &str = "10.202.2.21";
const POD2: &str = "10.202.3.22";
/// Edge A's address: the outer source of what it sends to B.
const EDGE_A: &str = "10.202.0.11";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn vip(addr: &str) -> Vip {
    Vip {
        addr: ip(addr),
        port: 80,
        proto: Proto::Tcp,
    }
}

/// A service over `backends`, ring slots spread round-robin.
fn entry(v: &Vip, backends: &[&str]) -> ServiceEntry {
    let b: Vec<IpAddr> = backends.iter().map(|a| ip(a)).collect();
    let ring = (0..251).map(|s| s % b.len() as u32).collect();
    ServiceEntry::new(v, b, ring).unwrap()
}

fn edge(ns: &str, src: &str, desired: &DesiredState) -> XdpDatapath {
    let opts = XdpOptions {
        src4: Some(src.parse().unwrap()),
        // B takes failover traffic from A's edge (A's own setting is unused)
        decap_senders: vec![(EDGE_A.parse().unwrap(), 32)],
        ..lab_opts()
    };
    edge_in(ns, &opts, desired)
}

/// The counter once it has not moved for 300 ms (at most 5 s): a delayed
/// ACK leaves the client up to 200 ms after the data it acknowledges.
fn settled_counter(dp: &XdpDatapath, label: &str) -> u64 {
    let mut last = counter(dp, label);
    for _ in 0..16 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let now = counter(dp, label);
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("{label} still moving after 5 s: {last}")
}

#[test]
fn tcp_to_a_vip_without_pods_is_served_by_the_other_regions_pods() {
    if !require_root("the XDP failover netns test (netns, BPF, tc)") {
        return;
    }
    let [client, tor, edge_a, edge_b, pod1, pod2] =
        Netns::per_process("rlbf", ["c", "t", "a", "b", "p1", "p2"]);
    let (c, t, ea, eb, p1, p2) = (&client.0, &tor.0, &edge_a.0, &edge_b.0, &pod1.0, &pod2.0);
    wire_the_lab([c, t, ea, eb, p1, p2]);
    // ringlb_pass on the ToR's side of both edges, tc decap in the pods
    let _programs = attach_lab_programs(t, [p1, p2]);
    let _pass_b = attach_pass(t, "ve-eb");
    serve(p1.clone(), ip(VIP_A), "pod1");
    serve(p2.clone(), ip(VIP_A), "pod2");

    // region A: no ready pods, VIP_A fails over to VIP_B
    let (va, vb) = (vip(VIP_A), vip(VIP_B));
    let to_b = entry(&va, &[VIP_B]).with_remote(&va, [ip(VIP_B)]).unwrap();
    let mut dp_a = edge(
        ea,
        EDGE_A,
        &DesiredState {
            services: [(va, to_b)].into_iter().collect(),
        },
    );
    // region B: its own VIP_B, and VIP_A accepted as a failover alias
    let alias = entry(&va, &[POD1, POD2]).as_failover_alias(&va).unwrap();
    let dp_b = edge(
        eb,
        "10.202.4.11",
        &DesiredState {
            services: [(vb, entry(&vb, &[POD1, POD2])), (va, alias)]
                .into_iter()
                .collect(),
        },
    );

    let mut who = BTreeSet::new();
    let mut conns = Vec::new();
    in_netns(c, || {
        for i in 0..20 {
            let mut r = connect((ip(VIP_A), 80).into())
                .unwrap_or_else(|e| panic!("connection {i} to VIP_A: {e}"));
            who.insert(ask(&mut r).unwrap_or_else(|e| panic!("connection {i}: {e}")));
            conns.push(r);
        }
    });
    assert_eq!(
        who,
        ["pod1", "pod2"].map(String::from).into(),
        "B's pods serve A's VIP"
    );
    let (out, inn) = (
        counter(&dp_a, "failover_out"),
        counter(&dp_b, "failover_in"),
    );
    eprintln!("edge A failover_out {out}, edge B failover_in {inn}");
    assert!(out >= 20 * 3 && inn >= 20 * 3, "out {out}, in {inn}");
    assert_eq!(counter(&dp_b, "failover_loop"), 0);
    // established failed-over flows keep going (conntrack on both edges)
    for r in &mut conns {
        ask(r).expect("an established failed-over connection");
    }
    assert!(counter(&dp_b, "ct_hit") > 0 && counter(&dp_a, "ct_hit") > 0);

    a_pods_return_and_failed_over_flows_stay_on_b(c, &mut dp_a, &dp_b, &mut conns);
    drop(conns);
    dp_a.uninstall().unwrap();
    dp_b.uninstall().unwrap();
}

/// The namespaces of the picture at the top: links, routes (the ToR routes
/// each VIP to its region's edge), and the sysctls DSR needs.
fn wire_the_lab([c, t, ea, eb, p1, p2]: [&str; 6]) {
    veth(c, "eth0", "10.202.1.2/24", t, "ve-cl", "10.202.1.1/24");
    veth(ea, "eth0", "10.202.0.11/24", t, "ve-e", "10.202.0.1/24");
    veth(eb, "eth0", "10.202.4.11/24", t, "ve-eb", "10.202.4.1/24");
    veth(p1, "eth0", "10.202.2.21/24", t, "ve-p1", "10.202.2.1/24");
    veth(p2, "eth0", "10.202.3.22/24", t, "ve-p2", "10.202.3.1/24");
    for (ns, gw) in [
        (c, "10.202.1.1"),
        (ea, "10.202.0.1"),
        (eb, "10.202.4.1"),
        (p1, "10.202.2.1"),
        (p2, "10.202.3.1"),
    ] {
        default_route(ns, gw);
    }
    // each region's edge announces its own VIP (BGP's job in production)
    for (v, via) in [(VIP_A, "10.202.0.11"), (VIP_B, "10.202.4.11")] {
        route(t, &format!("{v}/32"), via);
    }
    sysctl(t, "net.ipv4.ip_forward=1");
    for ns in [c, t, ea, eb, p1, p2] {
        no_rp_filter(ns);
    }
    for dev in ["ve-cl", "ve-e", "ve-eb", "ve-p1", "ve-p2"] {
        sysctl(t, &format!("net.ipv4.conf.{dev}.rp_filter=0"));
    }
    for ns in [p1, p2] {
        dsr_pod(ns, VIP_A);
    }
    in_netns(c, || tx_checksum_off("eth0"));
}

/// Region A's pods return (here: the same two pods, reached directly). The
/// remote VIP stays in A's entry as a draining backend (in the backends, not
/// in the ring): established cross-region flows keep going through B by
/// conntrack, new ones go to the pods directly.
fn a_pods_return_and_failed_over_flows_stay_on_b(
    c: &str,
    dp_a: &mut XdpDatapath,
    dp_b: &XdpDatapath,
    conns: &mut [BufReader<TcpStream>],
) {
    let va = vip(VIP_A);
    let back: Vec<IpAddr> = [POD1, POD2, VIP_B].map(ip).to_vec();
    let ring = (0..251).map(|s| s % 2).collect();
    let a_back = ServiceEntry::new(&va, back, ring)
        .unwrap()
        .with_remote(&va, [ip(VIP_B)])
        .unwrap();
    dp_a.apply(&DesiredState {
        services: [(va, a_back)].into_iter().collect(),
    })
    .unwrap();
    let (out0, in0) = (counter(dp_a, "failover_out"), counter(dp_b, "failover_in"));
    for r in conns.iter_mut() {
        ask(r).expect("a failed-over connection after A's pods returned");
    }
    assert!(counter(dp_b, "failover_in") >= in0 + 20, "still through B");
    // the client's delayed ACKs of those answers still cross A after `ask`
    // returns: wait for them before taking the baseline
    let out1 = settled_counter(dp_a, "failover_out");
    assert!(out1 >= out0 + 20);
    in_netns(c, || {
        for _ in 0..10 {
            ask(&mut connect((ip(VIP_A), 80).into()).unwrap()).unwrap();
        }
    });
    assert_eq!(
        counter(dp_a, "failover_out"),
        out1,
        "new flows stay in region A"
    );
}
