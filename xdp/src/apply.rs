//! The apply path: plans against the loader's view of the maps and writes the
//! difference through a map layer (`maps::Maps`), whichever it is. After a failed
//! write it re-reads the maps, so the next apply converges from the truth; if that
//! re-read fails too, the view is unknown and nothing is planned until a re-read
//! succeeds (`state::View`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ringlb_datapath::Error as SeamError;
use ringlb_nexthop::{NextHop, Resolver};

use crate::maps::{Maps, read_back, run_ops};
use crate::state::{View, plan, plan_update};
use crate::vip_filter::VipFilter;
use crate::{
    ApplyStats, Counters, Datapath, DesiredState, Error, MapOp, Programmed, ServiceEntry, Vip, abi,
};

/// A map layer, the loader's view of it, and the next-hop resolver.
pub struct Applier<M> {
    maps: M,
    /// What the maps hold, or unknown after a failed write whose re-read
    /// failed too.
    view: View,
    resolver: Box<dyn Resolver>,
}

impl<M: Maps> Applier<M> {
    /// Reads what `maps` hold (pinned maps of an earlier run, or nothing) and
    /// rebuilds the VIP address filter from them: the owner of the maps (the edge).
    pub fn new(maps: M, resolver: Box<dyn Resolver>) -> Result<Self, Error> {
        let mut me = Self::observer(maps, resolver)?;
        me.rebuild_vip_filter()?;
        me.sync_vip_addrs()?;
        Ok(me)
    }

    /// Reads what `maps` hold and writes nothing: for the operator CLI beside a
    /// running edge, whose filter words a rebuild from this (older) read could
    /// overwrite, clearing the bit of a VIP the edge has just added.
    pub fn observer(maps: M, resolver: Box<dyn Resolver>) -> Result<Self, Error> {
        let mut me = Self {
            maps,
            view: View::default(),
            resolver,
        };
        me.view.set(me.read_programmed()?);
        Ok(me)
    }

    pub fn maps(&self) -> &M {
        &self.maps
    }

    pub fn maps_mut(&mut self) -> &mut M {
        &mut self.maps
    }

    /// What the loader believes the maps hold (possibly out of date while
    /// [`Self::view_known`] is false).
    pub fn programmed(&self) -> &Programmed {
        &self.view
    }

    /// False after a failed write whose re-read failed too: the next apply
    /// re-reads the maps first and refuses to plan until that succeeds.
    pub fn view_known(&self) -> bool {
        self.view.is_known()
    }

    /// Reconstructs what the maps hold (see [`read_back`]).
    pub fn read_programmed(&self) -> Result<Programmed, Error> {
        Ok(Programmed::restore(read_back(&self.maps)?))
    }

    /// Makes the maps hold `desired`, writing only what differs.
    pub fn apply(&mut self, desired: &DesiredState) -> Result<ApplyStats, Error> {
        self.ensure_view()?;
        let (ops, next) = plan(self.view.plannable()?, desired)?;
        let st = self.run_or_resync(&ops, next.last_generation)?;
        self.view.set(next);
        self.rebuild_vip_filter()?;
        self.sync_vip_addrs()?;
        Ok(st)
    }

    /// Makes `vip_addrs` exactly the view's own VIP addresses (every VIP but
    /// failover aliases), from a known view.
    fn sync_vip_addrs(&mut self) -> Result<(), Error> {
        if !self.view.is_known() {
            return Ok(());
        }
        let want = self.view.own_vip_addrs();
        let have = self.maps.vip_addrs()?;
        let add: Vec<IpAddr> = want.difference(&have).copied().collect();
        let del: Vec<IpAddr> = have.difference(&want).copied().collect();
        if add.is_empty() && del.is_empty() {
            return Ok(());
        }
        self.maps.vip_addrs_update(&add, &del)
    }

