//! `IpvsDatapath` behind the edge agent's seam (`ringlb_datapath::Datapath`): the
//! seam's `DesiredState` becomes the planner's [`Desired`]. One virtual service per
//! VIP:port:protocol; its real servers are the entry's backends, weight 1 for those
//! the Maglev ring names and 0 for the draining ones (not in the ring: their
//! connections stay, new ones go elsewhere, `mh-fallback`). The ring itself is not
//! programmed: the kernel's `mh` builds its own table (docs/ipvs.md). Port 0 (the
//! XDP wildcard) is refused by the planner. Failover VIPs (docs/datapath.md): a
//! backend that is another region's VIP is a real server like a pod (tunnel
//! forwarding encapsulates to it); a failover alias is refused here, per VIP and
//! before anything is written: IPVS cannot take an IPIP packet to one VIP apart
//! and forward the inner packet by another VIP's service. Client affinity makes
//! the virtual service persistent (`plan::Config::service_with`). Source ranges
//! go to the guard (`crate::guard`), when the datapath has one; its counters are
//! the seam's global and per-VIP drop counters (docs/ipvs.md, "The guard").

use ringlb_datapath as seam;

use crate::kernel::Kernel;
use crate::model::{Forward, Proto, ServiceKey};
use crate::plan::{Backend, Desired};
use crate::{ApplyStats, Error, IpvsDatapath};

impl From<Error> for seam::Error {
    /// Behind the seam, under the same `metric_label()`.
    fn from(e: Error) -> Self {
        seam::Error::new(e.metric_label(), e)
    }
}

/// The virtual service of a seam VIP.
pub fn service_key(vip: &seam::Vip) -> ServiceKey {
    ServiceKey {
        addr: vip.addr,
        port: vip.port,
        proto: match vip.proto {
            seam::Proto::Tcp => Proto::Tcp,
            seam::Proto::Udp => Proto::Udp,
        },
    }
}

/// The real servers of a seam service: weight 1 where the ring names the backend,
/// 0 (draining) where it does not.
pub fn backends(entry: &seam::ServiceEntry) -> Vec<Backend> {
    entry
        .backends_in_ring()
        .into_iter()
        .map(|(addr, in_ring)| Backend {
            addr,
            weight: u32::from(in_ring),
        })
        .collect()
}

/// What IPVS cannot serve of a seam entry, as the planner's per-VIP error: a
/// failover alias (no decapsulation), and a remote-VIP backend without tunnel
/// forwarding (direct routing reaches on-link servers only).
pub fn check_entry(
    vip: &seam::Vip,
    entry: &seam::ServiceEntry,
    forward: Forward,
) -> Result<(), Error> {
    let bad = |reason: String| Error::InvalidService {
        service: service_key(vip).to_string(),
        reason,
    };
    if entry.failover_alias() {
        return Err(bad(
            "a failover alias needs the XDP datapath (IPVS cannot decapsulate failed-over traffic)"
                .into(),
        ));
    }
    if forward != Forward::Tunnel
        && let Some(r) = entry.remote_backends().first()
    {
        return Err(bad(format!(
            "remote VIP backend {r} needs tunnel forwarding"
        )));
    }
    Ok(())
}

/// The seam VIP of a TCP or UDP virtual service.
fn seam_vip(k: &ServiceKey) -> Option<seam::Vip> {
    let proto = match k.proto {
        Proto::Tcp => seam::Proto::Tcp,
        Proto::Udp => seam::Proto::Udp,
        Proto::Other(_) => return None,
    };
    Some(seam::Vip {
        addr: k.addr,
        port: k.port,
        proto,
    })
}

