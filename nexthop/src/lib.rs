//! Next-hop resolution for backends: which interface and which MAC addresses an
//! encapsulated packet to a pod IP leaves with.
//!
//! `KernelResolver` asks the kernel over rtnetlink, the way `ip route get` does:
//!
//! 1. `RTM_GETROUTE` for the backend address: the output interface and the gateway
//!    (none when the backend is on-link; then the backend itself is the next hop);
//! 2. `RTM_GETLINK` for that interface: its ifindex and MAC (cached per interface
//!    until `LinkCache::clear`, which the agent calls on link notifications). A VLAN
//!    device (kind "vlan") resolves to its parent's ifindex, the port XDP runs on,
//!    plus its VLAN id and protocol; the source MAC stays the VLAN device's. A VLAN
//!    on another VLAN, or on a device in another network namespace
//!    (`IFLA_LINK_NETNSID`), is a resolve error naming it (see `link`);
//! 3. `RTM_GETNEIGH` for (interface, next hop): its MAC if the entry is in a usable
//!    state (REACHABLE, STALE, DELAY, PROBE, PERMANENT, NOARP).
//!
//! A missing or FAILED IPv4 neighbour (not an INCOMPLETE one: the kernel is resolving
//! it already) is handed to the kernel with
//! `RTM_NEWNEIGH` + `NTF_USE` (what `ip neigh replace ... use` sends): the kernel
//! creates the entry and starts resolution as if a packet were waiting, sending the ARP
//! request at once. That puts no packet of ours on the wire and needs no ping binary.
//! IPv6 differs: with no packet queued the kernel sends the neighbour solicitation from
//! the interface's link-local address, and sends none while that address is tentative
//! (DAD, the first one or two seconds after a link comes up). So an IPv6 next hop is
//! triggered with an empty UDP datagram to its discard port (9), sent from an unbound
//! socket of the same namespace. The kernel queues it on the neighbour and solicits at
//! once, from the datagram's global source address. The datagram reaches the next hop
//! once it is resolved. `NTF_USE` is the fallback when there is no IPv6 socket.
//! The resolver then polls the entry for a short, bounded time (`DEFAULT_WAIT`, at most
//! once per neighbour per `REWAIT`), so one dead backend cannot stall a refresh;
//! if it is still unresolved the backend is written with `nh_valid = 0` and the
//! program falls back to `bpf_fib_lookup`. A STALE entry is used as it is and also
//! gets an `NTF_USE`: XDP_TX traffic never confirms neighbours, so the kernel is asked
//! to re-probe them.
//!
//! Keeping it current: `Subscription` listens to RTNLGRP_LINK, RTNLGRP_NEIGH and
//! RTNLGRP_IPV4/IPV6_ROUTE on its own thread and reports the changes that can move a
//! next hop: the usable MAC of a neighbour in use changed (`NextHopsInUse`: the
//! (interface, next hop) each backend's last resolve went through, recorded by the
//! resolver), a route of a routing table changed (not a cached clone, not the local
//! table), any link change, lost events. The edge agent coalesces them and calls
//! `XdpDatapath::refresh_next_hops`, which rewrites only the backends whose resolved
//! value changed.
//!
//! The message encoding and the meaning of the kernel's answers are pure (`rtnl`,
//! tested without root); the sockets are in `socket`.

mod filter;
mod in_use;
mod link;
mod local;
mod rtnl;
mod socket;

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

pub use filter::Change;
pub use in_use::NextHopsInUse;
pub use local::{LocalPods, WithLocalPods};
pub use rtnl::{Neigh, Route};
pub use socket::{NetlinkError, Subscription, Watch};

/// A backend address whose next hop could not be resolved, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("next-hop resolution for {addr}: {reason}")]
pub struct Error {
    pub addr: IpAddr,
    pub reason: String,
}
use link::{Egress, Link};
use rtnl::Reply;
use socket::Conn;

/// Where packets to one backend go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NextHop {
    /// The port the frame leaves by: the route's output interface, or its parent
    /// when that is a VLAN device (XDP runs on the parent).
    pub ifindex: u32,
    /// Our MAC on the route's output interface (the VLAN device's own MAC).
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
    /// The tag the frame carries on `ifindex`; `None` = untagged.
    pub vlan: Option<Vlan>,
}

