//! The neighbours that backends' next hops use: (interface, next-hop address) as the
//! resolver last found them, one per backend. The resolver records every answer (also
//! an unresolved neighbour: its resolution is under way, and the notification that it
//! succeeded must wake a refresh); the subscription's `Filter` reports a neighbour
//! change only for a neighbour in this set. Every other neighbour on the segment
//! (first seen, aged, garbage-collected) changes no backend's next hop.
//!
//! A backend that no resolve has named for `FORGET_AFTER` is forgotten: the agent
//! re-resolves every live backend at least every resync (30 s), so such a backend has
//! left the datapath.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// A neighbour entry's key as the kernel reports it: (ifindex of the route's output
/// interface, the next-hop address).
pub(crate) type NeighKey = (u32, IpAddr);

/// A backend not resolved for this long no longer holds its neighbour in use.
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(120);
/// How often `record` looks for forgotten backends.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Which neighbour each backend uses, and how many backends use each neighbour.
#[derive(Debug, Default)]
struct Table {
    by_backend: HashMap<IpAddr, (NeighKey, Instant)>,
    count: HashMap<NeighKey, usize>,
    last_sweep: Option<Instant>,
}

impl Table {
    fn record(&mut self, backend: IpAddr, key: Option<NeighKey>, now: Instant) {
        let old = match key {
            Some(k) => self.by_backend.insert(backend, (k, now)),
            None => self.by_backend.remove(&backend),
        };
        if let Some((k, _)) = old {
            self.release(k);
        }
        if let Some(k) = key {
            *self.count.entry(k).or_default() += 1;
        }
        if self
            .last_sweep
            .is_none_or(|t| now.saturating_duration_since(t) >= SWEEP_EVERY)
        {
            self.last_sweep = Some(now);
            self.sweep(now);
        }
    }

    fn release(&mut self, k: NeighKey) {
        if let Some(n) = self.count.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                self.count.remove(&k);
            }
        }
    }

    fn sweep(&mut self, now: Instant) {
        let gone: Vec<(IpAddr, NeighKey)> = self
            .by_backend
            .iter()
            .filter(|(_, (_, t))| now.saturating_duration_since(*t) >= FORGET_AFTER)
            .map(|(b, (k, _))| (*b, *k))
            .collect();
        for (b, k) in gone {
            self.by_backend.remove(&b);
            self.release(k);
        }
    }
}

/// The set of neighbours in use, shared by a `KernelResolver` (which writes it) and
/// the `Subscription` filter (which reads it). Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct NextHopsInUse(Arc<RwLock<Table>>);

impl NextHopsInUse {
    /// Does some backend's next hop use the neighbour `addr` on `ifindex`?
    pub fn contains(&self, ifindex: u32, addr: IpAddr) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .count
            .contains_key(&(ifindex, addr))
    }

    /// How many distinct neighbours are in use.
    pub fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|p| p.into_inner()).count.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `backend` now uses the neighbour `key` (`None`: no route, it uses none).
    pub(super) fn record(&self, backend: IpAddr, key: Option<NeighKey>, now: Instant) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .record(backend, key, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_neighbour_is_in_use_while_some_backend_resolves_to_it() {
        let u = NextHopsInUse::default();
        let t0 = Instant::now();
        let gw_a = (3, ip("10.0.0.1"));
        let gw_b = (4, ip("10.1.0.1"));
        assert!(!u.contains(3, ip("10.0.0.1")));
        u.record(ip("10.2.0.5"), Some(gw_a), t0);
        u.record(ip("10.2.0.6"), Some(gw_a), t0);
        assert!(u.contains(3, ip("10.0.0.1")));
        assert!(
            !u.contains(4, ip("10.0.0.1")),
            "same address, other interface"
        );
        assert_eq!(u.len(), 1);
        // one backend moves to the other gateway: both in use
        u.record(ip("10.2.0.5"), Some(gw_b), t0);
        assert!(u.contains(3, ip("10.0.0.1")) && u.contains(4, ip("10.1.0.1")));
        // resolving again to the same neighbour does not count twice
        u.record(ip("10.2.0.6"), Some(gw_a), t0);
        u.record(ip("10.2.0.6"), Some(gw_a), t0);
        // the last user of gw_a moves away: gw_a is no longer in use
        u.record(ip("10.2.0.6"), Some(gw_b), t0);
        assert!(!u.contains(3, ip("10.0.0.1")));
        assert_eq!(u.len(), 1);
        // a backend with no route uses no neighbour
        u.record(ip("10.2.0.5"), None, t0);
        assert!(u.contains(4, ip("10.1.0.1")), "10.2.0.6 still uses it");
        u.record(ip("10.2.0.6"), None, t0);
        assert!(u.is_empty());
        // a backend never seen, with no route: nothing to release
        u.record(ip("10.2.0.7"), None, t0);
        assert!(u.is_empty());
    }

    #[test]
    fn backends_not_resolved_for_a_while_are_forgotten() {
        let u = NextHopsInUse::default();
        let t0 = Instant::now();
        u.record(ip("10.2.0.5"), Some((3, ip("10.0.0.1"))), t0);
        u.record(ip("10.2.0.6"), Some((3, ip("10.0.0.2"))), t0);
        // 10.2.0.6 keeps being resolved (a live backend), 10.2.0.5 does not (it left)
        let mut t = t0;
        while t < t0 + FORGET_AFTER + SWEEP_EVERY {
            t += Duration::from_secs(5);
            u.record(ip("10.2.0.6"), Some((3, ip("10.0.0.2"))), t);
        }
        assert!(!u.contains(3, ip("10.0.0.1")), "forgotten");
        assert!(u.contains(3, ip("10.0.0.2")));
        assert_eq!(u.len(), 1);
    }
}
