//! The planner, pure: what should be (`Desired`) and what the kernel holds
//! (`Held`) in, the IPVS operations that turn one into the other out. No flush,
//! ever: each service is changed in place.
//!
//! Guarantees (checked by `tests.rs`, property tests included):
//! - **No service is ever without a real server.** A service is created and
//!   filled in one go; in a kept service every new real server is added (and
//!   every weight raised) before any is removed (or lowered); its last real
//!   server leaves only with the service (`DEL_SERVICE`). If both the old and
//!   the new state have a real server of weight > 0, so does every state in
//!   between.
//! - **Edits are edits.** A weight change is one `SET_DEST`; a scheduler,
//!   flag or persistence change (client affinity on, off, a new timeout) one
//!   `SET_SERVICE`.
//! - **The same list on every edge** (`DestOrder::Canonical`, the default). The
//!   kernel's `mh` fills its table walking the service's real-server list, and
//!   `NEW_DEST` puts a new server at the list's head (`list_add_rcu` in
//!   `__ip_vs_update_dest`): the table depends on the order the servers were
//!   added, not only on the set. The planner keeps every list in one canonical
//!   order (by address, highest at the head: what adding them lowest first
//!   gives), so two edges with the same servers build the same table whatever
//!   their history. Getting there may take re-adding some servers that sit
//!   above a new one (`DEL_DEST` + `NEW_DEST`, back to back; the kernel keeps
//!   the server's connections in its trash meanwhile and gives them back). A
//!   re-add that would leave no server of weight > 0, even for that instant, is
//!   not done: that service gets its new set first (`DestOrder::Minimal`: no
//!   re-adds), then the re-adds if they are safe from there. They are unless
//!   the service's only live server is out of place; then its list stays as it
//!   is, correct but maybe not another edge's, until the set changes again.
//! - A VIP is bound (`ip addr add VIP/32 dev lo`, marked as ringlb's) before
//!   its first service is made, and unbound after its last one is deleted.
//!   A crash in between leaves a marked VIP, which the next run finds and
//!   cleans up with its services; the other way round it would leave a
//!   service on an unmarked address that no later run could tell from an
//!   operator's. (The edge announces a VIP only once it is programmed and
//!   withdraws it before removing it, so the order costs no traffic.)

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ringlb_datapath::SourceRange;

use crate::Error;
use crate::codec::consts::{IP_VS_SVC_F_PERSISTENT, IP_VS_SVC_F_SCHED1, IP_VS_SVC_F_SCHED2};
use crate::model::{Dest, DestKey, Forward, Proto, Service, ServiceKey};

mod held;
pub use held::{Held, HeldService};

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;

/// One backend of a service: a pod address and its weight (0: drain, existing
/// connections stay, no new ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Backend {
    pub addr: IpAddr,
    pub weight: u32,
}

/// Everything the edge should forward.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub services: BTreeMap<ServiceKey, Vec<Backend>>,
    /// The services of `services` with client affinity (`sessionAffinity:
    /// ClientIP`), with its timeout in seconds ([`Config::service_with`]).
    pub affinity: BTreeMap<ServiceKey, u32>,
    /// The services of `services` that accept only these sources
    /// (`loadBalancerSourceRanges`; an empty set: none). Not IPVS's: the guard's
    /// (`crate::guard`); the planner does not read it.
    pub source_ranges: BTreeMap<ServiceKey, BTreeSet<SourceRange>>,
}

/// How a service's real-server list is ordered (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DestOrder {
    /// The same order on every edge, re-adding servers where needed.
    #[default]
    Canonical,
    /// New servers are added, nothing is re-added.
    Minimal,
}

/// How services and real servers are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub forward: Forward,
    /// `mh-port`: hash the source port too, not only the source address.
    pub mh_port: bool,
    /// `mh-fallback`: a connection whose server has weight 0 goes to another.
    pub mh_fallback: bool,
    pub order: DestOrder,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            forward: Forward::Tunnel,
            mh_port: true,
            mh_fallback: true,
            order: DestOrder::Canonical,
        }
    }
}

