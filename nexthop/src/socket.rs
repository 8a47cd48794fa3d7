//! rtnetlink sockets: one for requests (`Conn`), one subscribed to the route,
//! neighbour and link groups (`Subscription`). Either can live in a named network
//! namespace: a short-lived thread enters `/var/run/netns/NAME`, creates the socket
//! and hands it back; a socket stays bound to the namespace it was created in.

use std::fs::File;
use std::io;
use std::net::{Ipv6Addr, SocketAddrV6, UdpSocket};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use netlink_sys::{Socket, protocols::NETLINK_ROUTE};

use super::filter::{Change, Filter};
use super::in_use::NextHopsInUse;
use super::rtnl::{self, Reply};

/// How long one request waits for the kernel's answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a subscription's thread looks at its stop flag.
const POLL: Duration = Duration::from_millis(100);
/// Receive buffer of the subscription: a burst of neighbour/route notifications
/// (a link flap) fits before the kernel reports ENOBUFS.
const SUBSCRIPTION_RCVBUF: usize = 4 << 20;

/// Errors of the netlink layer.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("network namespace {name:?}: {reason}")]
    Netns { name: String, reason: String },
    #[error("netlink {op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("netlink {op}: the kernel answered {}", io::Error::from_raw_os_error(-*errno))]
    Kernel { op: &'static str, errno: i32 },
    #[error("netlink {op}: {reason}")]
    Decode { op: &'static str, reason: String },
    #[error("netlink {op}: no answer within {REQUEST_TIMEOUT:?}")]
    Timeout { op: &'static str },
}

impl NetlinkError {
    /// -errno of a kernel NACK (e.g. -ENOENT for a missing neighbour).
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

fn io_err(op: &'static str) -> impl Fn(io::Error) -> NetlinkError {
    move |source| NetlinkError::Io { op, source }
}

fn netns_path(name: &str) -> Result<PathBuf, NetlinkError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(NetlinkError::Netns {
            name: name.into(),
            reason: "not a namespace name (as in `ip netns add NAME`)".into(),
        });
    }
    Ok(PathBuf::from("/var/run/netns").join(name))
}

fn netlink_socket() -> Result<Socket, NetlinkError> {
    let mut s = Socket::new(NETLINK_ROUTE).map_err(io_err("socket"))?;
    s.bind_auto().map_err(io_err("bind"))?;
    Ok(s)
}

/// A NETLINK_ROUTE socket, created in `netns` (a name under /var/run/netns) or in the
/// caller's namespace.
pub(crate) fn open(netns: Option<&str>) -> Result<Socket, NetlinkError> {
    in_netns(netns, netlink_socket)
}

/// Runs `make` (which creates sockets) in `netns`, on a thread made for it.
fn in_netns<T: Send>(
    netns: Option<&str>,
    make: impl FnOnce() -> Result<T, NetlinkError> + Send,
) -> Result<T, NetlinkError> {
    let Some(name) = netns else {
        return make();
    };
    let path = netns_path(name)?;
    let ns = File::open(&path).map_err(|e| NetlinkError::Netns {
        name: name.into(),
        reason: format!("{}: {e}", path.display()),
    })?;
    std::thread::scope(|s| {
        s.spawn(|| {
            ringlb_ops::netns::setns_net(ns.as_fd()).map_err(|e| NetlinkError::Netns {
                name: name.into(),
                reason: format!("setns: {e}"),
            })?;
            make()
        })
        .join()
        .unwrap_or_else(|_| {
            Err(NetlinkError::Netns {
                name: name.into(),
                reason: "namespace thread panicked".into(),
            })
        })
    })
}

fn set_timeout(s: &Socket, t: Duration) -> Result<(), NetlinkError> {
    socket2::SockRef::from(s)
        .set_read_timeout(Some(t))
        .map_err(io_err("SO_RCVTIMEO"))
}

/// A request/answer rtnetlink connection.
pub(crate) struct Conn {
    sock: Socket,
    /// An unbound UDP socket of the same namespace, for `nudge`.
    udp6: Option<UdpSocket>,
    seq: u32,
    buf: Vec<u8>,
}

impl Conn {
    pub(crate) fn open(netns: Option<&str>) -> Result<Self, NetlinkError> {
        let (sock, udp6) = in_netns(netns, || {
            // no IPv6 in the namespace: no IPv6 next hops to nudge either
            Ok((netlink_socket()?, UdpSocket::bind("[::]:0").ok()))
        })?;
        set_timeout(&sock, REQUEST_TIMEOUT)?;
        Ok(Conn {
            sock,
            udp6,
            seq: 0,
            buf: Vec::with_capacity(64 << 10),
        })
    }

    /// Sends an empty UDP datagram to the discard port (9) of an IPv6 next hop, so the
    /// kernel solicits it with a packet queued, from that packet's (global) source
    /// address. `NTF_USE` alone solicits from the interface's link-local address and
    /// sends nothing while that is tentative (DAD, the first second or two after the
    /// link comes up).
    pub(crate) fn nudge(&self, nh: Ipv6Addr, ifindex: u32) -> Result<(), NetlinkError> {
        let udp = self.udp6.as_ref().ok_or_else(|| NetlinkError::Io {
            op: "nudge",
            source: io::Error::new(io::ErrorKind::Unsupported, "no IPv6 socket"),
        })?;
        let scope = if nh.is_unicast_link_local() {
            ifindex
        } else {
            0
        };
        udp.send_to(&[], SocketAddrV6::new(nh, 9, 0, scope))
            .map(|_| ())
            .map_err(io_err("nudge"))
    }

    /// The next sequence number, for the request about to be built.
    pub(crate) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends one request (built with sequence `seq`) and returns the kernel's one
    /// answer to it; an NLMSG_ERROR that is not an ACK is `NetlinkError::Kernel`.
    /// Answers to older requests (one that timed out) are skipped.
    pub(crate) fn request(
        &mut self,
        op: &'static str,
        req: &[u8],
        seq: u32,
    ) -> Result<Reply, NetlinkError> {
        self.sock.send(req, 0).map_err(io_err(op))?;
        loop {
            self.buf.clear();
            match self.sock.recv(&mut self.buf, 0) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(NetlinkError::Timeout { op });
                }
                Err(e) => return Err(NetlinkError::Io { op, source: e }),
            }
            let replies =
                rtnl::decode(&self.buf).map_err(|reason| NetlinkError::Decode { op, reason })?;
            if let Some((_, _, reply)) = replies.into_iter().find(|(s, _, _)| *s == seq) {
                return match reply {
                    Reply::Error(errno) if errno != 0 => Err(NetlinkError::Kernel { op, errno }),
                    r => Ok(r),
                };
            }
        }
    }
}