    /// Makes `vip_filter` exactly the view's VIP addresses: clears the bits of
    /// deleted VIPs (run_ops only ever sets bits). Only from a known view,
    /// which is what the `vips` map holds.
    fn rebuild_vip_filter(&mut self) -> Result<(), Error> {
        if !self.view.is_known() {
            return Ok(());
        }
        let f = VipFilter::of(self.view.vips.keys().map(|v| v.addr));
        self.maps.vip_filter_set(&f)
    }

    /// Changes one service (`None` removes it) without looking at any other:
    /// the fast path for a single Service/EndpointSlice event.
    pub fn apply_service(
        &mut self,
        vip: &Vip,
        entry: Option<&ServiceEntry>,
    ) -> Result<ApplyStats, Error> {
        self.ensure_view()?;
        let p = self.view.plannable()?;
        let was_own = p.is_own_vip_addr(vip.addr);
        let ops = plan_update(p, vip, entry)?;
        let tombstone_gen = p.last_generation;
        let own = p.is_own_vip_addr(vip.addr);
        let st = self.run_or_resync(&ops, tombstone_gen)?;
        // `vip_addrs` follows (a failed write above leaves it to the next
        // full apply, which makes it exact)
        match (was_own, own) {
            (false, true) => self.maps.vip_addrs_update(&[vip.addr], &[])?,
            (true, false) => self.maps.vip_addrs_update(&[], &[vip.addr])?,
            _ => {}
        }
        Ok(st)
    }

    /// Global and per-VIP counters of the VIPs in the view.
    pub fn counters(&self) -> Result<Counters, Error> {
        let vips: Vec<(Vip, u32)> = self.view.vips.iter().map(|(v, p)| (*v, p.vip_id)).collect();
        self.maps.counters(&vips)
    }

    /// Re-reads the maps if the view is unknown; errors while it stays so.
    fn ensure_view(&mut self) -> Result<(), Error> {
        if !self.view.is_known() {
            let read = self.read_programmed();
            self.view.reread(read)?;
            tracing::info!("re-read the maps after an earlier failure; planning resumes");
        }
        Ok(())
    }

    /// Runs `ops`; if a write fails the maps are somewhere between two states:
    /// re-read them, and if that fails too, mark the view unknown.
    fn run_or_resync(&mut self, ops: &[MapOp], tombstone_gen: u32) -> Result<ApplyStats, Error> {
        run_ops(&mut self.maps, self.resolver.as_ref(), ops, tombstone_gen).inspect_err(|e| {
            let read = self.read_programmed();
            self.view.write_failed(e, read);
        })
    }

    /// Re-resolves every backend's next hop and rewrites the entries that changed,
    /// in one batch. Each distinct pod address is resolved once, however many
    /// services (ids) it backs. Returns how many entries were rewritten.
    pub fn refresh_next_hops(&mut self) -> Result<usize, Error> {
        // After a failed write and a failed re-read the view may name ids
        // that are deleted in the maps: rewriting them would revive them.
        self.ensure_view()?;
        let mut by_addr: BTreeMap<IpAddr, Vec<(u32, u32, bool)>> = BTreeMap::new();
        for (_, addr, b) in self.view.backends() {
            by_addr
                .entry(*addr)
                .or_default()
                .push((b.id, b.generation, b.remote));
        }
        let (mut ids, mut vals) = (Vec::new(), Vec::new());
        let mut changes = NextHopChanges::default();
        for (addr, pairs) in by_addr {
            // a pod on this node has no next hop to resolve (`BE_F_LOCAL`)
            let local = self.resolver.is_local(addr);
            let nh = if local {
                Err(ringlb_nexthop::Error {
                    addr,
                    reason: "a pod on this node (passed to its stack)".into(),
                })
            } else {
                self.resolver.resolve(addr)
            };
            let new_nh = nh.as_ref().ok().copied();
            let mut old_nh = None;
            for (id, generation, remote) in pairs {
                let old = self.maps.backend(id)?.unwrap_or_default();
                let new =
                    abi::BackendValue::new(addr, generation, new_nh, remote).with_local(local);
                if new != old {
                    old_nh.get_or_insert(old.next_hop());
                    ids.push(id);
                    vals.push(new);
                }
            }
            match old_nh {
                Some(old_nh) if local => tracing::info!(
                    backend = %addr,
                    was = %show(old_nh),
                    "a pod on this node: its frames go up this node's stack for the node agent"
                ),
                Some(old_nh) => changes.record(addr, old_nh, nh),
                None if local => {}
                None => {
                    if let Err(e) = nh {
                        tracing::debug!(backend = %addr, error = %e, "next hop still unresolved");
                    }
                }
            }
        }
        // one BPF_MAP_UPDATE_BATCH for every changed id (a gateway change can move
        // every (VIP, pod) id at once)
        if !ids.is_empty() {
            self.maps.put_backends(&ids, &vals)?;
        }
        changes.log(); // once the maps hold it
        Ok(ids.len())
    }
}