impl std::fmt::Display for NextHop {
    /// "ifindex 3 vlan 100 02:00:00:00:00:01 -> 02:00:00:00:00:02"
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ifindex {}", self.ifindex)?;
        if let Some(v) = self.vlan {
            write!(f, " {v}")?;
        }
        write!(
            f,
            " {} -> {}",
            format_mac(&self.smac),
            format_mac(&self.dmac)
        )
    }
}

/// One VLAN tag: the VLAN device's id and protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vlan {
    /// 1..=4094
    pub id: u16,
    pub protocol: VlanProtocol,
}

/// The tag protocol identifier of a VLAN device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VlanProtocol {
    /// 802.1Q, TPID 0x8100
    Dot1Q,
    /// 802.1ad (QinQ service tag), TPID 0x88a8
    Dot1Ad,
}

impl std::fmt::Display for Vlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.protocol {
            VlanProtocol::Dot1Q => write!(f, "vlan {}", self.id),
            VlanProtocol::Dot1Ad => write!(f, "vlan {} (802.1ad)", self.id),
        }
    }
}

/// Resolves the next hop of a backend address.
pub trait Resolver: Send {
    fn resolve(&self, addr: IpAddr) -> Result<NextHop, Error>;
    /// Whether `addr` is a pod on this node ([`LocalPods`]): no next hop reaches
    /// it, its frames go up this node's stack. Not asked to resolve then.
    fn is_local(&self, _addr: IpAddr) -> bool {
        false
    }
}

/// Fixed answers: for benchmarks and packet fixtures.
#[derive(Clone, Debug, Default)]
pub struct StaticResolver {
    pub default: Option<NextHop>,
    pub per_addr: BTreeMap<IpAddr, NextHop>,
}

impl StaticResolver {
    /// Every backend on `nh`.
    pub fn everywhere(nh: NextHop) -> Self {
        Self {
            default: Some(nh),
            ..Self::default()
        }
    }
}

impl Resolver for StaticResolver {
    fn resolve(&self, addr: IpAddr) -> Result<NextHop, Error> {
        self.per_addr
            .get(&addr)
            .or(self.default.as_ref())
            .copied()
            .ok_or_else(|| Error {
                addr,
                reason: "no static next hop".into(),
            })
    }
}

/// How long a resolve waits for the kernel to resolve a missing neighbour.
pub const DEFAULT_WAIT: Duration = Duration::from_millis(100);
/// A neighbour that was waited for is not waited for again within this time.
const REWAIT: Duration = Duration::from_secs(30);
/// Poll interval while waiting for a neighbour.
const POLL: Duration = Duration::from_millis(1);
/// Bound of the per-backend memory of the last answer (for "changed" logs).
const MAX_REMEMBERED: usize = 1 << 16;

/// Resolution through the kernel's routes and neighbours over rtnetlink, in the
/// current network namespace or in a named one (`/var/run/netns/NAME`). The socket
/// is opened on first use and reopened after an I/O error.
pub struct KernelResolver {
    netns: Option<String>,
    wait: Duration,
    links: LinkCache,
    in_use: NextHopsInUse,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    conn: Option<Conn>,
    /// neighbours waited for, and when
    waited: HashMap<(u32, IpAddr), Instant>,
    /// last answer per backend, to log what changed
    last: HashMap<IpAddr, NextHop>,
}

/// The resolver's interface cache (route output ifindex -> egress port, MAC and
/// VLAN), shareable with a subscription callback that clears it when links change.
///
/// A resolve that misses reads the links from the kernel and then stores the answer;
/// a `clear` in between (a link changed meanwhile) may have made that answer stale.
/// So `clear` bumps a generation, a miss returns the generation it saw, and `put`
/// stores only if no `clear` came since: a stale answer serves its one resolve (the
/// link notification brings another refresh) but is never cached.
#[derive(Clone, Default, Debug)]
pub struct LinkCache(Arc<Mutex<Links>>);

#[derive(Default, Debug)]
struct Links {
    generation: u64,
    map: HashMap<u32, Egress>,
}

