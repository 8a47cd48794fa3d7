//! Shared by the real-IPVS tests (`ipvs_kernel`, `ipvs_netns`; `guard_netns` uses
//! the namespace helpers and the line server): the skip rule, a
//! datapath opened inside a namespace, the independent read-back with `ipvsadm`,
//! and the namespace lab:
//!
//! ```text
//!  client 10.203.1.2 --- tor 10.203.1.1 / br0 10.203.0.1 (one L2)
//!                                          |-- edge1 10.203.0.11  IPVS, VIP on lo
//!                                          |-- edge2 10.203.0.12  IPVS, VIP on lo
//!                                          |-- pod1 10.203.0.21   VIP on lo, tunl0 up
//!                                          |-- pod2 10.203.0.22
//!                                          `-- pod3 10.203.0.23
//! ```
//! The ToR routes the VIP to one edge (BGP's job in production). IPVS sends each
//! connection to a pod by IPIP (the pod's `tunl0` decapsulates) or by direct
//! routing (the pods share the edge's L2); the pod answers from the VIP straight
//! to the client through the ToR (DSR).
#![allow(dead_code)]

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{IpAddr, SocketAddr, TcpStream},
    path::Path,
    process::Command,
    time::Duration,
};

use ringlb_datapath::{DesiredState, Proto, ServiceEntry, Vip};
use ringlb_ipvs::{Config, IpvsDatapath, kernel::netlink::NetlinkKernel};
pub(crate) use ringlb_testkit::netns::{Netns, in_netns, is_root, nsx, sh};
pub(crate) use ringlb_testkit::pod::ask;

pub(crate) const VIP: &str = "10.203.100.1";
pub(crate) const PODS: [&str; 3] = ["10.203.0.21", "10.203.0.22", "10.203.0.23"];
pub(crate) const EDGES: [&str; 2] = ["10.203.0.11", "10.203.0.12"];

pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Returns from the calling test `$test` when [`ipvs_or_skip`] says it cannot run.
#[macro_export]
macro_rules! require_ipvs {
    ($test:literal) => {
        if !ipvs_support::ipvs_or_skip($test) {
            return;
        }
    };
}

/// True when this kernel has IPVS with the `mh` scheduler (loading the modules
/// if it can); false after saying loudly why the test is skipped.
pub(crate) fn ipvs_or_skip(test: &str) -> bool {
    if !is_root() {
        eprintln!("SKIP: {test}: needs root (network namespaces, IPVS)");
        return false;
    }
    let mut why = String::new();
    for m in ["ip_vs", "ip_vs_mh"] {
        match Command::new("modprobe").arg(m).output() {
            Ok(o) if !o.status.success() => {
                why.push_str(String::from_utf8_lossy(&o.stderr).trim());
                why.push(' ');
            }
            Err(e) => why.push_str(&format!("modprobe: {e} ")),
            Ok(_) => {}
        }
    }
    if !Path::new("/proc/net/ip_vs").exists() {
        eprintln!(
            "SKIP: {test}: THIS KERNEL HAS NO IPVS (/proc/net/ip_vs absent; {}). \
             The kernel matrix runs it in Debian kernels that have IPVS: \
             cargo run -p ringlb-kernels --bin kernel-matrix -- -k 6.1 -t ipvs_kernel -t ipvs_netns",
            why.trim()
        );
        return false;
    }
    true
}

/// An IPVS datapath whose netlink sockets live in namespace `ns`.
pub(crate) fn datapath_in(ns: &str, cfg: Config) -> IpvsDatapath<NetlinkKernel> {
    in_netns(ns, || {
        let k = NetlinkKernel::open().expect("open IPVS netlink in the namespace");
        IpvsDatapath::new(k, cfg).expect("read what IPVS holds")
    })
}

/// A seam service on `vip`: every backend in the ring (weight 1) except those in
/// `draining` (weight 0).
pub(crate) fn entry(vip: &Vip, backends: &[&str], draining: &[&str]) -> ServiceEntry {
    let ring: Vec<u32> = backends
        .iter()
        .enumerate()
        .filter(|(_, b)| !draining.contains(b))
        .map(|(i, _)| i as u32)
        .collect();
    let addrs = backends.iter().map(|b| ip(b)).collect();
    ServiceEntry::new(vip, addrs, ring).unwrap()
}

pub(crate) fn tcp(addr: &str, port: u16) -> Vip {
    Vip {
        addr: ip(addr),
        port,
        proto: Proto::Tcp,
    }
}