/// A socket subscribed to RTNLGRP_LINK, RTNLGRP_NEIGH, RTNLGRP_IPV4_ROUTE and
/// RTNLGRP_IPV6_ROUTE.
pub struct Subscription {
    sock: Socket,
    buf: Vec<u8>,
    filter: Filter,
    /// where it was opened, to reopen it there after a socket error
    netns: Option<String>,
    in_use: NextHopsInUse,
}

/// First and longest wait before reopening a failed subscription socket.
const REOPEN_MIN: Duration = Duration::from_millis(100);
const REOPEN_MAX: Duration = Duration::from_secs(30);
/// At most one warning per this interval from a subscription thread.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// Exponential backoff: `REOPEN_MIN`, twice that, ... capped at `REOPEN_MAX`.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Backoff { next: REOPEN_MIN }
    }
    /// The wait before the next attempt; doubles the one after it.
    fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(REOPEN_MAX);
        d
    }
    fn reset(&mut self) {
        self.next = REOPEN_MIN;
    }
}

/// Lets one warning through per `every`; counts the ones it held back.
#[derive(Debug)]
struct RateLimit {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimit {
    fn new(every: Duration) -> Self {
        RateLimit {
            every,
            last: None,
            suppressed: 0,
        }
    }
    /// `Some(held back since the last one)` if a warning may be logged at `now`.
    fn allow(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < self.every)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// Sleeps `d` in `POLL` steps; false if `stop` was set meanwhile.
fn sleep_unless_stopped(stop: &AtomicBool, d: Duration) -> bool {
    let until = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(POLL));
    }
    false
}

impl Subscription {
    /// Subscribes in `netns` (or the caller's namespace). Neighbour changes are
    /// reported only for the neighbours in `in_use` (`KernelResolver::next_hops_in_use`
    /// of the resolver whose answers the changes should refresh).
    pub fn open(netns: Option<&str>, in_use: NextHopsInUse) -> Result<Self, NetlinkError> {
        let sock = open(netns)?;
        for g in [
            libc::RTNLGRP_LINK,
            libc::RTNLGRP_NEIGH,
            libc::RTNLGRP_IPV4_ROUTE,
            libc::RTNLGRP_IPV6_ROUTE,
        ] {
            sock.add_membership(g).map_err(io_err("join group"))?;
        }
        let _ = sock.set_rx_buf_sz(SUBSCRIPTION_RCVBUF);
        set_timeout(&sock, POLL)?;
        Ok(Subscription {
            sock,
            buf: Vec::with_capacity(64 << 10),
            filter: Filter::new(in_use.clone()),
            netns: netns.map(String::from),
            in_use,
        })
    }