/// The planner's input for the seam's desired state.
pub fn desired(state: &seam::DesiredState) -> Desired {
    Desired {
        services: state
            .services
            .iter()
            .map(|(vip, e)| (service_key(vip), backends(e)))
            .collect(),
        affinity: state
            .services
            .iter()
            .filter_map(|(vip, e)| Some((service_key(vip), e.client_affinity()?)))
            .collect(),
        source_ranges: state
            .services
            .iter()
            .filter_map(|(vip, e)| Some((service_key(vip), e.source_ranges()?.clone())))
            .collect(),
    }
}

/// The seam's stats of an IPVS apply: a virtual service counts as a VIP, a real
/// server as a backend; no ring or slot is written (the kernel builds the table).
fn stats(st: ApplyStats) -> seam::ApplyStats {
    seam::ApplyStats {
        backends_written: st.dests_added + st.dests_updated,
        backends_deleted: st.dests_deleted,
        vips_written: st.services_created + st.services_updated,
        vips_deleted: st.services_deleted,
        ..Default::default()
    }
}

impl<K: Kernel> seam::Datapath for IpvsDatapath<K> {
    fn apply(&mut self, state: &seam::DesiredState) -> Result<seam::ApplyStats, seam::Error> {
        for (vip, e) in &state.services {
            check_entry(vip, e, self.config().forward)?;
        }
        Ok(stats(IpvsDatapath::apply(self, &desired(state))?))
    }

    fn apply_service(
        &mut self,
        vip: &seam::Vip,
        entry: Option<&seam::ServiceEntry>,
    ) -> Result<seam::ApplyStats, seam::Error> {
        if let Some(e) = entry {
            check_entry(vip, e, self.config().forward)?;
        }
        let b = entry.map(backends);
        let affinity = entry.and_then(|e| e.client_affinity());
        let ranges = entry.and_then(|e| e.source_ranges());
        let key = service_key(vip);
        let st = IpvsDatapath::apply_service(self, &key, b.as_deref(), affinity, ranges)?;
        Ok(stats(st))
    }

    /// Per VIP:port:protocol, packets and bytes in (the direction IPVS sees; with
    /// tunnel and DR forwarding replies bypass the edge). With a guard, its drops:
    /// global (`drop_no_service`, `drop_vip_icmp`, `drop_vip_other`,
    /// `drop_source_range`) and per VIP with ranges (`source_range`).
    fn counters(&mut self) -> Result<seam::Counters, seam::Error> {
        let per_vip = IpvsDatapath::counters(self)?
            .into_iter()
            .filter_map(|(k, st)| Some((seam_vip(&k)?, st.inpkts, st.inbytes)))
            .collect();
        let guard = self.guard_counters()?.unwrap_or_default();
        let per_vip_dropped = guard
            .per_service
            .iter()
            .filter_map(|(k, n)| Some((seam_vip(k)?, crate::guard::SOURCE_RANGE, *n)))
            .collect();
        Ok(seam::Counters {
            global: guard.global,
            per_vip,
            per_vip_dropped,
        })
    }