pub(crate) fn udp(addr: &str, port: u16) -> Vip {
    Vip {
        addr: ip(addr),
        port,
        proto: Proto::Udp,
    }
}

/// One service of the VIP, TCP port 80.
pub(crate) fn one_service(backends: &[&str], draining: &[&str]) -> DesiredState {
    let v = tcp(VIP, 80);
    DesiredState {
        services: [(v, entry(&v, backends, draining))].into(),
    }
}

/// One virtual service as `ipvsadm -Ln` prints it: its line, and per real server
/// (in the kernel's list order) address:port, forwarding and weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AdmService {
    pub line: String,
    pub dests: Vec<(String, String, u32)>,
}

/// `ipvsadm -Ln --nosort` in `ns` (ipvsadm sorts real servers by address
/// unless told not to), by service ("TCP 10.203.100.1:80").
pub(crate) fn ipvsadm(ns: &str) -> BTreeMap<String, AdmService> {
    let out = nsx(ns, &["ipvsadm", "-Ln", "--nosort"]);
    let mut services = BTreeMap::new();
    let mut cur: Option<AdmService> = None;
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if matches!(w.first(), Some(&"TCP" | &"UDP" | &"SCTP")) {
            if let Some(s) = cur.take() {
                services.insert(format!("{} {}", w_key(&s.line).0, w_key(&s.line).1), s);
            }
            cur = Some(AdmService {
                line: w.join(" "),
                dests: Vec::new(),
            });
        } else if w.first() == Some(&"->")
            && w.len() >= 4
            && w[1] != "RemoteAddress:Port"
            && let Some(s) = cur.as_mut()
        {
            s.dests
                .push((w[1].to_string(), w[2].to_string(), w[3].parse().unwrap()));
        }
    }
    if let Some(s) = cur.take() {
        services.insert(format!("{} {}", w_key(&s.line).0, w_key(&s.line).1), s);
    }
    services
}

fn w_key(line: &str) -> (String, String) {
    let mut w = line.split_whitespace();
    (
        w.next().unwrap_or_default().to_string(),
        w.next().unwrap_or_default().to_string(),
    )
}

/// The addresses on `lo` in `ns` (`ip -o addr show dev lo`), as "addr/prefix".
pub(crate) fn lo_addrs(ns: &str) -> Vec<String> {
    nsx(ns, &["ip", "-o", "addr", "show", "dev", "lo"])
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let at = w.iter().position(|x| *x == "inet" || *x == "inet6")?;
            Some(w.get(at + 1)?.to_string())
        })
        .collect()
}

/// The lab's namespaces (deleted on drop, with whatever runs in them).
pub(crate) struct Lab {
    pub client: Netns,
    pub tor: Netns,
    pub edges: Vec<Netns>,
    pub pods: Vec<Netns>,
}

/// A veth pair between `a_ns` and `b_ns`, both ends up, each with its address if given.
pub(crate) fn veth(
    a_ns: &str,
    a: &str,
    a_ip: Option<&str>,
    b_ns: &str,
    b: &str,
    b_ip: Option<&str>,
) {
    sh(&[
        "ip", "-n", a_ns, "link", "add", a, "type", "veth", "peer", "name", b, "netns", b_ns,
    ]);
    for (ns, dev, addr) in [(a_ns, a, a_ip), (b_ns, b, b_ip)] {
        if let Some(addr) = addr {
            sh(&["ip", "-n", ns, "addr", "add", addr, "dev", dev]);
        }
        sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
    }
}

fn sysctl(ns: &str, kv: &str) {
    nsx(ns, &["sysctl", "-qw", kv]);
}

