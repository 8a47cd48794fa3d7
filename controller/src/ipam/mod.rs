//! IP address management: pure, no I/O.
//!
//! The [`Ipam`] holds the pools (from `IPPool` objects) and who holds which address.
//! Memory is proportional to the number of allocated addresses: the holders live in a
//! `BTreeMap<IpAddr, _>` and a free address is found by walking the gaps between
//! allocated ones from a per-range cursor ("everything below is taken"), so a
//! `2001:db8::/64` pool costs the same as a /30.
//!
//! Rules (see docs/controller.md):
//! - A Service keeps an address it holds as long as the address still fits its own
//!   request (family, requested IP, requested pool, sharing). Pool edits never move
//!   a Service; an address no pool covers any more is kept and reported.
//! - A Service's addresses are adopted from its status the first time it is seen,
//!   so a restarted controller rebuilds exactly the previous state. Two Services
//!   holding one address without a legal share is a [`Refusal::Conflict`] for the
//!   later one; nothing is renumbered.
//! - Sharing: same `ringlb.io/allow-shared-ip` key and disjoint port/protocol pairs.

pub mod pool;
pub mod request;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

pub use pool::{Family, Labels, Pool, PoolError, Range};
pub use request::{FamilyWant, PortProto, Request};

use pool::{ip_to_u128, is_buggy, u128_to_ip};

/// A user-caused reason not to give a Service (all of) what it asks for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no free {family} address in pool(s) {}", pools.join(", "))]
    PoolExhausted { family: Family, pools: Vec<String> },
    #[error("{reason}")]
    UnsupportedFamily { reason: String },
    #[error(
        "no pool this Service may use offers {family} addresses (check autoAssign and selectors)"
    )]
    NoMatchingPool { family: Family },
    #[error("requested {ip} is outside every pool this Service may use")]
    OutsidePools { ip: IpAddr },
    #[error(
        "requested {ip} is the subnet-router anycast address of a CIDR in pool {pool:?} \
         (RFC 4291), which is never handed out"
    )]
    Reserved { ip: IpAddr, pool: String },
    #[error("requested {ip} is already in use by {holder}")]
    InUse { ip: IpAddr, holder: String },
    #[error("{ip} cannot be shared with {holder}: {reason}")]
    SharingConflict {
        ip: IpAddr,
        holder: String,
        reason: String,
    },
    #[error("annotation {annotation}={value:?} is malformed: {reason}")]
    Malformed {
        annotation: String,
        value: String,
        reason: String,
    },
    #[error("pool {pool:?} does not exist or is invalid")]
    PoolNotFound { pool: String },
    #[error("pool {pool:?} may not be used by this Service: {reason}")]
    PoolNotAllowed { pool: String, reason: String },
    #[error(
        "status holds {ip}, which {holder} already holds without a legal share; not touching either (fix one of them)"
    )]
    Conflict { ip: IpAddr, holder: String },
}

impl Refusal {
    /// Label for the `reason` of the refusal metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Refusal::PoolExhausted { .. } => "pool_exhausted",
            Refusal::UnsupportedFamily { .. } => "unsupported_family",
            Refusal::NoMatchingPool { .. } => "no_matching_pool",
            Refusal::OutsidePools { .. } => "ip_outside_pools",
            Refusal::Reserved { .. } => "ip_reserved",
            Refusal::InUse { .. } => "ip_in_use",
            Refusal::SharingConflict { .. } => "sharing_conflict",
            Refusal::Malformed { .. } => "malformed_annotation",
            Refusal::PoolNotFound { .. } => "pool_not_found",
            Refusal::PoolNotAllowed { .. } => "pool_not_allowed",
            Refusal::Conflict { .. } => "ip_conflict",
        }
    }

    /// CamelCase reason for Events and the `ringlb.io/IPAllocated` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::PoolExhausted { .. } => "PoolExhausted",
            Refusal::UnsupportedFamily { .. } => "UnsupportedFamily",
            Refusal::NoMatchingPool { .. } => "NoMatchingPool",
            Refusal::OutsidePools { .. } => "IPOutsidePools",
            Refusal::Reserved { .. } => "IPReserved",
            Refusal::InUse { .. } => "IPInUse",
            Refusal::SharingConflict { .. } => "SharingKeyConflict",
            Refusal::Malformed { .. } => "MalformedAnnotation",
            Refusal::PoolNotFound { .. } => "PoolNotFound",
            Refusal::PoolNotAllowed { .. } => "PoolNotAllowed",
            Refusal::Conflict { .. } => "IPConflict",
        }
    }
}

