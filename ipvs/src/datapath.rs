//! `IpvsDatapath`: the planner over a kernel layer. It plans against its view
//! of what the kernel holds and writes the difference one operation at a time.
//! After a failed write it re-reads the kernel, so the next apply converges
//! from the truth; if that re-read fails too, the view is unknown and nothing
//! is planned until a re-read succeeds (ringlb-xdp's `apply.rs` rule).
//!
//! Which services are ringlb's: those on a VIP ringlb bound (marked, see
//! `codec::addr`) or on a VIP it is asked to serve. Anyone else's (an
//! operator's, kube-proxy's) are never read into the view, so never changed.
//!
//! With a guard ([`IpvsDatapath::with_guard`], `crate::guard`) every apply also
//! sets the nftables table in front of IPVS to what is served, before the IPVS
//! writes, so a VIP:port with source ranges is never open, not even for the
//! moment between two writes; when no VIP is left, the table goes after them,
//! with the last service. A guard that cannot be written fails the apply before
//! IPVS is touched.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ringlb_datapath::SourceRange;

use crate::guard::nft::Nft;
use crate::guard::{Guard, GuardCounters};
use crate::kernel::Kernel;
use crate::model::{ServiceKey, Stats};
use crate::plan::{self, Backend, Config, Desired, Held, HeldService, Op};
use crate::{Error, plan::plan_service};

/// What one apply wrote, for logs and the update-latency benchmark.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyStats {
    pub services_created: usize,
    pub services_updated: usize,
    pub services_deleted: usize,
    pub dests_added: usize,
    pub dests_updated: usize,
    pub dests_deleted: usize,
    pub vips_bound: usize,
    pub vips_unbound: usize,
}

impl ApplyStats {
    fn count(&mut self, op: &Op) {
        let n = match op {
            Op::NewService(_) => &mut self.services_created,
            Op::SetService(_) => &mut self.services_updated,
            Op::DelService(_) => &mut self.services_deleted,
            Op::NewDest(..) => &mut self.dests_added,
            Op::SetDest(..) => &mut self.dests_updated,
            Op::DelDest(..) => &mut self.dests_deleted,
            Op::BindVip(_) => &mut self.vips_bound,
            Op::UnbindVip(_) => &mut self.vips_unbound,
        };
        *n += 1;
    }
}

/// The IPVS datapath over a kernel layer `K`.
pub struct IpvsDatapath<K> {
    kernel: K,
    cfg: Config,
    view: Held,
    /// Why the view is unknown (a failed write whose re-read failed too).
    unknown: Option<String>,
    /// The nftables guard, when made with one.
    guard: Option<Guard>,
}

impl<K: Kernel> IpvsDatapath<K> {
    /// Reads what ringlb left in the kernel (services on its marked VIPs).
    pub fn new(mut kernel: K, cfg: Config) -> Result<Self, Error> {
        let view = read_held(&mut kernel, &BTreeSet::new())?;
        Ok(IpvsDatapath {
            kernel,
            cfg,
            view,
            unknown: None,
            guard: None,
        })
    }

    /// [`Self::new`] with the nftables guard over `nft` (source ranges enforced,
    /// unused ports of a VIP address dropped and counted). Nothing is written
    /// until the first apply: a restarted edge keeps its earlier table until then.
    pub fn with_guard(kernel: K, cfg: Config, nft: Box<dyn Nft>) -> Result<Self, Error> {
        let mut dp = Self::new(kernel, cfg)?;
        dp.guard = Some(Guard::new(nft));
        Ok(dp)
    }

    /// The guard, when there is one.
    pub fn guard(&self) -> Option<&Guard> {
        self.guard.as_ref()
    }

    pub fn kernel(&self) -> &K {
        &self.kernel
    }
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    pub fn kernel_mut(&mut self) -> &mut K {
        &mut self.kernel
    }
    /// What the datapath believes the kernel holds (possibly stale while
    /// [`Self::view_known`] is false).
    pub fn held(&self) -> &Held {
        &self.view
    }
    /// False after a failed write whose re-read failed too.
    pub fn view_known(&self) -> bool {
        self.unknown.is_none()
    }

    /// Reads ringlb's part of the kernel: services on its VIPs or on `also`.
    pub fn read_held(&mut self, also: &BTreeSet<IpAddr>) -> Result<Held, Error> {
        read_held(&mut self.kernel, also)
    }

    /// Makes the kernel hold `desired`, writing only what differs (the guard
    /// too, when there is one).
    pub fn apply(&mut self, desired: &Desired) -> Result<ApplyStats, Error> {
        let admitted = desired
            .services
            .keys()
            .map(|k| (*k, desired.source_ranges.get(k).cloned()))
            .collect();
        self.guarded(|g| g.admit_all(admitted), |dp| dp.apply_ipvs(desired))
    }

    fn apply_ipvs(&mut self, desired: &Desired) -> Result<ApplyStats, Error> {
        let addrs: BTreeSet<IpAddr> = desired.services.keys().map(|k| k.addr).collect();
        self.ensure_view(&addrs)?;
        self.adopt(&addrs)?;
        let ops = plan::plan(&self.view, desired, &self.cfg)?;
        self.run(&ops, &addrs)
    }

    /// Changes one service (`None` removes it) without looking at any other;
    /// `affinity` as in [`Desired::affinity`], `source_ranges` as in
    /// [`Desired::source_ranges`].
    pub fn apply_service(
        &mut self,
        key: &ServiceKey,
        backends: Option<&[Backend]>,
        affinity: Option<u32>,
        source_ranges: Option<&BTreeSet<SourceRange>>,
    ) -> Result<ApplyStats, Error> {
        self.guarded(
            |g| g.admit(*key, backends.is_some(), source_ranges),
            |dp| {
                let addrs = BTreeSet::from([key.addr]);
                dp.ensure_view(&addrs)?;
                if backends.is_some() {
                    dp.adopt(&addrs)?;
                }
                let ops = plan_service(&dp.view, key, backends, affinity, &dp.cfg)?;
                dp.run(&ops, &addrs)
            },
        )
    }

