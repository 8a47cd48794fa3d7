//! The IPVS datapath against a real kernel's IPVS (the kernel matrix runs it in
//! Debian 5.10, 6.1, 6.12 and the newest; this machine's kernel has no IPVS, so
//! here it skips loudly). Each test works in its own network namespace (IPVS is
//! per namespace): the seam applies a desired state, and the kernel is read back
//! twice, through our codec and with `ipvsadm -Ln`, which parses the kernel's
//! answers with its own (libnl) code.

mod ipvs_support;

use std::net::IpAddr;

use ipvs_support::*;
use ringlb_datapath::{Datapath, DesiredState};
use ringlb_ipvs::{
    Config, Forward, Held, IpvsDatapath, Kernel, ServiceKey,
    codec::consts::{IP_VS_SVC_F_SCHED1, IP_VS_SVC_F_SCHED2, SVC_FLAGS_MANAGED},
    kernel::netlink::NetlinkKernel,
    seam::service_key,
};

const VIP6: &str = "2001:db8:203::1";
const POD6: [&str; 2] = ["2001:db8:203::21", "2001:db8:203::22"];

/// Real servers of `key` as the kernel lists them (head first), through our codec.
fn dests(
    dp: &mut IpvsDatapath<NetlinkKernel>,
    key: &ServiceKey,
) -> Vec<(IpAddr, u16, Forward, u32)> {
    dp.kernel_mut()
        .dests(key)
        .unwrap()
        .into_iter()
        .map(|d| (d.key.addr, d.key.port, d.forward, d.weight))
        .collect()
}

/// TCP and UDP on one VIP, an IPv6 VIP, and an IPv4 VIP with an IPv6 pod (tunnel
/// only: IPv4 in IPv6).
fn four_services() -> DesiredState {
    let (v80, v53, v6) = (tcp(VIP, 80), udp(VIP, 53), tcp(VIP6, 443));
    let mixed = tcp(VIP, 8080);
    DesiredState {
        services: [
            (v80, entry(&v80, &PODS, &[PODS[2]])),
            (v53, entry(&v53, &PODS[..2], &[])),
            (v6, entry(&v6, &POD6, &[])),
            (mixed, entry(&mixed, &POD6[..1], &[])),
        ]
        .into(),
    }
}

/// A namespace of this test process, `tag` telling the tests apart.
fn netns(tag: &str) -> Netns {
    Netns::new(&format!("rlbvk{}{tag}", std::process::id()))
}