impl<M: Maps> Datapath for Applier<M> {
    fn apply(&mut self, desired: &DesiredState) -> Result<ApplyStats, SeamError> {
        Ok(Applier::apply(self, desired)?)
    }
    fn apply_service(
        &mut self,
        vip: &Vip,
        entry: Option<&ServiceEntry>,
    ) -> Result<ApplyStats, SeamError> {
        Ok(Applier::apply_service(self, vip, entry)?)
    }
    fn refresh_next_hops(&mut self) -> Result<usize, SeamError> {
        Ok(Applier::refresh_next_hops(self)?)
    }
    fn counters(&mut self) -> Result<Counters, SeamError> {
        Ok(Applier::counters(self)?)
    }
    fn uninstall(self) -> Result<(), SeamError> {
        Ok(()) // nothing outside the map layer, which goes with `self`
    }
}

/// The next-hop changes of one refresh, for one log line per change of an
/// (interface, next hop), not one per pod (a ToR MAC change moves them all).
#[derive(Default)]
struct NextHopChanges {
    /// (old, new) next hop -> pods that moved
    moved: BTreeMap<(Option<NextHop>, Option<NextHop>), usize>,
    /// the first pod that lost its next hop, and how many did
    lost: Option<(IpAddr, ringlb_nexthop::Error)>,
    lost_count: usize,
}

impl NextHopChanges {
    fn record(
        &mut self,
        addr: IpAddr,
        old: Option<NextHop>,
        new: Result<NextHop, ringlb_nexthop::Error>,
    ) {
        let new_nh = new.as_ref().ok().copied();
        tracing::debug!(backend = %addr, old = %show(old), new = %show(new_nh), "next hop changed");
        *self.moved.entry((old, new_nh)).or_default() += 1;
        // Refreshes run on every netlink change: an unresolved pod is reported
        // when it loses its next hop, not on every refresh.
        if let (Some(_), Err(e)) = (old, new) {
            self.lost_count += 1;
            self.lost.get_or_insert((addr, e));
        }
    }

    fn log(&self) {
        for ((old, new), pods) in &self.moved {
            if old.is_some() && new.is_some() {
                tracing::info!(old = %show(*old), new = %show(*new), pods, "next hop changed");
            } else if old.is_none() {
                tracing::info!(new = %show(*new), pods, "next hop resolved");
            }
        }
        if let Some((addr, e)) = &self.lost {
            tracing::warn!(pods = self.lost_count, example = %addr, error = %e, "next hop lost; the program will use bpf_fib_lookup for these pods");
        }
    }
}