/// What a cache lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cached {
    Hit(Egress),
    /// not cached; pass the generation to `put`
    Miss(u64),
}

impl LinkCache {
    pub fn clear(&self) {
        let mut l = self.0.lock().unwrap_or_else(|p| p.into_inner());
        l.generation = l.generation.wrapping_add(1);
        l.map.clear();
    }
    fn get(&self, ifindex: u32) -> Cached {
        let l = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match l.map.get(&ifindex) {
            Some(e) => Cached::Hit(*e),
            None => Cached::Miss(l.generation),
        }
    }
    /// Stores `e` (read from the kernel after a miss at `generation`) unless the
    /// cache was cleared since; returns whether it was stored.
    fn put(&self, ifindex: u32, e: Egress, generation: u64) -> bool {
        let mut l = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if l.generation != generation {
            return false;
        }
        l.map.insert(ifindex, e);
        true
    }
}

impl Default for KernelResolver {
    fn default() -> Self {
        Self::new(None)
    }
}

impl std::fmt::Debug for KernelResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelResolver")
            .field("netns", &self.netns)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

/// "02:00:0a:00:00:01"
pub fn format_mac(m: &[u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

impl KernelResolver {
    /// In `netns` (a name under /var/run/netns), or in the caller's namespace.
    pub fn new(netns: Option<String>) -> Self {
        KernelResolver {
            netns,
            wait: DEFAULT_WAIT,
            links: LinkCache::default(),
            in_use: NextHopsInUse::default(),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// How long one resolve may wait for a missing neighbour (0: never wait).
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The interface cache, to clear on link notifications.
    pub fn link_cache(&self) -> LinkCache {
        self.links.clone()
    }

    /// The neighbours the backends' next hops use, as this resolver last found them;
    /// give it to `Subscription::open` so that only their changes are reported.
    pub fn next_hops_in_use(&self) -> NextHopsInUse {
        self.in_use.clone()
    }

    /// Resolves `addr`. As soon as the route names the neighbour it goes through, that
    /// neighbour is recorded in use (and `*recorded` set), before any wait for it: if
    /// it resolves meanwhile, or after the wait gave up, its notification must count.
    fn resolve_with(
        &self,
        inner: &mut Inner,
        addr: IpAddr,
        recorded: &mut bool,
    ) -> Result<NextHop, NetlinkOrRoute> {
        let conn = match &mut inner.conn {
            Some(c) => c,
            None => inner.conn.insert(Conn::open(self.netns.as_deref())?),
        };
        let seq = conn.next_seq();
        let route = match conn.request("route get", &rtnl::route_get(addr, seq), seq)? {
            Reply::Route(r, _) => r.map_err(NetlinkOrRoute::Route)?,
            other => {
                return Err(NetlinkOrRoute::Route(format!(
                    "unexpected answer {other:?}"
                )));
            }
        };
        let nh = route.next_hop(addr);
        self.in_use
            .record(addr, Some((route.oif, nh)), Instant::now());
        *recorded = true;
        let out = match self.links.get(route.oif) {
            Cached::Hit(e) => e,
            Cached::Miss(generation) => {
                let e = egress_of(conn, route.oif)?;
                self.links.put(route.oif, e, generation);
                e
            }
        };
        // the neighbour is looked up on the route's interface (the VLAN device, if
        // any); the frame leaves by out.ifindex (its parent) with out.vlan
        let found = |dmac| NextHop {
            ifindex: out.ifindex,
            smac: out.smac,
            dmac,
            vlan: out.vlan,
        };
        let neigh = neigh_get(conn, route.oif, nh)?;
        if let Some((n, dmac)) = neigh.and_then(|n| Some((n, n.usable_mac()?))) {
            if n.state == rtnl::NUD_STALE {
                // ask the kernel to re-confirm it; the MAC stays usable meanwhile
                let seq = conn.next_seq();
                let _ = conn.request("neigh use", &rtnl::neigh_use(route.oif, nh, seq), seq);
            }
            return Ok(found(dmac));
        }
        // Start resolution unless the kernel is at it already (INCOMPLETE). IPv6:
        // NTF_USE solicits from the interface's link-local address, and sends nothing
        // while that is tentative; a queued datagram is solicited for at once, from
        // its own (global) source address.
        if neigh.is_none_or(|n| n.state & rtnl::NUD_INCOMPLETE == 0) {
            let nudged = match nh {
                IpAddr::V6(nh6) => conn
                    .nudge(nh6, route.oif)
                    .inspect_err(|e| tracing::debug!(next_hop = %nh, error = %e, "UDP nudge"))
                    .is_ok(),
                IpAddr::V4(_) => false,
            };
            if !nudged {
                let seq = conn.next_seq();
                conn.request("neigh use", &rtnl::neigh_use(route.oif, nh, seq), seq)?;
            }
        }
        let key = (route.oif, nh);
        let now = Instant::now();
        let waited_lately = inner
            .waited
            .get(&key)
            .is_some_and(|t| now.duration_since(*t) < REWAIT);
        if !waited_lately && !self.wait.is_zero() {
            if inner.waited.len() > 4096 {
                inner.waited.retain(|_, t| now.duration_since(*t) < REWAIT);
            }
            inner.waited.insert(key, now);
            let conn = inner
                .conn
                .as_mut()
                .ok_or(NetlinkOrRoute::Route("connection lost".into()))?;
            let deadline = now + self.wait;
            while Instant::now() < deadline {
                std::thread::sleep(POLL);
                if let Some(dmac) = neigh_get(conn, route.oif, nh)?.and_then(|n| n.usable_mac()) {
                    return Ok(found(dmac));
                }
            }
        }
        Err(NetlinkOrRoute::Route(format!(
            "neighbour {nh} on interface {} not resolved yet (resolution started)",
            route.oif
        )))
    }
}

/// The interface the kernel routes `dst` through, as `ip route get DST` reports
/// it: (ifindex, name). The route's own output interface (a VLAN device stays
/// itself). The node agent finds its default uplink this way.
pub fn route_interface(netns: Option<&str>, dst: IpAddr) -> Result<(u32, String), Error> {
    let err = |reason: String| Error { addr: dst, reason };
    let mut conn = Conn::open(netns).map_err(|e| err(e.to_string()))?;
    let seq = conn.next_seq();
    let route = match conn
        .request("route get", &rtnl::route_get(dst, seq), seq)
        .map_err(|e| err(e.to_string()))?
    {
        Reply::Route(r, _) => r.map_err(err)?,
        other => return Err(err(format!("unexpected answer {other:?}"))),
    };
    let link = link_get(&mut conn, route.oif)
        .map_err(|e| err(e.to_string()))?
        .ok_or_else(|| err(format!("interface {} not found", route.oif)))?;
    Ok((route.oif, link.name))
}

/// One link, or None if the kernel has no such interface (a NACK).
fn link_get(conn: &mut Conn, ifindex: u32) -> Result<Option<Link>, NetlinkError> {
    let seq = conn.next_seq();
    match conn.request("link get", &rtnl::link_get(ifindex, seq), seq) {
        Ok(Reply::Link(l)) => Ok(Some(l)),
        Ok(_) => Ok(None),
        Err(e) if e.errno().is_some() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The port, source MAC and VLAN tag of frames routed out of `oif` (a VLAN device
/// resolves to its parent; see `link`).
fn egress_of(conn: &mut Conn, oif: u32) -> Result<Egress, NetlinkOrRoute> {
    let link = link_get(conn, oif)?
        .ok_or_else(|| NetlinkOrRoute::Route(format!("interface {oif} not found")))?;
    // a parent in another namespace (IFLA_LINK_NETNSID) is not fetched here: its
    // index means another device in ours; `link::egress` refuses the VLAN
    let parent = match link
        .parent
        .filter(|_| link.is_vlan() && link.link_netnsid.is_none())
    {
        Some(p) => link_get(conn, p)?,
        None => None,
    };
    link::egress(&link, parent.as_ref()).map_err(NetlinkOrRoute::Route)
}

/// The neighbour entry, or None if the kernel has none (ENOENT).
fn neigh_get(conn: &mut Conn, ifindex: u32, nh: IpAddr) -> Result<Option<Neigh>, NetlinkError> {
    let seq = conn.next_seq();
    match conn.request("neigh get", &rtnl::neigh_get(ifindex, nh, seq), seq) {
        Ok(Reply::Neigh(n)) => Ok(Some(n)),
        Ok(_) => Ok(None),
        Err(e) if e.errno() == Some(-libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

enum NetlinkOrRoute {
    Netlink(NetlinkError),
    Route(String),
}

impl From<NetlinkError> for NetlinkOrRoute {
    fn from(e: NetlinkError) -> Self {
        NetlinkOrRoute::Netlink(e)
    }
}

impl Resolver for KernelResolver {
    fn resolve(&self, addr: IpAddr) -> Result<NextHop, Error> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut recorded = false;
        let result = self.resolve_with(&mut inner, addr, &mut recorded);
        if !recorded {
            // no route (or no answer): this backend uses no neighbour now
            self.in_use.record(addr, None, Instant::now());
        }
        match result {
            Ok(nh) => {
                let old = inner.last.insert(addr, nh);
                // per backend at debug: refresh_next_hops logs one line per change
                // of an (interface, next hop) with the number of pods it moved
                if let Some(old) = old.filter(|o| *o != nh) {
                    tracing::debug!(backend = %addr, old = %old, new = %nh, "resolved next hop changed");
                }
                if inner.last.len() > MAX_REMEMBERED {
                    inner.last.clear();
                }
                Ok(nh)
            }
            Err(e) => {
                inner.last.remove(&addr);
                let reason = match e {
                    NetlinkOrRoute::Route(r) => r,
                    NetlinkOrRoute::Netlink(e) => {
                        // a kernel NACK (no route: ENETUNREACH) leaves the socket fine;
                        // anything else reopens it next time
                        if e.errno().is_none() {
                            inner.conn = None;
                        }
                        e.to_string()
                    }
                };
                Err(Error { addr, reason })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_answers_and_mac_format() {
        let nh = NextHop {
            ifindex: 2,
            smac: [2, 0, 0, 0, 0, 1],
            dmac: [2, 0, 0x0a, 0, 0, 0xff],
            vlan: None,
        };
        let a: IpAddr = "10.2.0.5".parse().unwrap();
        let r = StaticResolver {
            default: None,
            per_addr: [(a, nh)].into(),
        };
        assert_eq!(r.resolve(a).unwrap(), nh);
        assert!(r.resolve("10.2.0.6".parse().unwrap()).is_err());
        assert_eq!(format_mac(&nh.dmac), "02:00:0a:00:00:ff");
    }

    #[test]
    fn a_link_cleared_between_miss_and_put_is_not_cached() {
        let c = LinkCache::default();
        let e = Egress {
            ifindex: 3,
            smac: [2, 0, 0, 0, 0, 3],
            vlan: None,
        };
        // a plain miss, then put: cached
        let Cached::Miss(g) = c.get(5) else {
            panic!("empty cache hit")
        };
        assert!(c.put(5, e, g));
        assert_eq!(c.get(5), Cached::Hit(e));
        // a resolve misses on interface 6 and reads it from the kernel; meanwhile a
        // link notification clears the cache: what it read may be stale, not kept
        let Cached::Miss(g) = c.get(6) else { panic!() };
        c.clear();
        assert!(!c.put(6, e, g), "stored a stale answer");
        assert!(matches!(c.get(6), Cached::Miss(_)));
        assert!(
            matches!(c.get(5), Cached::Miss(_)),
            "clear empties the cache"
        );
        // the next miss (after the clear) caches again
        let Cached::Miss(g) = c.get(6) else { panic!() };
        assert!(c.put(6, e, g));
        assert_eq!(c.get(6), Cached::Hit(e));
    }

    #[test]
    fn a_bad_namespace_is_a_next_hop_error_not_a_panic() {
        let r = KernelResolver::new(Some("ringlb-no-such-netns".into()));
        let e = r.resolve("10.2.0.5".parse().unwrap()).unwrap_err();
        assert_eq!(e.addr.to_string(), "10.2.0.5");
        assert!(e.to_string().contains("ringlb-no-such-netns"), "{e}");
    }
}