/// What one Service holds on one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub sharing_key: Option<String>,
    pub ports: Vec<PortProto>,
    /// The pool the address was drawn from, if any pool offered it then.
    pub pool: Option<String>,
}

/// The result of [`Ipam::ensure`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The Service's addresses, in its family order.
    pub ips: Vec<IpAddr>,
    /// Addresses newly drawn from a pool (or newly joined as a share) this time.
    pub allocated: Vec<IpAddr>,
    /// Addresses taken over from the Service's status (restart, leader change).
    pub adopted: Vec<IpAddr>,
    /// Addresses the Service no longer holds.
    pub released: Vec<IpAddr>,
    /// Held addresses no pool covers any more (kept, to be reported).
    pub outside_pools: Vec<IpAddr>,
    /// Optional (PreferDualStack) families that could not be served.
    pub missing_optional: Vec<Refusal>,
}

/// A pool's usage for one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    pub family: Family,
    pub allocated: u64,
    pub free: u128,
}

/// Two Services found holding one address at rebuild.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RebuildConflict {
    pub service: String,
    pub ip: IpAddr,
    pub holder: String,
}

/// The allocator.
#[derive(Debug, Default)]
pub struct Ipam {
    /// Valid pools, in the order they are tried: (priority, name).
    pools: Vec<Pool>,
    /// Pools whose spec is invalid, with the reasons.
    invalid: BTreeMap<String, Vec<PoolError>>,
    /// Address -> Service key -> holding.
    allocs: BTreeMap<IpAddr, BTreeMap<String, Holding>>,
    /// Service key -> its addresses.
    by_service: HashMap<String, Vec<IpAddr>>,
    /// Sharing key -> addresses held under it.
    by_sharing_key: HashMap<String, BTreeSet<IpAddr>>,
    /// (pool, range index) -> every usable address below this value is taken.
    cursors: HashMap<(String, usize), u128>,
}

impl Ipam {
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the pool set. Held addresses are untouched: editing a pool never
    /// moves a Service.
    pub fn set_pools(&mut self, pools: Vec<Pool>, invalid: BTreeMap<String, Vec<PoolError>>) {
        let mut pools = pools;
        pools.sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
        self.pools = pools;
        self.invalid = invalid;
        self.cursors.clear();
    }

    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    pub fn invalid_pools(&self) -> &BTreeMap<String, Vec<PoolError>> {
        &self.invalid
    }