impl Config {
    pub fn service_flags(&self) -> u32 {
        let mut f = 0;
        if self.mh_fallback {
            f |= IP_VS_SVC_F_SCHED1;
        }
        if self.mh_port {
            f |= IP_VS_SVC_F_SCHED2;
        }
        f
    }

    /// The virtual service of `key` without client affinity.
    pub fn service(&self, key: ServiceKey) -> Service {
        self.service_with(key, None)
    }

    /// The virtual service of `key`; with `affinity` (a timeout in seconds) a
    /// persistent one: the client's address alone (`mh-port` off) picks the
    /// real server, the same on every edge, and the kernel's persistence
    /// template (per client address, the host netmask) keeps the client on it
    /// for `affinity` seconds after its last connection, whatever the server
    /// set does meanwhile. A timeout of 0 (which would expire each template at
    /// once) is raised to 1.
    pub fn service_with(&self, key: ServiceKey, affinity: Option<u32>) -> Service {
        let mut s = Service::mh(key, self.service_flags());
        if let Some(t) = affinity {
            s.flags = (s.flags & !IP_VS_SVC_F_SCHED2) | IP_VS_SVC_F_PERSISTENT;
            s.timeout = t.max(1);
        }
        s
    }

    /// The real server of `b` in the service `key`. DR and tunnel cannot
    /// translate ports: the server's port is the service's (the node agent
    /// maps it to the pod's targetPort).
    pub fn dest(&self, key: &ServiceKey, b: &Backend) -> Dest {
        Dest::new(b.addr, key.port, self.forward, b.weight)
    }
}

/// One write to the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    NewService(Service),
    SetService(Service),
    DelService(ServiceKey),
    NewDest(ServiceKey, Dest),
    SetDest(ServiceKey, Dest),
    DelDest(ServiceKey, DestKey),
    /// `ip addr add VIP/32 dev lo` (marked as ringlb's).
    BindVip(IpAddr),
    UnbindVip(IpAddr),
}

impl Op {
    /// The service this operation changes.
    pub fn service(&self) -> Option<&ServiceKey> {
        match self {
            Op::NewService(s) | Op::SetService(s) => Some(&s.key),
            Op::DelService(k) | Op::NewDest(k, _) | Op::SetDest(k, _) | Op::DelDest(k, _) => {
                Some(k)
            }
            Op::BindVip(_) | Op::UnbindVip(_) => None,
        }
    }

    /// For logs and errors: the verb and its object.
    pub fn describe(&self) -> (&'static str, String) {
        match self {
            Op::NewService(s) => ("NEW_SERVICE", s.key.to_string()),
            Op::SetService(s) => ("SET_SERVICE", s.key.to_string()),
            Op::DelService(k) => ("DEL_SERVICE", k.to_string()),
            Op::NewDest(k, d) => ("NEW_DEST", format!("{k} -> {}", d.key)),
            Op::SetDest(k, d) => ("SET_DEST", format!("{k} -> {}", d.key)),
            Op::DelDest(k, d) => ("DEL_DEST", format!("{k} -> {d}")),
            Op::BindVip(a) => ("bind VIP", a.to_string()),
            Op::UnbindVip(a) => ("unbind VIP", a.to_string()),
        }
    }
}

