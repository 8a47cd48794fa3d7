//! The BFD sockets: one receive socket per address family on UDP 3784 shared by all
//! sessions (the [`Hub`]), and one transmit socket per session with a source port in
//! 49152..65535 and TTL / hop limit 255 (RFC 5881 §4, §5).
//!
//! The receive task drops, counts and logs every packet that is not for a live
//! session: TTL other than 255 (the GTSM check of RFC 5881 §5), a packet the codec
//! rejects, a discriminator we never handed out, a source address that does not match
//! the session. Nothing a peer sends can stop the task.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::metrics::BfdMetrics;
use super::packet::{self, Control, DecodeError};

/// Where received packets go: the session's channel, by discriminator.
struct Entry {
    peer: IpAddr,
    tx: mpsc::Sender<Control>,
}

#[derive(Default)]
struct Table {
    by_disc: HashMap<u32, Entry>,
    by_peer: HashMap<IpAddr, u32>,
}

/// The shared receive side.
pub struct Hub {
    table: Arc<Mutex<Table>>,
    tasks: Vec<JoinHandle<()>>,
    port: u16,
    rng: Mutex<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Hub {
    /// Bind UDP `port` (3784; 0 picks one, for tests) on IPv4, and IPv6 when the host
    /// has it, and start the receive tasks.
    pub fn start(port: u16, metrics: BfdMetrics) -> io::Result<Hub> {
        let v4 = bind_rx(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))?;
        let port = v4.local_addr()?.port();
        let table: Arc<Mutex<Table>> = Arc::default();
        let mut tasks = vec![tokio::spawn(rx_loop(v4, table.clone(), metrics.clone()))];
        match bind_rx(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)) {
            Ok(v6) => tasks.push(tokio::spawn(rx_loop(v6, table.clone(), metrics))),
            Err(e) => tracing::warn!(error = %e, port, "no IPv6 BFD socket; IPv6 peers get no BFD"),
        }
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            ^ u64::from(std::process::id());
        Ok(Hub {
            table,
            tasks,
            port,
            rng: Mutex::new(seed | 1),
        })
    }

    /// The local UDP port packets are received on.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn random(&self) -> u64 {
        let mut x = lock(&self.rng);
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// Register a session for `peer`: a fresh, unused, non-zero discriminator and the
    /// channel its packets arrive on.
    pub fn register(&self, peer: IpAddr) -> (u32, mpsc::Receiver<Control>) {
        self.register_with(peer, None)
    }

    /// [`Hub::register`] with `want` as the discriminator when it is free (a
    /// session resumed from an earlier process keeps its own).
    pub fn register_with(&self, peer: IpAddr, want: Option<u32>) -> (u32, mpsc::Receiver<Control>) {
        let (tx, rx) = mpsc::channel(64);
        let mut t = lock(&self.table);
        let disc = match want {
            Some(d) if d != 0 && !t.by_disc.contains_key(&d) => d,
            _ => loop {
                let d = self.random() as u32;
                if d != 0 && !t.by_disc.contains_key(&d) {
                    break d;
                }
            },
        };
        t.by_disc.insert(disc, Entry { peer, tx });
        t.by_peer.insert(peer, disc);
        (disc, rx)
    }

    pub fn unregister(&self, disc: u32) {
        let mut t = lock(&self.table);
        if let Some(e) = t.by_disc.remove(&disc)
            && t.by_peer.get(&e.peer) == Some(&disc)
        {
            t.by_peer.remove(&e.peer);
        }
    }

    /// A random source port in 49152..=65535 (RFC 5881 §4).
    pub fn source_port(&self) -> u16 {
        49152 + (self.random() % 16384) as u16
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn bind_rx(addr: SocketAddr) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
        setsockopt_int(
            s.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVHOPLIMIT,
            1,
        )?;
    } else {
        setsockopt_int(s.as_raw_fd(), libc::IPPROTO_IP, libc::IP_RECVTTL, 1)?;
    }
    s.set_reuse_address(true)?;
    // Room for bursts (many sessions, or garbage) without kernel drops we cannot count.
    let _ = s.set_recv_buffer_size(1 << 20);
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    UdpSocket::from_std(s.into())
}