    /// Waits up to ~100 ms for notifications; returns the changes they make (empty on
    /// a timeout, a signal (EINTR), or when nothing that matters changed). Lost notifications (ENOBUFS)
    /// come back as `Change::Overflow`.
    pub fn recv_changes(&mut self) -> Result<Vec<Change>, NetlinkError> {
        self.buf.clear();
        match self.sock.recv(&mut self.buf, 0) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(Vec::new());
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(vec![Change::Overflow]),
            Err(e) => {
                return Err(NetlinkError::Io {
                    op: "recv",
                    source: e,
                });
            }
        }
        let replies = rtnl::decode(&self.buf).map_err(|reason| NetlinkError::Decode {
            op: "notification",
            reason,
        })?;
        Ok(replies
            .iter()
            .filter_map(|(_, kind, r)| self.filter.observe(*kind, r))
            .collect())
    }

    /// Runs the subscription on its own thread and calls `on_change` with every
    /// non-empty batch of changes. A datagram that does not decode is reported as
    /// `Change::Overflow` (its changes are lost). A socket error closes the socket,
    /// reports `Overflow` once, and reopens it with exponential backoff (100 ms
    /// doubling to 30 s), reporting `Overflow` again once it is back (changes in the
    /// gap are unknown); warnings are limited to one per 30 s with a count of the
    /// ones held back. The thread ends when the returned `Watch` is dropped.
    pub fn spawn(self, on_change: impl Fn(&[Change]) + Send + 'static) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("nexthop-watch".into())
            .spawn({
                let stop = stop.clone();
                move || self.run(&stop, on_change)
            })
            .ok();
        Watch { stop, thread }
    }

    fn run(self, stop: &AtomicBool, on_change: impl Fn(&[Change])) {
        let (netns, in_use) = (self.netns.clone(), self.in_use.clone());
        let mut sub = Some(self);
        let mut backoff = Backoff::new();
        let mut warn = RateLimit::new(WARN_EVERY);
        while !stop.load(Ordering::Relaxed) {
            let Some(s) = sub.as_mut() else {
                if !sleep_unless_stopped(stop, backoff.next_delay()) {
                    break;
                }
                match Subscription::open(netns.as_deref(), in_use.clone()) {
                    Ok(s) => {
                        // the backoff is reset by the first good receive, not
                        // here: a socket that fails on every receive keeps
                        // backing off instead of reopening every 100 ms
                        tracing::info!("next-hop subscription reopened");
                        sub = Some(s);
                        on_change(&[Change::Overflow]);
                    }
                    Err(e) => {
                        if let Some(held) = warn.allow(Instant::now()) {
                            tracing::warn!(error = %e, retry_in = ?backoff.next, warnings_held_back = held, "next-hop subscription: reopen failed");
                        }
                    }
                }
                continue;
            };
            match s.recv_changes() {
                Ok(c) if c.is_empty() => backoff.reset(),
                Ok(c) => {
                    backoff.reset();
                    on_change(&c);
                }
                Err(e) => {
                    let broken = !matches!(e, NetlinkError::Decode { .. });
                    if let Some(held) = warn.allow(Instant::now()) {
                        tracing::warn!(error = %e, reopening = broken, warnings_held_back = held, "next-hop subscription");
                    }
                    // treat as lost events: the caller re-resolves everything
                    on_change(&[Change::Overflow]);
                    if broken {
                        sub = None;
                    }
                }
            }
        }
    }
}

/// A running subscription thread; dropping it stops the thread (within ~100 ms).
pub struct Watch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    /// False if the thread could not be started.
    pub fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reopen_backoff_doubles_to_30s_and_resets() {
        let mut b = Backoff::new();
        let delays: Vec<_> = (0..12).map(|_| b.next_delay()).collect();
        assert_eq!(delays[0], Duration::from_millis(100));
        assert_eq!(delays[1], Duration::from_millis(200));
        assert_eq!(delays[8], Duration::from_millis(25_600));
        assert_eq!(delays[9], REOPEN_MAX);
        assert_eq!(delays[11], REOPEN_MAX);
        b.reset();
        assert_eq!(b.next_delay(), REOPEN_MIN);
    }

    #[test]
    fn warnings_are_rate_limited_with_a_count() {
        let mut w = RateLimit::new(Duration::from_secs(30));
        let t0 = Instant::now();
        assert_eq!(w.allow(t0), Some(0));
        // a failure every 100 ms for 29.9 s: nothing logged
        for i in 1..300 {
            assert_eq!(w.allow(t0 + Duration::from_millis(100 * i)), None);
        }
        assert_eq!(w.allow(t0 + Duration::from_secs(30)), Some(299));
        assert_eq!(w.allow(t0 + Duration::from_secs(31)), None);
        assert_eq!(w.allow(t0 + Duration::from_secs(61)), Some(1));
    }

    #[test]
    fn sleeping_stops_early_when_asked() {
        let stop = AtomicBool::new(true);
        let t0 = Instant::now();
        assert!(!sleep_unless_stopped(&stop, Duration::from_secs(30)));
        assert!(t0.elapsed() < Duration::from_secs(1));
        let go = AtomicBool::new(false);
        assert!(sleep_unless_stopped(&go, Duration::from_millis(5)));
    }

    #[test]
    fn namespace_names_are_checked() {
        for bad in ["", ".", "..", "a/b", "/etc/passwd", "x\0y"] {
            assert!(netns_path(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            netns_path("edge1").unwrap(),
            PathBuf::from("/var/run/netns/edge1")
        );
        let e = open(Some("ringlb-no-such-ns-for-sure")).err().unwrap();
        assert!(e.to_string().contains("ringlb-no-such-ns-for-sure"), "{e}");
    }
}