    /// Deletes ringlb's services, unbinds its VIPs and removes the guard's table.
    fn uninstall(self) -> Result<(), seam::Error> {
        IpvsDatapath::uninstall(self)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use ringlb_datapath::{Datapath, DesiredState, ServiceEntry, Vip};

    use super::*;
    use crate::kernel::memory::MemoryKernel;
    use crate::model::Forward;
    use crate::plan::Config;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn vip(port: u16) -> Vip {
        Vip {
            addr: ip("10.100.0.1"),
            port,
            proto: seam::Proto::Tcp,
        }
    }

    fn state(port: u16) -> DesiredState {
        let v = vip(port);
        // 10.1.0.3 is draining: in the backends, not in the ring
        let e = ServiceEntry::new(
            &v,
            vec![ip("10.1.0.1"), ip("10.1.0.2"), ip("10.1.0.3")],
            vec![0, 1, 1, 0, 1],
        )
        .unwrap();
        DesiredState {
            services: [(v, e)].into(),
        }
    }

    fn dp() -> IpvsDatapath<MemoryKernel> {
        IpvsDatapath::new(MemoryKernel::default(), Config::default()).unwrap()
    }

    #[test]
    fn a_seam_service_becomes_a_virtual_service_with_weights() {
        let mut dp = dp();
        let st = Datapath::apply(&mut dp, &state(80)).unwrap();
        assert_eq!((st.vips_written, st.backends_written), (1, 3));
        let held = &dp.held().services[&service_key(&vip(80))];
        assert_eq!(held.service.sched_name, "mh");
        let dests: Vec<(IpAddr, u32, Forward)> = held
            .dests
            .iter()
            .map(|d| (d.key.addr, d.weight, d.forward))
            .collect();
        assert_eq!(
            dests,
            [
                (ip("10.1.0.3"), 0, Forward::Tunnel),
                (ip("10.1.0.2"), 1, Forward::Tunnel),
                (ip("10.1.0.1"), 1, Forward::Tunnel),
            ],
            "canonical order, the draining backend at weight 0"
        );
        assert!(dp.held().vips.contains(&ip("10.100.0.1")));
        let c = Datapath::counters(&mut dp).unwrap();
        assert_eq!(c.per_vip, [(vip(80), 0, 0)]);
        let st = Datapath::apply_service(&mut dp, &vip(80), None).unwrap();
        assert_eq!(st.vips_deleted, 1);
        assert!(dp.held().services.is_empty() && dp.held().vips.is_empty());
    }

    /// A failover alias is refused per VIP with a clear reason, nothing
    /// written; a remote-VIP backend is a tunnel real server like a pod.
    #[test]
    fn a_failover_alias_is_refused_and_a_remote_vip_is_a_real_server() {
        let mut dp = dp();
        let v = vip(80);
        let alias = state(80).services[&v]
            .clone()
            .as_failover_alias(&v)
            .unwrap();
        let s = DesiredState {
            services: [(v, alias.clone())].into(),
        };
        let e = Datapath::apply(&mut dp, &s).unwrap_err();
        assert_eq!(e.metric_label(), "invalid_service");
        assert!(
            e.to_string().contains("10.100.0.1:80")
                && e.to_string()
                    .contains("failover alias needs the XDP datapath"),
            "{e}"
        );
        let e = Datapath::apply_service(&mut dp, &v, Some(&alias)).unwrap_err();
        assert!(e.to_string().contains("XDP datapath"), "{e}");
        assert!(dp.kernel().log.is_empty(), "nothing written");

        let remote = ip("192.0.2.50");
        let e = ServiceEntry::new(&v, vec![ip("10.1.0.1"), remote], vec![0, 1, 1])
            .unwrap()
            .with_remote(&v, [remote])
            .unwrap();
        let s = DesiredState {
            services: [(v, e.clone())].into(),
        };
        Datapath::apply(&mut dp, &s).unwrap();
        let held = &dp.held().services[&service_key(&v)];
        assert!(
            held.dests
                .iter()
                .any(|d| d.key.addr == remote && d.forward == Forward::Tunnel && d.weight == 1),
            "{held:?}"
        );
        // without tunnel forwarding it could not reach it
        assert!(check_entry(&v, &e, Forward::DirectRoute).is_err());
    }

    /// Client affinity reaches the virtual service as persistence, through a
    /// full apply and a one-service apply, and leaves with it.
    #[test]
    fn client_affinity_makes_the_virtual_service_persistent() {
        use crate::codec::consts::{IP_VS_SVC_F_PERSISTENT, IP_VS_SVC_F_SCHED2};
        let mut dp = dp();
        let v = vip(80);
        let sticky = |t| {
            let mut s = state(80);
            let e = s.services.remove(&v).unwrap().with_client_affinity(t);
            s.services.insert(v, e);
            s
        };
        let persist = |dp: &IpvsDatapath<MemoryKernel>| {
            let s = &dp.held().services[&service_key(&v)].service;
            (
                s.flags & (IP_VS_SVC_F_PERSISTENT | IP_VS_SVC_F_SCHED2),
                s.timeout,
            )
        };
        Datapath::apply(&mut dp, &sticky(600)).unwrap();
        assert_eq!(persist(&dp), (IP_VS_SVC_F_PERSISTENT, 600));
        Datapath::apply(&mut dp, &state(80)).unwrap();
        assert_eq!(persist(&dp), (IP_VS_SVC_F_SCHED2, 0));
        let e = &sticky(60).services[&v];
        Datapath::apply_service(&mut dp, &v, Some(e)).unwrap();
        assert_eq!(persist(&dp), (IP_VS_SVC_F_PERSISTENT, 60));
    }

    /// The guard follows the seam: written before IPVS (a guard that cannot be
    /// written stops the apply with nothing written), its drops reported as the
    /// XDP datapath's, and removed after the last service.
    #[test]
    fn the_guard_goes_first_reports_drops_and_leaves_last() {
        use crate::guard::nft::MemoryNft;
        let nft = MemoryNft::default();
        let k = MemoryKernel::default();
        let mut dp = IpvsDatapath::with_guard(k, Config::default(), Box::new(nft.clone())).unwrap();
        let v = vip(443);
        let r = |a: &str, p| ringlb_datapath::SourceRange::new(ip(a), p).unwrap();
        let ranged = |net| {
            let mut s = state(443);
            let e = s.services.remove(&v).unwrap();
            s.services.insert(v, e.with_source_ranges(&v, [net]));
            s
        };
        nft.state().fail_apply = true;
        let e = Datapath::apply(&mut dp, &ranged(r("192.0.2.0", 24))).unwrap_err();
        assert_eq!(e.metric_label(), "guard");
        assert!(dp.kernel().log.is_empty(), "fail closed: IPVS untouched");

        nft.state().fail_apply = false;
        Datapath::apply(&mut dp, &ranged(r("192.0.2.0", 24))).unwrap();
        assert!(dp.held().services.contains_key(&service_key(&v)));
        let table = nft.state().table.clone().unwrap();
        assert!(
            table.contains("ip saddr { 192.0.2.0/24 } accept"),
            "{table}"
        );
        nft.state().counters.extend([
            ("src_10.100.0.1_tcp_443".into(), 4),
            ("drop_vip_icmp".into(), 2),
        ]);
        let c = Datapath::counters(&mut dp).unwrap();
        assert_eq!(
            c.global,
            [
                ("drop_no_service", 0),
                ("drop_vip_icmp", 2),
                ("drop_vip_other", 0),
                ("drop_source_range", 4)
            ]
        );
        assert_eq!(c.per_vip_dropped, [(v, "source_range", 4)]);

        // one service narrowed
        let e = &ranged(r("192.0.2.0", 25)).services[&v];
        Datapath::apply_service(&mut dp, &v, Some(e)).unwrap();
        let table = nft.state().table.clone().unwrap();
        assert!(
            table.contains("ip saddr { 192.0.2.0/25 } accept"),
            "{table}"
        );

        // the last service goes first, then the table (here refused: reported)
        nft.state().fail_apply = true;
        let e = Datapath::apply(&mut dp, &DesiredState::default()).unwrap_err();
        assert_eq!(e.metric_label(), "guard");
        assert!(dp.held().services.is_empty() && dp.held().vips.is_empty());
        nft.state().fail_apply = false;
        Datapath::uninstall(dp).unwrap();
        assert!(nft.state().table.is_none());
    }

    #[test]
    fn the_port_wildcard_is_refused_with_a_reason() {
        let mut dp = dp();
        let e = Datapath::apply(&mut dp, &state(0)).unwrap_err();
        assert_eq!(e.metric_label(), "invalid_service");
        assert!(e.to_string().contains("port 0"), "{e}");
        assert!(dp.kernel().log.is_empty(), "nothing written");
    }
}