/// Checks one desired service and returns its real servers in canonical order
/// (highest address first: the kernel list's head first).
pub fn desired_dests(
    key: &ServiceKey,
    backends: &[Backend],
    cfg: &Config,
) -> Result<Vec<Dest>, Error> {
    let bad = |reason: String| Error::InvalidService {
        service: key.to_string(),
        reason,
    };
    if key.port == 0 {
        return Err(bad(
            "port 0 (all ports) needs a persistent IPVS service; not supported".into(),
        ));
    }
    if let Proto::Other(n) = key.proto {
        return Err(bad(format!("protocol {n}: only TCP and UDP")));
    }
    if backends.is_empty() {
        return Err(bad("no backends (withdraw the VIP instead)".into()));
    }
    let mut seen = BTreeSet::new();
    for b in backends {
        if !seen.insert(b.addr) {
            return Err(bad(format!("backend {} listed twice", b.addr)));
        }
        if b.addr.is_ipv4() != key.addr.is_ipv4() && cfg.forward != Forward::Tunnel {
            return Err(bad(format!(
                "backend {}: another address family than the VIP needs tunnel forwarding",
                b.addr
            )));
        }
        if b.weight > i32::MAX as u32 {
            return Err(bad(format!(
                "backend {}: weight {} > 2^31-1",
                b.addr, b.weight
            )));
        }
    }
    let mut dests: Vec<Dest> = backends.iter().map(|b| cfg.dest(key, b)).collect();
    dests.sort_by_key(|d| std::cmp::Reverse(d.key));
    Ok(dests)
}

/// The operations that make `held` into `desired`.
pub fn plan(held: &Held, desired: &Desired, cfg: &Config) -> Result<Vec<Op>, Error> {
    let mut ops = Vec::new();
    let addrs: BTreeSet<IpAddr> = desired.services.keys().map(|k| k.addr).collect();
    ops.extend(addrs.difference(&held.vips).map(|a| Op::BindVip(*a)));
    for (key, backends) in &desired.services {
        let want = desired_dests(key, backends, cfg)?;
        let service = cfg.service_with(*key, desired.affinity.get(key).copied());
        plan_one(&mut ops, held.services.get(key), service, &want, cfg);
    }
    for key in held.services.keys() {
        if !desired.services.contains_key(key) {
            ops.push(Op::DelService(*key));
        }
    }
    ops.extend(held.vips.difference(&addrs).map(|a| Op::UnbindVip(*a)));
    Ok(ops)
}

/// The operations that change one service (`None`: remove it) and nothing
/// else, for a single Service/EndpointSlice event; `affinity` as in
/// [`Desired::affinity`].
pub fn plan_service(
    held: &Held,
    key: &ServiceKey,
    backends: Option<&[Backend]>,
    affinity: Option<u32>,
    cfg: &Config,
) -> Result<Vec<Op>, Error> {
    let mut ops = Vec::new();
    match backends {
        Some(b) => {
            let want = desired_dests(key, b, cfg)?;
            if !held.vips.contains(&key.addr) {
                ops.push(Op::BindVip(key.addr));
            }
            let service = cfg.service_with(*key, affinity);
            plan_one(&mut ops, held.services.get(key), service, &want, cfg);
        }
        None => {
            if held.services.contains_key(key) {
                ops.push(Op::DelService(*key));
            }
            let shared = held.services.keys().any(|k| k != key && k.addr == key.addr);
            if !shared && held.vips.contains(&key.addr) {
                ops.push(Op::UnbindVip(key.addr));
            }
        }
    }
    Ok(ops)
}

fn plan_one(
    ops: &mut Vec<Op>,
    held: Option<&HeldService>,
    service: Service,
    want: &[Dest],
    cfg: &Config,
) {
    let key = service.key;
    let Some(held) = held else {
        ops.push(Op::NewService(service));
        // lowest first, so the list reads highest first
        ops.extend(want.iter().rev().map(|d| Op::NewDest(key, d.clone())));
        return;
    };
    if !service.same_settings(&held.service) {
        ops.push(Op::SetService(service));
    }
    if cfg.order == DestOrder::Canonical {
        let straight = dest_ops(&key, &held.dests, want, DestOrder::Canonical);
        if safe(&held.dests, want, &straight) {
            ops.extend(straight);
            return;
        }
    }
    // The set first (always safe); then, for Canonical, the order if that is
    // safe from there: it is unless the one live server is out of place.
    let minimal = dest_ops(&key, &held.dests, want, DestOrder::Minimal);
    let mid = run(&held.dests, &minimal);
    ops.extend(minimal);
    if cfg.order == DestOrder::Canonical {
        let reorder = dest_ops(&key, &mid, want, DestOrder::Canonical);
        if safe(&mid, want, &reorder) {
            ops.extend(reorder);
        }
    }
}

