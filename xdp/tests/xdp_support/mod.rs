//! Shared helpers for the XDP tests (the generic ones are `ringlb_testkit::netns`).
#![allow(dead_code)]

pub(crate) mod fixture;

pub(crate) use ringlb_testkit::netns::*;

/// A veth pair `a` (in `a_ns`, address `a_ip`) -- `b` (in `b_ns`), both up.
pub(crate) fn veth(a_ns: &str, a: &str, a_ip: &str, b_ns: &str, b: &str, b_ip: &str) {
    sh(&[
        "ip", "-n", a_ns, "link", "add", a, "type", "veth", "peer", "name", b, "netns", b_ns,
    ]);
    sh(&["ip", "-n", a_ns, "addr", "add", a_ip, "dev", a]);
    sh(&["ip", "-n", b_ns, "addr", "add", b_ip, "dev", b]);
    sh(&["ip", "-n", a_ns, "link", "set", a, "up"]);
    sh(&["ip", "-n", b_ns, "link", "set", b, "up"]);
}

/// The default route of namespace `ns`, via `gw`.
pub(crate) fn default_route(ns: &str, gw: &str) {
    sh(&["ip", "-n", ns, "route", "add", "default", "via", gw]);
}

pub(crate) fn sysctl(ns: &str, kv: &str) {
    nsx(ns, &["sysctl", "-qw", kv]);
}

/// `ringlb_pass` (XDP) on `dev` in `ns`: a veth receives XDP_TX frames of
/// its peer only with a program of its own. Keep the object alive.
pub(crate) fn attach_pass(ns: &str, dev: &str) -> aya::Ebpf {
    use aya::programs::{Xdp, XdpMode};
    let mut pass = aya::Ebpf::load(ringlb_testkit::objects::XDP_FLOOR).unwrap();
    let prog: &mut Xdp = pass.program_mut("ringlb_pass").unwrap().try_into().unwrap();
    prog.load().unwrap();
    in_netns(ns, || prog.attach(dev, XdpMode::Driver).unwrap());
    pass
}

/// A line server in `ns` on `vip:80`, answering every line with `name` (which pod).
pub(crate) fn serve(ns: String, vip: std::net::IpAddr, name: &'static str) {
    use std::io::{BufRead, BufReader, Write};
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        enter_netns(&ns);
        let l = std::net::TcpListener::bind((vip, 80)).expect("bind VIP:80");
        tx.send(()).unwrap();
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut w = c.try_clone().unwrap();
                for line in BufReader::new(c).lines() {
                    if line.is_err() || w.write_all(format!("{name}\n").as_bytes()).is_err() {
                        break;
                    }
                }
            });
        }
    });
    rx.recv_timeout(std::time::Duration::from_secs(5))
        .expect("server up");
}

/// The lab's BPF around the edge: `ringlb_pass` on the ToR's side of the edge link
/// (`ve-e`; veth XDP_TX needs a program on the peer) and the tc decap on each pod's
/// eth0 ingress. Keep the returned objects alive for the test's duration.
pub(crate) fn attach_lab_programs(tor: &str, pods: [&str; 2]) -> Vec<aya::Ebpf> {
    let mut objs = vec![attach_pass(tor, "ve-e")];
    objs.extend(pods.into_iter().map(attach_decap));
    objs
}

/// The tc decap (`ringlb_decap`) on `eth0` ingress of pod namespace `ns`. Keep
/// the object alive.
pub(crate) fn attach_decap(ns: &str) -> aya::Ebpf {
    use aya::programs::{SchedClassifier, TcAttachType, tc};
    let mut d = aya::Ebpf::load(ringlb_testkit::objects::TC_DECAP).unwrap();
    let prog: &mut SchedClassifier = d.program_mut("ringlb_decap").unwrap().try_into().unwrap();
    prog.load().unwrap();
    in_netns(ns, || {
        let _ = tc::qdisc_add_clsact("eth0");
        prog.attach("eth0", TcAttachType::Ingress).unwrap();
    });
    d
}

/// A UDP server in `ns` on `vip:port`, answering every datagram with `name`.
pub(crate) fn serve_udp(ns: String, vip: std::net::IpAddr, port: u16, name: &'static str) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        enter_netns(&ns);
        let s = std::net::UdpSocket::bind((vip, port)).expect("bind VIP UDP");
        tx.send(()).unwrap();
        let mut buf = [0u8; 1500];
        while let Ok((_, from)) = s.recv_from(&mut buf) {
            let _ = s.send_to(name.as_bytes(), from);
        }
    });
    rx.recv_timeout(std::time::Duration::from_secs(5))
        .expect("UDP server up");
}