impl Lab {
    /// The picture at the top, with namespaces named `rlbv<pid><tag>...`.
    pub(crate) fn new(tag: &str) -> Lab {
        let p = format!("rlbv{}{tag}", std::process::id());
        let lab = Lab {
            client: Netns::new(&format!("{p}c")),
            tor: Netns::new(&format!("{p}t")),
            edges: (1..=2).map(|i| Netns::new(&format!("{p}e{i}"))).collect(),
            pods: (1..=3).map(|i| Netns::new(&format!("{p}p{i}"))).collect(),
        };
        let t = lab.tor.0.as_str();
        let c = lab.client.0.as_str();
        veth(
            c,
            "eth0",
            Some("10.203.1.2/24"),
            t,
            "ve-c",
            Some("10.203.1.1/24"),
        );
        sh(&["ip", "-n", t, "link", "add", "br0", "type", "bridge"]);
        sh(&["ip", "-n", t, "addr", "add", "10.203.0.1/24", "dev", "br0"]);
        sh(&["ip", "-n", t, "link", "set", "br0", "up"]);
        let hosts = lab
            .edges
            .iter()
            .zip(EDGES)
            .map(|(n, a)| (n, a, "e"))
            .chain(lab.pods.iter().zip(PODS).map(|(n, a)| (n, a, "p")));
        for (i, (ns, addr, kind)) in hosts.enumerate() {
            let port = format!("ve-{kind}{i}");
            veth(&ns.0, "eth0", Some(&format!("{addr}/24")), t, &port, None);
            sh(&["ip", "-n", t, "link", "set", &port, "master", "br0"]);
        }
        for ns in std::iter::once(&lab.client)
            .chain(&lab.edges)
            .chain(&lab.pods)
        {
            let gw = if ns.0 == lab.client.0 {
                "10.203.1.1"
            } else {
                "10.203.0.1"
            };
            sh(&["ip", "-n", &ns.0, "route", "add", "default", "via", gw]);
        }
        sysctl(t, "net.ipv4.ip_forward=1");
        for ns in std::iter::once(&lab.tor)
            .chain(std::iter::once(&lab.client))
            .chain(&lab.edges)
            .chain(&lab.pods)
        {
            // DSR: replies come back on another path than the VIP's route
            sysctl(&ns.0, "net.ipv4.conf.all.rp_filter=0");
            sysctl(&ns.0, "net.ipv4.conf.default.rp_filter=0");
        }
        for ns in &lab.pods {
            let n = ns.0.as_str();
            sh(&[
                "ip",
                "-n",
                n,
                "addr",
                "add",
                &format!("{VIP}/32"),
                "dev",
                "lo",
            ]);
            // the VIP is the edges' on this L2: never answer ARP for it
            sysctl(n, "net.ipv4.conf.all.arp_ignore=1");
            sysctl(n, "net.ipv4.conf.all.arp_announce=2");
            // IPIP from the edge arrives on the namespace's fallback device
            sh(&["ip", "-n", n, "link", "set", "tunl0", "up"]);
            sysctl(n, "net.ipv4.conf.tunl0.rp_filter=0");
            sysctl(n, "net.ipv4.conf.eth0.rp_filter=0");
        }
        lab.route_vip_to(0);
        lab
    }

    /// The ToR sends the VIP to edge `i` (0 or 1).
    pub(crate) fn route_vip_to(&self, i: usize) {
        sh(&[
            "ip",
            "-n",
            &self.tor.0,
            "route",
            "replace",
            &format!("{VIP}/32"),
            "via",
            EDGES[i],
        ]);
    }

    /// Every pod serves a line protocol on VIP:80: each line in, its name out.
    pub(crate) fn serve(&self) {
        for (i, ns) in self.pods.iter().enumerate() {
            serve(ns.0.clone(), ip(VIP), format!("pod{}", i + 1));
        }
    }

    /// Counter of `dev` in `ns` (`/sys/class/net/<dev>/statistics/<name>`).
    pub(crate) fn stat(ns: &str, dev: &str, name: &str) -> u64 {
        nsx(
            ns,
            &["cat", &format!("/sys/class/net/{dev}/statistics/{name}")],
        )
        .trim()
        .parse()
        .unwrap()
    }
}

/// A line server on `vip`:80 in `ns`: each line in, `name` out (a thread that
/// lives until the namespace goes).
pub(crate) fn serve(ns: String, vip: IpAddr, name: String) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        ringlb_testkit::netns::enter_netns(&ns);
        let l = std::net::TcpListener::bind((vip, 80)).expect("bind VIP:80");
        tx.send(()).unwrap();
        for c in l.incoming().flatten() {
            let name = name.clone();
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
    rx.recv_timeout(Duration::from_secs(5)).expect("server up");
}

/// A connection to VIP:80 (from source port `sport` if given, reset on drop so
/// the port is free again at once).
pub(crate) fn connect(sport: Option<u16>) -> std::io::Result<BufReader<TcpStream>> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    if let Some(p) = sport {
        s.set_reuse_address(true)?;
        s.bind(&SocketAddr::from(([0, 0, 0, 0], p)).into())?;
        s.set_linger(Some(Duration::ZERO))?;
    }
    s.connect_timeout(&SocketAddr::new(ip(VIP), 80).into(), Duration::from_secs(6))?;
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(6)))?;
    Ok(BufReader::new(s))
}

/// One short connection: connect, ask, close. The pod that answered.
pub(crate) fn one_request(sport: Option<u16>) -> std::io::Result<String> {
    let mut c = connect(sport)?;
    ask(&mut c)
}
