//! Client flows with chosen source ports, from inside a namespace.
//!
//! The kernel's `mh` scheduler (with `mh-port`) picks a real server from the
//! client's source address and port, so a flow is named by its source port: the
//! same port asked again is the same flow. Each connection is made in the client
//! namespace (the socket stays there), bound to its port, and closed with an RST
//! (`SO_LINGER` 0), so no TIME_WAIT keeps the port from being used again and the
//! edge's IPVS entry goes to CLOSE, which IPVS reschedules on the next SYN.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

/// Which pod answered each flow (source port -> pod name).
pub type FlowMap = BTreeMap<u16, String>;

/// A TCP connection from `src` to `dst` made in the current thread's namespace.
fn connect_from(src: SocketAddrV4, dst: SocketAddrV4, timeout: Duration) -> io::Result<TcpStream> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.bind(&SocketAddr::V4(src).into())
        .map_err(|e| io::Error::new(e.kind(), format!("bind {src}: {e}")))?;
    s.connect_timeout(&SocketAddr::V4(dst).into(), timeout)
        .map_err(|e| io::Error::new(e.kind(), format!("connect {src} -> {dst}: {e}")))?;
    Ok(s.into())
}

/// Closes `s` with an RST: no TIME_WAIT on either side.
fn reset(s: TcpStream) {
    let _ = Socket::from(s).set_linger(Some(Duration::ZERO));
}

/// `GET path` from `src_port` of `client` in namespace `ns` to `dst`; the body.
pub fn get(
    ns: &str,
    client: Ipv4Addr,
    src_port: u16,
    dst: SocketAddrV4,
    path: &str,
    timeout: Duration,
) -> io::Result<String> {
    let src = SocketAddrV4::new(client, src_port);
    let mut s = ringlb_ops::netns::in_named(ns, || connect_from(src, dst, timeout))?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", dst.ip()).as_bytes())?;
    let mut raw = Vec::new();
    let got = s.read_to_end(&mut raw);
    reset(s);
    got?;
    let text = String::from_utf8_lossy(&raw);
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.0 200") => Ok(body.to_string()),
        _ => Err(io::Error::other(format!(
            "port {src_port}: not a 200 answer: {text:?}"
        ))),
    }
}

/// The pod that sent every line of `body`, if exactly one did.
pub fn single_pod(body: &str, lines: usize) -> Option<String> {
    let names: Vec<&str> = body
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let first = *names.first()?;
    (names.len() == lines && names.iter().all(|n| *n == first)).then(|| first.to_string())
}

/// Flows whose pod differs between `before` and `after` (port, before, after); a
/// flow missing from `after` counts as moved to `"(none)"`.
pub fn moved(before: &FlowMap, after: &FlowMap) -> Vec<(u16, String, String)> {
    before
        .iter()
        .filter_map(|(port, b)| {
            let a = after.get(port).cloned().unwrap_or_else(|| "(none)".into());
            (a != *b).then(|| (*port, b.clone(), a))
        })
        .collect()
}

/// Flows per pod.
pub fn per_pod(m: &FlowMap) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in m.values() {
        *out.entry(p.clone()).or_default() += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: &[(u16, &str)]) -> FlowMap {
        v.iter().map(|(p, n)| (*p, n.to_string())).collect()
    }

    #[test]
    fn moved_lists_flows_whose_pod_changed_or_vanished() {
        let b = map(&[(1, "pod1"), (2, "pod3"), (3, "pod2"), (4, "pod3")]);
        let a = map(&[(1, "pod1"), (2, "pod2"), (3, "pod2")]);
        assert_eq!(
            moved(&b, &a),
            [
                (2, "pod3".to_string(), "pod2".to_string()),
                (4, "pod3".to_string(), "(none)".to_string())
            ]
        );
        assert!(moved(&b, &b).is_empty());
        assert_eq!(per_pod(&b)["pod3"], 2);
    }

    #[test]
    fn a_body_is_whole_from_one_pod_or_not() {
        let whole = "pod2 0000\npod2 0001\npod2 0002\n";
        assert_eq!(single_pod(whole, 3).as_deref(), Some("pod2"));
        assert_eq!(single_pod(whole, 4), None, "cut short");
        assert_eq!(single_pod("pod2 0000\npod1 0001\n", 2), None, "two pods");
        assert_eq!(single_pod("", 0), None);
    }
}