/// The transmit socket of one session: `src` (or any address) and a random port of
/// 49152..65535 (`port` first when given: a resumed session's), TTL 255,
/// connected to the peer.
pub fn tx_socket(
    src: Option<IpAddr>,
    peer: SocketAddr,
    hub: &Hub,
    port: Option<u16>,
) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let ip = src.unwrap_or(if peer.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    });
    let mut last = None;
    for i in 0..64 {
        let p = match port {
            Some(p) if i == 0 => p,
            _ => hub.source_port(),
        };
        let s = Socket::new(Domain::for_address(peer), Type::DGRAM, Some(Protocol::UDP))?;
        if peer.is_ipv6() {
            s.set_only_v6(true)?;
            s.set_unicast_hops_v6(255)?;
        } else {
            s.set_ttl_v4(255)?;
        }
        s.set_nonblocking(true)?;
        match s.bind(&SocketAddr::new(ip, p).into()) {
            Ok(()) => {
                s.connect(&peer.into())?;
                return UdpSocket::from_std(s.into());
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free source port")))
}

async fn rx_loop(sock: UdpSocket, table: Arc<Mutex<Table>>, metrics: BfdMetrics) {
    let fd = sock.as_raw_fd();
    let mut buf = [0u8; 512];
    let mut last_warn: Option<Instant> = None;
    loop {
        let r = sock
            .async_io(Interest::READABLE, || recv_with_ttl(fd, &mut buf))
            .await;
        let (n, from, ttl) = match r {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "BFD receive failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let from_ip = from.ip().to_canonical();
        let res = match ttl {
            Some(255) => packet::decode(&buf[..n]).map_err(Discard::Bad),
            Some(t) => Err(Discard::Bad(DecodeError::Ttl(t))),
            None => Err(Discard::Bad(DecodeError::Ttl(0))),
        }
        .and_then(|c| deliver(&table, from_ip, c));
        if let Err(d) = res {
            metrics.drop(d.label());
            // A flood of garbage must not flood the log: one warning a second.
            let now = Instant::now();
            if last_warn.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
                last_warn = Some(now);
                tracing::warn!(from = %from, bytes = n, reason = %d, "dropped BFD packet");
            } else {
                tracing::debug!(from = %from, bytes = n, reason = %d, "dropped BFD packet");
            }
        }
    }
}

#[derive(Debug)]
enum Discard {
    Bad(DecodeError),
    UnknownSession(u32),
    WrongSource(IpAddr),
    Overload,
}

impl Discard {
    fn label(&self) -> &'static str {
        match self {
            Discard::Bad(e) => e.metric_label(),
            Discard::UnknownSession(_) => "unknown_session",
            Discard::WrongSource(_) => "wrong_source",
            Discard::Overload => "overload",
        }
    }
}

impl std::fmt::Display for Discard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Discard::Bad(e) => write!(f, "{e}"),
            Discard::UnknownSession(0) => write!(f, "no BFD session with this peer"),
            Discard::UnknownSession(d) => write!(f, "your discriminator {d} is not ours"),
            Discard::WrongSource(p) => write!(f, "session belongs to peer {p}"),
            Discard::Overload => write!(f, "session queue full"),
        }
    }
}

/// §6.8.6: a non-zero Your Discriminator selects the session; zero, the source
/// address (the peer does not know ours yet).
fn deliver(table: &Mutex<Table>, from: IpAddr, c: Control) -> Result<(), Discard> {
    let t = lock(table);
    let disc = match c.your_disc {
        0 => *t.by_peer.get(&from).ok_or(Discard::UnknownSession(0))?,
        d => d,
    };
    let e = t.by_disc.get(&disc).ok_or(Discard::UnknownSession(disc))?;
    if e.peer != from {
        return Err(Discard::WrongSource(e.peer));
    }
    e.tx.try_send(c).map_err(|_| Discard::Overload)
}

#[allow(unsafe_code)] // setsockopt(2) with an int option socket2 does not offer
fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `fd` is an open socket; the option value is a plain c_int on the stack.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// recvmsg(2) that also returns the received TTL / hop limit (IP_RECVTTL,
/// IPV6_RECVHOPLIMIT), which std and tokio do not expose.
#[allow(unsafe_code)] // recvmsg(2) with a control buffer, and reading its cmsgs
fn recv_with_ttl(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Option<u8>)> {
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut addr as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: every pointer in `msg` points at a live local buffer of the given size.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut ttl = None;
    // SAFETY: the CMSG_* macros walk the control buffer the kernel just filled, within
    // `msg_controllen`; the data of IP_TTL / IPV6_HOPLIMIT is one c_int.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let h = &*c;
            if (h.cmsg_level == libc::IPPROTO_IP && h.cmsg_type == libc::IP_TTL)
                || (h.cmsg_level == libc::IPPROTO_IPV6 && h.cmsg_type == libc::IPV6_HOPLIMIT)
            {
                let v: libc::c_int = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                ttl = Some(v.clamp(0, 255) as u8);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let from = match i32::from(addr.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (family AF_INET).
            let a: libc::sockaddr_in = unsafe {
                std::ptr::read_unaligned((&addr as *const libc::sockaddr_storage).cast())
            };
            SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 (family AF_INET6).
            let a: libc::sockaddr_in6 = unsafe {
                std::ptr::read_unaligned((&addr as *const libc::sockaddr_storage).cast())
            };
            SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            ))
        }
        f => return Err(io::Error::other(format!("address family {f}"))),
    };
    Ok((n as usize, from, ttl))
}