    /// Runs `write` (the IPVS writes) with the guard changed by `admit`: synced
    /// before `write`, or after it when nothing is left to serve (see the module
    /// doc). Without a guard, `write` alone.
    fn guarded(
        &mut self,
        admit: impl FnOnce(&mut Guard),
        write: impl FnOnce(&mut Self) -> Result<ApplyStats, Error>,
    ) -> Result<ApplyStats, Error> {
        let Some(guard) = self.guard.as_mut() else {
            return write(self);
        };
        admit(guard);
        if !guard.admitted().is_empty() {
            guard.sync()?;
            return write(self);
        }
        let written = write(self);
        let removed = self.guard.as_mut().map(Guard::sync).transpose();
        let st = written?;
        removed?;
        Ok(st)
    }

    /// The guard's counters (`None`: no guard).
    pub fn guard_counters(&mut self) -> Result<Option<GuardCounters>, Error> {
        self.guard.as_mut().map(Guard::counters).transpose()
    }

    /// Per-service counters of ringlb's services.
    pub fn counters(&mut self) -> Result<Vec<(ServiceKey, Stats)>, Error> {
        Ok(self
            .kernel
            .services()?
            .into_iter()
            .filter(|(s, _)| self.view.services.contains_key(&s.key))
            .map(|(s, st)| (s.key, st))
            .collect())
    }

    /// Unbinds every VIP and deletes every service of ringlb's (and the
    /// guard's table).
    pub fn remove_all(&mut self) -> Result<ApplyStats, Error> {
        self.apply(&Desired::default())
    }

    /// [`Self::remove_all`], on exit.
    pub fn uninstall(mut self) -> Result<ApplyStats, Error> {
        self.remove_all()
    }

    /// Re-reads the kernel if the view is unknown; errors while it stays so.
    fn ensure_view(&mut self, also: &BTreeSet<IpAddr>) -> Result<(), Error> {
        if let Some(reason) = &self.unknown {
            match read_held(&mut self.kernel, also) {
                Ok(h) => {
                    self.view = h;
                    self.unknown = None;
                    tracing::info!("re-read IPVS after an earlier failure; planning resumes");
                }
                Err(e) => {
                    let reason = format!("{reason}; re-reading failed again ({e})");
                    self.unknown = Some(reason.clone());
                    return Err(Error::ViewUnknown { reason });
                }
            }
        }
        Ok(())
    }

    /// Reads into the view the services on `addrs` the view lacks (a VIP new
    /// to this datapath may already carry a service: an earlier run's whose
    /// VIP was unbound, or someone else's that ringlb now serves).
    fn adopt(&mut self, addrs: &BTreeSet<IpAddr>) -> Result<(), Error> {
        let new: BTreeSet<IpAddr> = addrs
            .iter()
            .filter(|a| !self.view.vips.contains(a))
            .copied()
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        for (service, _) in self.kernel.services()? {
            if new.contains(&service.key.addr) && !self.view.services.contains_key(&service.key) {
                let dests = self.kernel.dests(&service.key)?;
                tracing::info!(service = %service.key, "adopting an IPVS service already on a VIP to serve");
                self.view
                    .services
                    .insert(service.key, HeldService { service, dests });
            }
        }
        Ok(())
    }

    /// Runs `ops` in order, keeping the view in step; on a failed write,
    /// re-reads the kernel (or marks the view unknown).
    fn run(&mut self, ops: &[Op], also: &BTreeSet<IpAddr>) -> Result<ApplyStats, Error> {
        let mut st = ApplyStats::default();
        for op in ops {
            if let Err(e) = self.kernel.write(op) {
                let (verb, target) = op.describe();
                tracing::warn!(op = verb, target, error = %e, "IPVS write failed; re-reading the kernel");
                self.resync(&e, also);
                return Err(e);
            }
            if let Err(errno) = self.view.apply(op) {
                // The kernel took what the view says it could not: the view
                // is wrong. Re-read before the next plan.
                self.unknown = Some(format!(
                    "the view disagreed with the kernel on {op:?} ({errno})"
                ));
            }
            st.count(op);
        }
        Ok(st)
    }

    fn resync(&mut self, error: &Error, also: &BTreeSet<IpAddr>) {
        let mut also = also.clone();
        also.extend(self.view.services.keys().map(|k| k.addr));
        match read_held(&mut self.kernel, &also) {
            Ok(h) => {
                self.view = h;
                self.unknown = None;
            }
            Err(e) => {
                tracing::error!(write = %error, reread = %e, "an IPVS write failed and re-reading failed too: nothing is planned until a re-read succeeds");
                self.unknown = Some(format!(
                    "an IPVS write failed ({error}) and re-reading IPVS failed ({e})"
                ));
            }
        }
    }
}

/// ringlb's part of the kernel: its marked VIPs, and every service on one of
/// them or on `also`, with its real servers in list order.
fn read_held<K: Kernel>(kernel: &mut K, also: &BTreeSet<IpAddr>) -> Result<Held, Error> {
    let vips = kernel.vips()?;
    let mut held = Held {
        services: Default::default(),
        vips,
    };
    for (service, _) in kernel.services()? {
        let a = service.key.addr;
        if held.vips.contains(&a) || also.contains(&a) {
            let dests = kernel.dests(&service.key)?;
            held.services
                .insert(service.key, HeldService { service, dests });
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests;