    /// Addresses held by a Service.
    pub fn held(&self, key: &str) -> &[IpAddr] {
        self.by_service.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Services holding an address.
    pub fn holders(&self, ip: &IpAddr) -> Vec<String> {
        self.allocs
            .get(ip)
            .map(|h| h.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub fn allocated_count(&self) -> usize {
        self.allocs.len()
    }

    pub fn service_count(&self) -> usize {
        self.by_service.len()
    }

    /// Keys of every Service that holds an address.
    pub fn services(&self) -> impl Iterator<Item = &String> {
        self.by_service.keys()
    }

    /// Pairs of pools (by name) whose ranges overlap, with the first overlap found.
    pub fn overlaps(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (i, a) in self.pools.iter().enumerate() {
            for b in &self.pools[i + 1..] {
                if a.ranges
                    .iter()
                    .any(|ra| b.ranges.iter().any(|rb| ra.overlaps(rb)))
                {
                    out.entry(a.name.clone()).or_default().push(b.name.clone());
                    out.entry(b.name.clone()).or_default().push(a.name.clone());
                }
            }
        }
        out
    }

    /// Usage of one pool per family it has. `free` counts usable addresses nobody holds.
    pub fn usage(&self, pool: &str) -> Vec<Usage> {
        let Some(p) = self.pools.iter().find(|p| p.name == pool) else {
            return Vec::new();
        };
        [Family::V4, Family::V6]
            .into_iter()
            .filter(|f| p.has_family(*f))
            .map(|family| {
                let mut allocated = 0u64;
                let mut allocated_usable = 0u128;
                for r in p.ranges.iter().filter(|r| r.family == family) {
                    for ip in self
                        .allocs
                        .range(r.first_ip()..=r.last_ip())
                        .map(|(ip, _)| ip)
                    {
                        allocated += 1;
                        if p.offers(ip) {
                            allocated_usable += 1;
                        }
                    }
                }
                Usage {
                    family,
                    allocated,
                    free: p.usable(family).saturating_sub(allocated_usable),
                }
            })
            .collect()
    }

    /// Can a Service (key, sharing key, ports) hold `ip` alongside its current holders?
    /// `Err` carries the refusal to report.
    fn can_hold(
        &self,
        ip: &IpAddr,
        key: &str,
        sharing_key: Option<&str>,
        ports: &[PortProto],
    ) -> Result<(), (String, Option<String>)> {
        let Some(holders) = self.allocs.get(ip) else {
            return Ok(());
        };
        for (other, h) in holders.iter().filter(|(k, _)| k.as_str() != key) {
            match (sharing_key, h.sharing_key.as_deref()) {
                (Some(a), Some(b)) if a == b => {
                    if let Some(p) = ports.iter().find(|p| h.ports.contains(p)) {
                        return Err((
                            other.clone(),
                            Some(format!("both use port {}/{}", p.port, p.protocol)),
                        ));
                    }
                }
                (Some(a), Some(b)) => {
                    return Err((
                        other.clone(),
                        Some(format!("sharing keys differ ({a:?} vs {b:?})")),
                    ));
                }
                (Some(_), None) => {
                    return Err((
                        other.clone(),
                        Some(format!("{other} does not allow sharing")),
                    ));
                }
                (None, _) => return Err((other.clone(), None)),
            }
        }
        Ok(())
    }

    fn first_pool_offering(&self, ip: &IpAddr) -> Option<&Pool> {
        self.pools.iter().find(|p| p.offers(ip))
    }

    /// Whether a held address still fits the Service's request.
    fn still_fits(&self, req: &Request, ip: &IpAddr, holding: Option<&Holding>) -> bool {
        let family = Family::of(ip);
        if !req.wants(family) {
            return false;
        }
        if let Some(want) = req.requested_ip(family)
            && want != *ip
        {
            return false;
        }
        if let Some(pool) = &req.pool {
            let drawn_from = holding.and_then(|h| h.pool.as_deref()) == Some(pool.as_str());
            let offered = self.pools.iter().any(|p| &p.name == pool && p.offers(ip));
            if !drawn_from && !offered {
                return false;
            }
        }
        self.can_hold(ip, &req.key, req.sharing_key.as_deref(), &req.ports)
            .is_ok()
    }

    /// Makes the Service hold one address per wanted family, keeping what it already
    /// holds where that still fits, adopting `status_ips` the first time a Service is
    /// seen, and drawing the rest from pools. All-or-nothing for required families:
    /// on `Err` nothing changed.
    pub fn ensure(&mut self, req: &Request, status_ips: &[IpAddr]) -> Result<Outcome, Refusal> {
        let mut outcome = Outcome::default();
        // What the Service holds now: in the allocator, or (first sight) in its status.
        let first_sight = !self.by_service.contains_key(&req.key);
        let current: Vec<IpAddr> = if first_sight {
            let mut adopt = Vec::new();
            for ip in status_ips {
                if !req.wants(Family::of(ip))
                    || adopt.iter().any(|o| Family::of(o) == Family::of(ip))
                {
                    continue;
                }
                if let Err((holder, _)) =
                    self.can_hold(ip, &req.key, req.sharing_key.as_deref(), &req.ports)
                {
                    // Whether the share became illegal or two Services claim one address:
                    // report, don't renumber.
                    if self.still_fits_ignoring_sharing(req, ip) {
                        return Err(Refusal::Conflict { ip: *ip, holder });
                    }
                    continue;
                }
                adopt.push(*ip);
            }
            adopt
        } else {
            self.held(&req.key).to_vec()
        };

        let mut plan: Vec<(IpAddr, Option<String>)> = Vec::new();
        for want in &req.families {
            let holding_now = current.iter().find(|ip| Family::of(ip) == want.family);
            if let Some(ip) = holding_now {
                let holding = self.allocs.get(ip).and_then(|h| h.get(&req.key));
                if self.still_fits(req, ip, holding) {
                    let pool = holding
                        .and_then(|h| h.pool.clone())
                        .or_else(|| self.first_pool_offering(ip).map(|p| p.name.clone()));
                    if first_sight {
                        outcome.adopted.push(*ip);
                    }
                    if !self.pools.iter().any(|p| p.covers(ip)) {
                        outcome.outside_pools.push(*ip);
                    }
                    plan.push((*ip, pool));
                    continue;
                }
            }
            match self.pick(req, want.family) {
                Ok((ip, pool)) => {
                    outcome.allocated.push(ip);
                    plan.push((ip, pool));
                }
                Err(e) if want.required => return Err(e),
                Err(e) => outcome.missing_optional.push(e),
            }
        }

        // Apply.
        let keep: Vec<IpAddr> = plan.iter().map(|(ip, _)| *ip).collect();
        if !first_sight {
            for ip in current.iter().filter(|ip| !keep.contains(ip)) {
                self.drop_holding(&req.key, ip);
                outcome.released.push(*ip);
            }
        }
        for (ip, pool) in plan {
            self.insert_holding(
                &req.key,
                ip,
                Holding {
                    sharing_key: req.sharing_key.clone(),
                    ports: req.ports.clone(),
                    pool,
                },
            );
        }
        self.by_service.insert(req.key.clone(), keep.clone());
        if keep.is_empty() {
            self.by_service.remove(&req.key);
        }
        outcome.ips = keep;
        Ok(outcome)
    }

    fn still_fits_ignoring_sharing(&self, req: &Request, ip: &IpAddr) -> bool {
        req.wants(Family::of(ip)) && req.requested_ip(Family::of(ip)).is_none_or(|w| w == *ip)
    }

    /// Records a Service's status addresses without checking its request, for the
    /// rebuild before the first allocation. Returns the conflicts found (the
    /// address stays with its first holder; the later Service gets nothing here).
    pub fn adopt(
        &mut self,
        key: &str,
        ips: &[IpAddr],
        sharing_key: Option<&str>,
        ports: &[PortProto],
    ) -> Vec<RebuildConflict> {
        let mut held = self.held(key).to_vec();
        // All or nothing: a Service with one conflicting address adopts none of them, so
        // it is left for a human (the conflict path) and never half-renumbered later.
        let conflicts: Vec<RebuildConflict> = ips
            .iter()
            .filter(|ip| !held.contains(ip))
            .filter_map(|ip| {
                self.can_hold(ip, key, sharing_key, ports)
                    .err()
                    .map(|(holder, _)| RebuildConflict {
                        service: key.to_string(),
                        ip: *ip,
                        holder,
                    })
            })
            .collect();
        if !conflicts.is_empty() {
            return conflicts;
        }
        for ip in ips {
            if held.contains(ip) {
                continue;
            }
            let pool = self.first_pool_offering(ip).map(|p| p.name.clone());
            self.insert_holding(
                key,
                *ip,
                Holding {
                    sharing_key: sharing_key.map(str::to_string),
                    ports: ports.to_vec(),
                    pool,
                },
            );
            held.push(*ip);
        }
        if !held.is_empty() {
            self.by_service.insert(key.to_string(), held);
        }
        conflicts
    }

    /// Releases everything a Service holds (deleted, or no longer ours).
    pub fn release(&mut self, key: &str) -> Vec<IpAddr> {
        let ips = self.by_service.remove(key).unwrap_or_default();
        for ip in &ips {
            self.drop_holding(key, ip);
        }
        ips
    }

    fn insert_holding(&mut self, key: &str, ip: IpAddr, holding: Holding) {
        if let Some(k) = &holding.sharing_key {
            self.by_sharing_key.entry(k.clone()).or_default().insert(ip);
        }
        let holders = self.allocs.entry(ip).or_default();
        if let Some(old) = holders.insert(key.to_string(), holding)
            && let Some(k) = old.sharing_key
        {
            self.clean_sharing_index(&k, &ip);
        }
    }

    fn drop_holding(&mut self, key: &str, ip: &IpAddr) {
        let Some(holders) = self.allocs.get_mut(ip) else {
            return;
        };
        let old = holders.remove(key);
        if holders.is_empty() {
            self.allocs.remove(ip);
            // Let the cursors of every range over this address go back to it.
            let v = ip_to_u128(ip);
            for p in &self.pools {
                for (ri, r) in p.ranges.iter().enumerate() {
                    if r.contains(ip)
                        && let Some(c) = self.cursors.get_mut(&(p.name.clone(), ri))
                    {
                        *c = (*c).min(v);
                    }
                }
            }
        }
        if let Some(k) = old.and_then(|h| h.sharing_key) {
            self.clean_sharing_index(&k, ip);
        }
    }

    fn clean_sharing_index(&mut self, sharing_key: &str, ip: &IpAddr) {
        let still = self.allocs.get(ip).is_some_and(|h| {
            h.values()
                .any(|h| h.sharing_key.as_deref() == Some(sharing_key))
        });
        if !still && let Some(set) = self.by_sharing_key.get_mut(sharing_key) {
            set.remove(ip);
            if set.is_empty() {
                self.by_sharing_key.remove(sharing_key);
            }
        }
    }

    /// Chooses a new address of `family` for the Service (read-only but for cursors).
    fn pick(&mut self, req: &Request, family: Family) -> Result<(IpAddr, Option<String>), Refusal> {
        let allowed = |p: &Pool| p.admits(&req.labels, &req.namespace_labels);

        // A specific address.
        if let Some(ip) = req.requested_ip(family) {
            let pool = self
                .pools
                .iter()
                .filter(|p| req.pool.as_ref().is_none_or(|n| &p.name == n))
                .find(|p| p.offers(&ip) && allowed(p))
                .map(|p| p.name.clone());
            let Some(pool) = pool else {
                if let Some(p) = self
                    .pools
                    .iter()
                    .filter(|p| req.pool.as_ref().is_none_or(|n| &p.name == n))
                    .find(|p| p.reserves(&ip) && allowed(p))
                {
                    return Err(Refusal::Reserved {
                        ip,
                        pool: p.name.clone(),
                    });
                }
                return Err(Refusal::OutsidePools { ip });
            };
            return match self.can_hold(&ip, &req.key, req.sharing_key.as_deref(), &req.ports) {
                Ok(()) => Ok((ip, Some(pool))),
                Err((holder, Some(reason))) => Err(Refusal::SharingConflict { ip, holder, reason }),
                Err((holder, None)) => Err(Refusal::InUse { ip, holder }),
            };
        }

        // Candidate pools, in order.
        let candidates: Vec<usize> = match &req.pool {
            Some(name) => {
                let Some(i) = self.pools.iter().position(|p| &p.name == name) else {
                    return Err(Refusal::PoolNotFound { pool: name.clone() });
                };
                let p = &self.pools[i];
                if !allowed(p) {
                    return Err(Refusal::PoolNotAllowed {
                        pool: name.clone(),
                        reason: "the pool's serviceSelector/namespaceSelector does not match"
                            .into(),
                    });
                }
                if !p.has_family(family) {
                    return Err(Refusal::UnsupportedFamily {
                        reason: format!("pool {name:?} has no {family} addresses"),
                    });
                }
                vec![i]
            }
            None => {
                let c: Vec<usize> = (0..self.pools.len())
                    .filter(|&i| {
                        let p = &self.pools[i];
                        p.auto_assign && p.has_family(family) && allowed(p)
                    })
                    .collect();
                if c.is_empty() {
                    if self.pools.iter().any(|p| p.has_family(family)) {
                        return Err(Refusal::NoMatchingPool { family });
                    }
                    return Err(Refusal::UnsupportedFamily {
                        reason: format!("no pool offers {family} addresses"),
                    });
                }
                c
            }
        };

        // Join an existing share.
        if let Some(sk) = &req.sharing_key
            && let Some(ips) = self.by_sharing_key.get(sk)
        {
            for ip in ips.iter().filter(|ip| Family::of(ip) == family) {
                let in_candidate = candidates.iter().any(|&i| self.pools[i].offers(ip));
                if in_candidate && self.can_hold(ip, &req.key, Some(sk), &req.ports).is_ok() {
                    let pool = candidates
                        .iter()
                        .map(|&i| &self.pools[i])
                        .find(|p| p.offers(ip));
                    return Ok((*ip, pool.map(|p| p.name.clone())));
                }
            }
        }

        // A free address, lowest first, pool by pool.
        for &i in &candidates {
            for ri in 0..self.pools[i].ranges.len() {
                if self.pools[i].ranges[ri].family != family {
                    continue;
                }
                if let Some(ip) = self.first_free(i, ri) {
                    return Ok((ip, Some(self.pools[i].name.clone())));
                }
            }
        }
        Err(Refusal::PoolExhausted {
            family,
            pools: candidates
                .iter()
                .map(|&i| self.pools[i].name.clone())
                .collect(),
        })
    }

    /// The lowest usable address nobody holds in range `ri` of pool `pi`. Walks the
    /// allocated addresses from the range's cursor; never enumerates free space.
    fn first_free(&mut self, pi: usize, ri: usize) -> Option<IpAddr> {
        let pool = &self.pools[pi];
        let r = pool.ranges[ri];
        let avoid = pool.avoid_buggy_ips;
        let reserved: Vec<u128> = pool
            .reserved
            .iter()
            .filter(|ip| r.contains(ip))
            .map(ip_to_u128)
            .collect();
        let key = (pool.name.clone(), ri);
        let usable = |v: u128| !(reserved.contains(&v) || (avoid && is_buggy(r.family, v)));
        let mut x = self
            .cursors
            .get(&key)
            .copied()
            .unwrap_or(r.start)
            .max(r.start);
        // Skip unusable addresses at x; returns None past the end.
        let advance = |mut x: u128| -> Option<u128> {
            while !usable(x) {
                if x == r.end {
                    return None;
                }
                x += 1;
            }
            Some(x)
        };
        let mut cand = advance(x);
        if let Some(c) = cand {
            for (ip, _) in self.allocs.range(u128_to_ip(r.family, c)..=r.last_ip()) {
                let v = ip_to_u128(ip);
                let c = cand?;
                if v < c {
                    continue;
                }
                if v > c {
                    break;
                }
                // v == c: taken, move on.
                if c == r.end {
                    cand = None;
                    break;
                }
                cand = advance(c + 1);
            }
        }
        x = cand.unwrap_or(r.end);
        self.cursors.insert(key, x);
        cand.map(|v| u128_to_ip(r.family, v))
    }
}