#[test]
fn the_seam_programs_ipvs_and_the_kernel_reads_back_exactly_that() {
    require_ipvs!("the_seam_programs_ipvs_and_the_kernel_reads_back_exactly_that");
    let ns = netns("a");
    let mut dp = datapath_in(&ns.0, Config::default());
    let state = four_services();
    let st = Datapath::apply(&mut dp, &state).unwrap();
    assert_eq!((st.vips_written, st.backends_written), (4, 8), "{st:?}");

    // our codec: the services with mh, mh-port and mh-fallback, a host netmask
    let services = dp.kernel_mut().services().unwrap();
    assert_eq!(services.len(), 4, "{services:?}");
    for (s, _) in &services {
        assert_eq!(s.sched_name, "mh", "{s:?}");
        let both = IP_VS_SVC_F_SCHED1 | IP_VS_SVC_F_SCHED2;
        assert_eq!(s.flags & both, both, "mh-fallback and mh-port: {s:?}");
        assert_eq!(s.timeout, 0, "not persistent: {s:?}");
        let mask = if s.key.addr.is_ipv4() { u32::MAX } else { 128 };
        assert_eq!(s.netmask, mask, "{s:?}");
    }
    let k80 = service_key(&tcp(VIP, 80));
    let t = Forward::Tunnel;
    assert_eq!(
        dests(&mut dp, &k80),
        [
            (ip(PODS[2]), 80, t, 0),
            (ip(PODS[1]), 80, t, 1),
            (ip(PODS[0]), 80, t, 1)
        ],
        "canonical order (highest address at the head), the draining pod at weight 0"
    );
    let k6 = service_key(&tcp(VIP6, 443));
    assert_eq!(
        dests(&mut dp, &k6),
        [(ip(POD6[1]), 443, t, 1), (ip(POD6[0]), 443, t, 1)]
    );
    let mixed = service_key(&tcp(VIP, 8080));
    assert_eq!(dests(&mut dp, &mixed), [(ip(POD6[0]), 8080, t, 1)]);
    // what the datapath believes is what the kernel holds (but for the flags
    // ringlb does not manage: the kernel adds IP_VS_SVC_F_HASHED)
    let managed = |h: &Held| {
        let mut h = h.clone();
        for s in h.services.values_mut() {
            s.service.flags &= SVC_FLAGS_MANAGED;
        }
        h
    };
    let read = dp.read_held(&Default::default()).unwrap();
    assert_eq!(managed(&read), managed(dp.held()));

    // ipvsadm, independently
    let adm = ipvsadm(&ns.0);
    eprintln!("{}", nsx(&ns.0, &["ipvsadm", "-Ln", "--nosort"]));
    assert_eq!(adm.len(), 4, "{adm:?}");
    let s80 = &adm["TCP 10.203.100.1:80"];
    for word in ["mh", "mh-fallback", "mh-port"] {
        assert!(s80.line.contains(word), "{word} in {:?}", s80.line);
    }
    let dest = |a: &str, p: u16, f: &str, w: u32| (format!("{a}:{p}"), f.to_string(), w);
    assert_eq!(
        s80.dests,
        [
            dest(PODS[2], 80, "Tunnel", 0),
            dest(PODS[1], 80, "Tunnel", 1),
            dest(PODS[0], 80, "Tunnel", 1)
        ]
    );
    assert_eq!(
        adm["UDP 10.203.100.1:53"].dests,
        [
            dest(PODS[1], 53, "Tunnel", 1),
            dest(PODS[0], 53, "Tunnel", 1)
        ]
    );
    let s6 = &adm[&format!("TCP [{VIP6}]:443")];
    assert_eq!(
        s6.dests,
        [
            (format!("[{}]:443", POD6[1]), "Tunnel".into(), 1),
            (format!("[{}]:443", POD6[0]), "Tunnel".into(), 1)
        ]
    );

    assert_eq!(
        adm["TCP 10.203.100.1:8080"].dests,
        [(format!("[{}]:8080", POD6[0]), "Tunnel".into(), 1)]
    );

    // the VIPs are local addresses (IPVS works in LOCAL_IN)
    let lo = lo_addrs(&ns.0);
    assert!(lo.contains(&format!("{VIP}/32")), "{lo:?}");
    assert!(lo.contains(&format!("{VIP6}/128")), "{lo:?}");

    // on exit: ringlb's services and VIPs are gone
    Datapath::uninstall(dp).unwrap();
    assert!(
        ipvsadm(&ns.0).is_empty(),
        "{}",
        nsx(&ns.0, &["ipvsadm", "-Ln"])
    );
    let lo = lo_addrs(&ns.0);
    assert!(
        !lo.iter().any(|a| a.starts_with(VIP) || a.starts_with(VIP6)),
        "{lo:?}"
    );
}

