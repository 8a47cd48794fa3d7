//! Shared helpers for the XDP tests (the generic ones are `ringlb_testkit::netns`).
#![allow(dead_code)]

pub mod fixture;

pub use ringlb_testkit::netns::*;

/// A line server in `ns` on `vip:80`, answering every line with `name` (which pod).
pub fn serve(ns: String, vip: std::net::IpAddr, name: &'static str) {
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
pub fn attach_lab_programs(tor: &str, pods: [&str; 2]) -> Vec<aya::Ebpf> {
    use aya::programs::{SchedClassifier, TcAttachType, Xdp, XdpMode, tc};
    let mut pass = aya::Ebpf::load(ringlb_testkit::objects::XDP_FLOOR).unwrap();
    let prog: &mut Xdp = pass.program_mut("ringlb_pass").unwrap().try_into().unwrap();
    prog.load().unwrap();
    in_netns(tor, || prog.attach("ve-e", XdpMode::Driver).unwrap());
    let mut objs = vec![pass];
    for ns in pods {
        let mut d = aya::Ebpf::load(ringlb_testkit::objects::TC_DECAP).unwrap();
        let prog: &mut SchedClassifier = d.program_mut("ringlb_decap").unwrap().try_into().unwrap();
        prog.load().unwrap();
        in_netns(ns, || {
            let _ = tc::qdisc_add_clsact("eth0");
            prog.attach("eth0", TcAttachType::Ingress).unwrap();
        });
        objs.push(d);
    }
    objs
}