/// The real-server operations of one kept service: raised weights, then
/// additions and re-adds (lowest first), then lowered weights, then removals.
fn dest_ops(key: &ServiceKey, held: &[Dest], want: &[Dest], order: DestOrder) -> Vec<Op> {
    let wanted: BTreeMap<DestKey, &Dest> = want.iter().map(|d| (d.key, d)).collect();
    let present: BTreeMap<DestKey, &Dest> = held.iter().map(|d| (d.key, d)).collect();
    // Servers that stay where they are: for Canonical, the longest tail of the
    // wanted order that the kernel's list already has in that order (found
    // from the end; every other server goes on top of them, re-added or new).
    let untouched: BTreeSet<DestKey> = match order {
        DestOrder::Minimal => present.keys().copied().collect(),
        DestOrder::Canonical => {
            let kept: Vec<DestKey> = held
                .iter()
                .map(|d| d.key)
                .filter(|k| wanted.contains_key(k))
                .collect();
            let mut tail = BTreeSet::new();
            let mut j = kept.len();
            for d in want.iter().rev() {
                match kept[..j].iter().rposition(|k| *k == d.key) {
                    Some(at) => {
                        tail.insert(d.key);
                        j = at;
                    }
                    None => break,
                }
            }
            tail
        }
    };
    let (mut raise, mut place, mut lower, mut remove) = (vec![], vec![], vec![], vec![]);
    for d in want.iter().rev() {
        match present.get(&d.key) {
            Some(old) if untouched.contains(&d.key) => {
                if !d.same_settings(old) {
                    let set = Op::SetDest(*key, d.clone());
                    if d.weight >= old.weight {
                        raise.push(set);
                    } else {
                        lower.push(set);
                    }
                }
            }
            Some(_) => {
                place.push(Op::DelDest(*key, d.key));
                place.push(Op::NewDest(*key, d.clone()));
            }
            None => place.push(Op::NewDest(*key, d.clone())),
        }
    }
    for d in held {
        if !wanted.contains_key(&d.key) {
            remove.push(Op::DelDest(*key, d.key));
        }
    }
    raise
        .into_iter()
        .chain(place)
        .chain(lower)
        .chain(remove)
        .collect()
}

/// Whether `ops`, run on a service holding `before`, keep it with a real server
/// at every step, and with one of weight > 0 whenever both ends have one.
pub fn safe(before: &[Dest], after: &[Dest], ops: &[Op]) -> bool {
    let live = |l: &[Dest]| l.iter().any(|d| d.weight > 0);
    let keep_live = live(before) && live(after);
    let mut list = before.to_vec();
    for op in ops {
        step(&mut list, op);
        if list.is_empty() || (keep_live && !live(&list)) {
            return false;
        }
    }
    true
}

/// One service's list after `ops` (its real-server operations).
fn run(before: &[Dest], ops: &[Op]) -> Vec<Dest> {
    let mut list = before.to_vec();
    for op in ops {
        step(&mut list, op);
    }
    list
}

/// The kernel's list rules (`Held::apply` for one list).
fn step(list: &mut Vec<Dest>, op: &Op) {
    match op {
        Op::NewDest(_, d) => list.insert(0, d.clone()),
        Op::SetDest(_, d) => {
            if let Some(x) = list.iter_mut().find(|x| x.key == d.key) {
                *x = d.clone();
            }
        }
        Op::DelDest(_, k) => list.retain(|x| x.key != *k),
        _ => {}
    }
}