fn show(nh: Option<NextHop>) -> String {
    nh.map_or_else(|| "unresolved".to_string(), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use ringlb_nexthop::StaticResolver;

    use super::*;
    use crate::maps::memory::MemoryMaps;
    use crate::state::{DesiredState, Proto};

    fn vip(n: u8) -> Vip {
        Vip {
            addr: IpAddr::from([10, 100, 0, n]),
            port: 80,
            proto: Proto::Tcp,
        }
    }

    fn entry(v: &Vip, pods: &[u8], size: u32) -> ServiceEntry {
        let backends: Vec<IpAddr> = pods.iter().map(|p| IpAddr::from([10, 1, 0, *p])).collect();
        let ring = (0..size).map(|s| s % pods.len() as u32).collect();
        ServiceEntry::new(v, backends, ring).unwrap()
    }

    fn desired(entries: &[(Vip, ServiceEntry)]) -> DesiredState {
        DesiredState {
            services: entries.iter().cloned().collect(),
        }
    }

    fn applier(maps: MemoryMaps) -> Applier<MemoryMaps> {
        Applier::new(maps, Box::new(StaticResolver::default())).unwrap()
    }

    /// Every slot of every VIP in `maps` names a live backend of `want`, and the
    /// planner has nothing left to do.
    fn converged(a: &Applier<MemoryMaps>, want: &DesiredState) {
        let m = a.maps();
        assert_eq!(m.vips.len(), want.services.len());
        // the filter: exactly the VIP addresses once a full apply succeeded
        let f = crate::vip_filter::VipFilter::of(m.vips.keys().map(|v| v.addr));
        assert_eq!(m.vip_filter, f, "vip_filter");
        for (v, info) in &m.vips {
            let ring = &m.rings[&info.vip_id];
            assert_eq!(ring.len(), info.ring_size as usize);
            for id in ring {
                let b = m.backends[id];
                let addr = b.addr.to_ip(b.family).expect("live backend");
                assert!(want.services[v].backends().contains(&addr), "{v}: {addr}");
            }
        }
        let (ops, _) = plan(a.programmed(), want).unwrap();
        assert!(ops.is_empty(), "{ops:?}");
    }

    /// Services that arrive together get their rings in one flush, and so do
    /// services that go together; resized rings need one for the new rings
    /// and one for the old.
    #[test]
    fn rings_of_services_arriving_or_going_together_are_flushed_once() {
        let mut a = applier(MemoryMaps::default());
        let many: Vec<(Vip, ServiceEntry)> = (1..=20)
            .map(|n| (vip(n), entry(&vip(n), &[n, n + 1], 7)))
            .collect();
        a.apply(&desired(&many)).unwrap();
        assert_eq!(a.maps().ring_flushes, 1);
        converged(&a, &desired(&many));

        let mut resized = many.clone();
        for i in [3, 5, 7] {
            let v = resized[i].0;
            resized[i].1 = entry(&v, &[4, 5], 11);
        }
        a.apply(&desired(&resized)).unwrap();
        assert_eq!(a.maps().ring_flushes, 3);
        converged(&a, &desired(&resized));

        a.apply(&desired(&resized[..2])).unwrap();
        assert_eq!(a.maps().ring_flushes, 4);
        converged(&a, &desired(&resized[..2]));
    }

    /// `vip_addrs` holds this edge's own VIP addresses, not a failover alias's,
    /// after a full apply and through single-service changes.
    #[test]
    fn vip_addrs_follow_own_vips_but_not_aliases() {
        let (own, own2, alias) = (
            vip(1),
            Vip {
                port: 443,
                ..vip(1)
            },
            vip(2),
        );
        let al = entry(&alias, &[3], 7).as_failover_alias(&alias).unwrap();
        let mut a = applier(MemoryMaps::default());
        a.apply(&desired(&[
            (own, entry(&own, &[1], 7)),
            (alias, al.clone()),
        ]))
        .unwrap();
        let addrs = |a: &Applier<MemoryMaps>| a.maps().vip_addrs.clone();
        assert_eq!(addrs(&a), [own.addr].into_iter().collect());
        // a second VIP on the address, then the first one leaves: it stays
        a.apply_service(&own2, Some(&entry(&own2, &[1], 7)))
            .unwrap();
        a.apply_service(&own, None).unwrap();
        assert_eq!(addrs(&a), [own.addr].into_iter().collect());
        a.apply_service(&own2, None).unwrap();
        assert!(addrs(&a).is_empty());
        // the alias's address turns into an own VIP's
        a.apply_service(&alias, Some(&entry(&alias, &[3], 7)))
            .unwrap();
        assert_eq!(addrs(&a), [alias.addr].into_iter().collect());
        // a full apply makes it exact whatever the map held
        a.maps_mut().vip_addrs.insert(vip(9).addr);
        a.apply(&desired(&[(alias, al)])).unwrap();
        assert!(addrs(&a).is_empty());
    }

    /// The operator CLI's view beside a running edge writes nothing, not even the
    /// filter an owner's start rebuilds (it could clear a bit the edge just set).
    #[test]
    fn an_observer_reads_and_writes_nothing() {
        let v = vip(1);
        let mut owner = applier(MemoryMaps::default());
        owner
            .apply(&desired(&[(v, entry(&v, &[1, 2], 7))]))
            .unwrap();
        let mut maps = owner.maps().clone();
        maps.vip_filter = crate::vip_filter::VipFilter::default();
        let before = maps.writes;
        let seen = Applier::observer(maps, Box::new(StaticResolver::default())).unwrap();
        assert_eq!(seen.maps().writes, before, "an observer wrote");
        assert_eq!(
            seen.maps().vip_filter,
            crate::vip_filter::VipFilter::default()
        );
        assert!(
            seen.programmed().vips.contains_key(&v),
            "it still reads the maps"
        );
        // the owner's constructor does rebuild it
        let rebuilt = applier(seen.maps().clone());
        assert_ne!(
            rebuilt.maps().vip_filter,
            crate::vip_filter::VipFilter::default()
        );
    }

    /// The real apply path with a map write failing at every point of a change:
    /// the apply reports the error, the loader re-reads the maps, and the next
    /// apply converges from the truth.
    #[test]
    fn a_failed_write_at_any_point_is_reread_and_the_next_apply_converges() {
        let (a, b, c) = (vip(1), vip(2), vip(3));
        let before = desired(&[(a, entry(&a, &[1, 2], 7)), (b, entry(&b, &[2, 3], 7))]);
        let after = desired(&[(a, entry(&a, &[2, 4], 7)), (c, entry(&c, &[1, 5], 11))]);
        let mut base = applier(MemoryMaps::default());
        base.apply(&before).unwrap();
        let total = {
            let mut probe = applier(base.maps().clone());
            let w0 = probe.maps().writes;
            probe.apply(&after).unwrap();
            probe.maps().writes - w0
        };
        assert!(total > 3, "a change of several writes: {total}");
        for k in 0..total {
            let mut ap = applier(base.maps().clone());
            ap.maps_mut().fail_after = Some(k);
            let err = ap.apply(&after).expect_err("write {k} fails");
            assert!(err.to_string().contains("injected"), "{err}");
            assert!(ap.view_known(), "the re-read succeeded");
            assert_eq!(
                ap.programmed().vips.keys().collect::<Vec<_>>(),
                ap.read_programmed()
                    .unwrap()
                    .vips
                    .keys()
                    .collect::<Vec<_>>(),
                "failure at write {k}: the view is what the maps hold"
            );
            ap.maps_mut().fail_after = None;
            ap.apply(&after)
                .unwrap_or_else(|e| panic!("failure at write {k}, then: {e}"));
            converged(&ap, &after);
        }
    }

    /// When the re-read after a failed write fails too, nothing is planned from
    /// the unknown view: applies fail until a re-read succeeds, then converge.
    #[test]
    fn an_unknown_view_plans_nothing_until_a_reread_succeeds() {
        let a = vip(1);
        let want = desired(&[(a, entry(&a, &[1, 2], 7))]);
        let mut ap = applier(MemoryMaps::default());
        ap.maps_mut().fail_after = Some(1);
        ap.maps_mut().fail_reads = true;
        ap.apply(&want).expect_err("the second write fails");
        assert!(!ap.view_known());
        let writes = ap.maps().writes;
        ap.maps_mut().fail_after = None;
        let e = ap.apply(&want).expect_err("the re-read fails again");
        assert_eq!(ap.maps().writes, writes, "nothing written: {e}");
        assert!(ap.refresh_next_hops().is_err(), "no refresh either");
        ap.maps_mut().fail_reads = false;
        ap.apply(&want).unwrap();
        assert!(ap.view_known());
        converged(&ap, &want);
    }
}
