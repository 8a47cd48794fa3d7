//! Traffic that a fault must not break, from the client's namespace: long-lived HTTP/1.1
//! keep-alive connections to a VIP, each asking agnhost's `/hostname` again and again,
//! and a loop of new connections. Sockets are made inside the client's namespace and
//! then used from ordinary threads.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::lab::{Error, Result};

/// One keep-alive connection: the pod that answered first, and whether it broke.
struct Conn {
    reader: BufReader<TcpStream>,
    pod: String,
}

/// `GET /hostname` on a kept-alive connection; the body (the pod's name).
fn ask(reader: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    reader
        .get_mut()
        .write_all(b"GET /hostname HTTP/1.1\r\nHost: vip\r\n\r\n")?;
    let mut len = None;
    let mut status = String::new();
    reader.read_line(&mut status)?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!("status {status:?}")));
    }
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("closed in the headers"));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse::<usize>().ok();
        }
    }
    let len = len.ok_or_else(|| std::io::Error::other("no Content-Length"))?;
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// `n` keep-alive connections from namespace `netns` to `vip:port`.
pub struct KeepAlive {
    conns: Vec<Conn>,
}

/// What a run of [`KeepAlive::rounds`] saw.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub requests: u64,
    /// Connections that failed a request (reset, closed, timed out) or that another pod
    /// answered.
    pub broken: usize,
    pub first_error: Option<String>,
    /// The pods of the broken connections (one entry per connection).
    pub broken_pods: Vec<String>,
}

impl KeepAlive {
    pub fn open(netns: &str, vip: IpAddr, port: u16, n: usize) -> Result<KeepAlive> {
        let addr = SocketAddr::new(vip, port);
        let streams = ringlb_ops::netns::in_named(netns, || {
            (0..n)
                .map(|_| {
                    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
                    s.set_read_timeout(Some(Duration::from_secs(3)))?;
                    s.set_write_timeout(Some(Duration::from_secs(3)))?;
                    Ok(s)
                })
                .collect::<std::io::Result<Vec<_>>>()
        })
        .map_err(Error::io(format!(
            "opening {n} connections to {addr} in {netns}"
        )))?;
        let mut conns = Vec::new();
        for s in streams {
            let mut reader = BufReader::new(s);
            let pod = ask(&mut reader).map_err(Error::io(format!("first request to {addr}")))?;
            conns.push(Conn { reader, pod });
        }
        Ok(KeepAlive { conns })
    }

    /// The pods the connections landed on, and how many on each.
    pub fn pods(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for c in &self.conns {
            *m.entry(c.pod.clone()).or_insert(0) += 1;
        }
        m
    }

    /// Asks on every connection, round after round every `every`, until `stop` is set;
    /// a connection that fails once is broken and not asked again.
    pub fn rounds(&mut self, stop: &AtomicBool, every: Duration) -> Outcome {
        let mut out = Outcome::default();
        let mut alive = vec![true; self.conns.len()];
        while !stop.load(Ordering::SeqCst) {
            for (c, ok) in self.conns.iter_mut().zip(alive.iter_mut()) {
                if !*ok {
                    continue;
                }
                out.requests += 1;
                let err = match ask(&mut c.reader) {
                    Ok(pod) if pod == c.pod => None,
                    Ok(pod) => Some(format!("answered by {pod}, not {}", c.pod)),
                    Err(e) => Some(e.to_string()),
                };
                if let Some(e) = err {
                    *ok = false;
                    out.broken += 1;
                    out.broken_pods.push(c.pod.clone());
                    out.first_error.get_or_insert(e);
                }
            }
            std::thread::sleep(every);
        }
        out
    }
}

/// New connections in a loop (`GET /hostname`, 2 s timeout each) until `stop`: the
/// failures and the total.
pub fn request_loop(
    netns: &str,
    vip: IpAddr,
    port: u16,
    stop: Arc<AtomicBool>,
    every: Duration,
) -> std::thread::JoinHandle<(u64, u64, Option<String>)> {
    let netns = netns.to_string();
    std::thread::spawn(move || {
        let (total, failed) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut first = None;
        let addr = SocketAddr::new(vip, port);
        while !stop.load(Ordering::SeqCst) {
            total.fetch_add(1, Ordering::SeqCst);
            let r = ringlb_ops::netns::in_named(&netns, || {
                let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
                s.set_read_timeout(Some(Duration::from_secs(2)))?;
                Ok(s)
            })
            .and_then(|s| ask(&mut BufReader::new(s)));
            if let Err(e) = r {
                failed.fetch_add(1, Ordering::SeqCst);
                first.get_or_insert(e.to_string());
            }
            std::thread::sleep(every);
        }
        (total.into_inner(), failed.into_inner(), first)
    })
}