#[test]
fn edits_are_incremental_and_the_list_stays_canonical() {
    require_ipvs!("edits_are_incremental_and_the_list_stays_canonical");
    let ns = netns("b");
    let mut dp = datapath_in(&ns.0, Config::default());
    let key = service_key(&tcp(VIP, 80));
    let order = |dp: &mut IpvsDatapath<NetlinkKernel>| -> Vec<(String, u32)> {
        dests(dp, &key)
            .into_iter()
            .map(|(a, _, _, w)| (a.to_string(), w))
            .collect()
    };
    let adm = |ns: &str| -> Vec<(String, u32)> {
        ipvsadm(ns)["TCP 10.203.100.1:80"]
            .dests
            .iter()
            .map(|(a, _, w)| (a.trim_end_matches(":80").to_string(), *w))
            .collect()
    };
    let w = |a: &str, w: u32| (a.to_string(), w);

    // pod2 alone, then pod3 (higher: one NEW_DEST at the head)
    Datapath::apply(&mut dp, &one_service(&[PODS[1]], &[])).unwrap();
    let st = Datapath::apply(&mut dp, &one_service(&[PODS[1], PODS[2]], &[])).unwrap();
    assert_eq!(
        (st.vips_written, st.backends_written, st.backends_deleted),
        (0, 1, 0)
    );
    assert_eq!(order(&mut dp), [w(PODS[2], 1), w(PODS[1], 1)]);

    // pod1 (lowest): pod2 and pod3 are re-added above it, the service stays
    let st = Datapath::apply(&mut dp, &one_service(&PODS, &[])).unwrap();
    assert_eq!(
        (st.vips_written, st.vips_deleted),
        (0, 0),
        "no service re-made: {st:?}"
    );
    let want = [w(PODS[2], 1), w(PODS[1], 1), w(PODS[0], 1)];
    assert_eq!(order(&mut dp), want);
    assert_eq!(adm(&ns.0), want, "ipvsadm sees the same list");

    // pod2 drains: one SET_DEST, its place kept
    let st = Datapath::apply(&mut dp, &one_service(&PODS, &[PODS[1]])).unwrap();
    assert_eq!((st.backends_written, st.backends_deleted), (1, 0), "{st:?}");
    let want = [w(PODS[2], 1), w(PODS[1], 0), w(PODS[0], 1)];
    assert_eq!(order(&mut dp), want);
    assert_eq!(adm(&ns.0), want);

    // pod2 leaves: one DEL_DEST
    let st = Datapath::apply(&mut dp, &one_service(&[PODS[0], PODS[2]], &[])).unwrap();
    assert_eq!(
        (st.backends_written, st.backends_deleted, st.vips_deleted),
        (0, 1, 0)
    );
    assert_eq!(order(&mut dp), [w(PODS[2], 1), w(PODS[0], 1)]);

    // one service edited alone (the agent's per-EndpointSlice path)
    let v = tcp(VIP, 80);
    let e = entry(&v, &[PODS[0]], &[]);
    Datapath::apply_service(&mut dp, &v, Some(&e)).unwrap();
    assert_eq!(adm(&ns.0), [w(PODS[0], 1)]);
    Datapath::apply_service(&mut dp, &v, None).unwrap();
    assert!(ipvsadm(&ns.0).is_empty());
    assert!(
        !lo_addrs(&ns.0).contains(&format!("{VIP}/32")),
        "the VIP is unbound with its last service"
    );
}

#[test]
fn direct_routing_reads_back_as_route() {
    require_ipvs!("direct_routing_reads_back_as_route");
    let ns = netns("c");
    let cfg = Config {
        forward: Forward::DirectRoute,
        ..Config::default()
    };
    let mut dp = datapath_in(&ns.0, cfg);
    Datapath::apply(&mut dp, &one_service(&PODS[..2], &[])).unwrap();
    let key = service_key(&tcp(VIP, 80));
    let r = Forward::DirectRoute;
    assert_eq!(
        dests(&mut dp, &key),
        [(ip(PODS[1]), 80, r, 1), (ip(PODS[0]), 80, r, 1)]
    );
    let adm = ipvsadm(&ns.0);
    let fwd: Vec<&str> = adm["TCP 10.203.100.1:80"]
        .dests
        .iter()
        .map(|d| d.1.as_str())
        .collect();
    assert_eq!(fwd, ["Route", "Route"]);
    Datapath::uninstall(dp).unwrap();
}

#[test]
fn others_services_are_left_alone_and_a_restart_cleans_up_a_crash() {
    require_ipvs!("others_services_are_left_alone_and_a_restart_cleans_up_a_crash");
    let ns = netns("d");
    // an operator's service (kube-proxy's, say), on an address ringlb does not serve
    nsx(
        &ns.0,
        &["ipvsadm", "-A", "-t", "10.203.200.1:80", "-s", "mh"],
    );
    nsx(
        &ns.0,
        &[
            "ipvsadm",
            "-a",
            "-t",
            "10.203.200.1:80",
            "-r",
            "10.203.0.99:80",
            "-m",
        ],
    );
    let mut dp = datapath_in(&ns.0, Config::default());
    assert!(
        dp.held().services.is_empty(),
        "the operator's service is not ringlb's"
    );
    Datapath::apply(&mut dp, &one_service(&PODS, &[])).unwrap();
    assert_eq!(ipvsadm(&ns.0).len(), 2);
    // a crash: the datapath goes without uninstalling
    drop(dp);
    let mut dp = datapath_in(&ns.0, Config::default());
    assert_eq!(
        dp.held().services.len(),
        1,
        "the next run finds what the last one left"
    );
    assert!(dp.held().vips.contains(&ip(VIP)));
    Datapath::apply(&mut dp, &DesiredState::default()).unwrap();
    let adm = ipvsadm(&ns.0);
    assert_eq!(
        adm.keys().collect::<Vec<_>>(),
        ["TCP 10.203.200.1:80"],
        "only the operator's is left"
    );
    assert_eq!(adm["TCP 10.203.200.1:80"].dests[0].1, "Masq");
    assert!(!lo_addrs(&ns.0).contains(&format!("{VIP}/32")));
}
