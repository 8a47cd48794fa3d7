//! Pure glue between the pieces of `ringlb-edge run`: the desired backends (`desired`) become Maglev tables
//! and the datapath's desired state (the routes to announce come from `vip_health`).

use std::collections::BTreeMap;

use crate::serving::{Failover, Serving, VipBackends};
use ringlb_datapath::{DesiredState, ServiceEntry, SourceRange, Vip};
use ringlb_maglev::{Backend, Table};

/// A VIP:port the agent could not program, with the reason (for a log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub what: String,
    pub reason: String,
}

/// The entries built by earlier calls, so that a sync rebuilds the Maglev tables of
/// the VIP:ports whose backends changed and no others (a table of 65,537 slots costs
/// about a millisecond; comparing backend lists costs next to nothing).
#[derive(Debug, Default)]
pub struct Tables {
    built: BTreeMap<Vip, (Inputs, ServiceEntry)>,
}

/// Everything an entry is built from: the cache key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Inputs {
    ring_size: u32,
    ready: Vec<Backend>,
    draining: Vec<Backend>,
    failover: Option<Failover>,
    alias: bool,
    source_ranges: Option<Vec<SourceRange>>,
    client_affinity: Option<u32>,
}

impl Inputs {
    fn of(b: &VipBackends, ring_size: u32) -> Self {
        Inputs {
            ring_size,
            ready: b.ready.clone(),
            draining: b.draining.clone(),
            failover: b.failover,
            alias: b.alias,
            source_ranges: b.source_ranges.clone(),
            client_affinity: b.client_affinity,
        }
    }
}

impl Tables {
    /// How many entries are cached.
    pub fn len(&self) -> usize {
        self.built.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.built.is_empty()
    }
}

/// The datapath state for `desired`, with tables of `ring_size` slots, reusing the
/// entries in `tables` whose inputs did not change.
///
/// New flows go to `ready` backends. When a VIP:port has none, its serving-but-
/// terminating backends take new flows too (as kube-proxy does since Kubernetes 1.26),
/// for the traffic that still arrives while the withdrawal spreads: [`routes`] stops
/// announcing a VIP that has no ready backend. Terminating backends that are not in the
/// table stay in the backend set, so conntrack keeps their established flows.
///
/// A VIP:port with a failover VIP (cross-region failover) has it as a remote backend, always in the
/// backend set (established cross-region flows finish after the local pods return):
/// with no ready local backend it is the only member of the table (draining ones
/// keep their flows only); with ready ones it takes `weight`% of the slots (each local
/// backend weighs 100 - p, the remote p * n). A failover alias is marked as such.
/// A Service's source ranges go to each of its entries (the datapath keeps the
/// prefixes of the VIP's family).
pub fn datapath_state(
    desired: &Serving,
    ring_size: u32,
    tables: &mut Tables,
) -> (DesiredState, Vec<Problem>) {
    let mut state = DesiredState::default();
    let mut problems = Vec::new();
    tables.built.retain(|vip, _| desired.vips.contains_key(vip));
    for (vip, b) in &desired.vips {
        if b.ready.is_empty() && b.draining.is_empty() && b.failover.is_none() {
            tables.built.remove(vip);
            continue;
        }
        let inputs = Inputs::of(b, ring_size);
        if let Some((built, entry)) = tables.built.get(vip)
            && *built == inputs
        {
            state.services.insert(*vip, entry.clone());
            continue;
        }
        match entry_for(vip, b, ring_size) {
            Ok(e) => {
                tables.built.insert(*vip, (inputs, e.clone()));
                state.services.insert(*vip, e);
            }
            Err(reason) => {
                tables.built.remove(vip);
                problems.push(Problem {
                    what: format!("{vip} ({})", b.service),
                    reason,
                })
            }
        }
    }
    (state, problems)
}

/// The backends of the Maglev table: ready ones (with the failover VIP's share), else
/// the failover VIP alone, else the draining ones.
fn table_backends(vip: &Vip, b: &VipBackends) -> Vec<Backend> {
    let remote = |weight| Backend {
        addr: b.failover.map(|f| f.remote).unwrap_or(vip.addr),
        port: vip.port,
        weight,
    };
    match b.failover {
        Some(f) if !b.ready.is_empty() && f.weight > 0 => {
            let p = u32::from(f.weight);
            let n = u32::try_from(b.ready.len()).unwrap_or(u32::MAX);
            let local = b.ready.iter().map(|r| Backend {
                weight: 100 - p,
                ..*r
            });
            local.chain([remote(p.saturating_mul(n))]).collect()
        }
        Some(_) if b.ready.is_empty() => vec![remote(1)],
        _ if b.ready.is_empty() => b.draining.clone(),
        _ => b.ready.clone(),
    }
}

fn entry_for(vip: &Vip, b: &VipBackends, ring_size: u32) -> Result<ServiceEntry, String> {
    let backends = table_backends(vip, b);
    // sized to its backends (`--ring-size` is the largest): the same M on every edge
    let size = ringlb_maglev::fitted_size_for(&backends, ring_size);
    let table = Table::build(&backends, size).map_err(|e| e.to_string())?;
    let mut ips: Vec<_> = table.backends().iter().map(|b| b.addr).collect();
    let remote = b.failover.map(|f| f.remote);
    if let Some(r) = remote
        && b.ready.iter().chain(&b.draining).any(|l| l.addr == r)
    {
        return Err(format!("failover VIP {r} is also a local backend"));
    }
    for addr in b.draining.iter().map(|d| d.addr).chain(remote) {
        if !ips.contains(&addr) {
            ips.push(addr);
        }
    }
    let mut e = ServiceEntry::new(vip, ips, table.slots().to_vec()).map_err(|e| e.to_string())?;
    if let Some(r) = remote {
        e = e.with_remote(vip, [r]).map_err(|e| e.to_string())?;
    }
    if b.alias {
        e = e.as_failover_alias(vip).map_err(|e| e.to_string())?;
    }
    if let Some(r) = &b.source_ranges {
        e = e.with_source_ranges(vip, r.iter().copied());
    }
    if let Some(t) = b.client_affinity {
        e = e.with_client_affinity(t);
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnetwork::IpNetwork;
    use ringlb_datapath::Proto;

    fn b(ip: &str) -> Backend {
        Backend {
            addr: ip.parse().unwrap(),
            port: 8080,
            weight: 1,
        }
    }

    fn vip(ip: &str, port: u16) -> Vip {
        Vip {
            addr: ip.parse().unwrap(),
            port,
            proto: Proto::Tcp,
        }
    }

    /// The routes the edge announces for `d` programmed as `s` (the sync's tracker).
    fn routes(d: &Serving, s: &DesiredState) -> Vec<IpNetwork> {
        let now = std::time::Instant::now();
        let ev = crate::vip_health::Tracker::default().evaluate(d, s, now);
        ev.routes.into_keys().collect()
    }

    fn desired(entries: Vec<(Vip, Vec<Backend>, Vec<Backend>)>) -> Serving {
        let mut d = Serving::default();
        for (v, ready, draining) in entries {
            d.vips.insert(
                v,
                VipBackends {
                    service: "default/web".into(),
                    ready,
                    draining,
                    ..Default::default()
                },
            );
        }
        d
    }

    #[test]
    fn ready_backends_fill_the_ring_draining_ones_only_keep_flows() {
        let d = desired(vec![(
            vip("192.0.2.1", 80),
            vec![b("10.0.0.1"), b("10.0.0.2")],
            vec![b("10.0.0.3")],
        )]);
        let (s, problems) = datapath_state(&d, 251, &mut Tables::default());
        assert!(problems.is_empty());
        let e = &s.services[&vip("192.0.2.1", 80)];
        assert_eq!(e.backends().len(), 3, "draining backend kept for conntrack");
        assert!(
            e.ring().iter().all(|&i| i < 2),
            "draining backend takes no new flows"
        );
        assert_eq!(routes(&d, &s).len(), 1);
    }

    #[test]
    fn only_terminating_backends_take_new_flows_and_stay_announced() {
        let d = desired(vec![(vip("192.0.2.1", 80), vec![], vec![b("10.0.0.3")])]);
        let (s, _) = datapath_state(&d, 251, &mut Tables::default());
        let e = &s.services[&vip("192.0.2.1", 80)];
        assert_eq!(e.backends().len(), 1);
        assert!(e.ring().iter().all(|&i| i == 0), "the ring is theirs");
        assert_eq!(routes(&d, &s).len(), 1, "still serving: announced");
    }

    #[test]
    fn a_bad_ring_size_is_a_problem_not_a_crash() {
        // 11 backends want 2,039 slots: the cap, 1,000, is what is built, and it is
        // not prime
        let eleven = (1..=11).map(|i| b(&format!("10.0.0.{i}"))).collect();
        let d = desired(vec![
            (vip("192.0.2.1", 80), eleven, vec![]),
            (vip("192.0.2.2", 80), vec![], vec![]),
        ]);
        let (s, problems) = datapath_state(&d, 1000, &mut Tables::default());
        assert!(s.services.is_empty());
        assert_eq!(problems.len(), 1);
        assert!(problems[0].what.contains("192.0.2.1"), "{problems:?}");
        assert!(routes(&d, &s).is_empty());
    }

    #[test]
    fn cached_entries_equal_fresh_builds_and_follow_changes() {
        let mut tables = Tables::default();
        let one = vec![(
            vip("192.0.2.1", 80),
            vec![b("10.0.0.1"), b("10.0.0.2")],
            vec![],
        )];
        let two = vec![
            (
                vip("192.0.2.1", 80),
                vec![b("10.0.0.1"), b("10.0.0.2")],
                vec![],
            ),
            (vip("192.0.2.2", 80), vec![b("10.0.0.3")], vec![]),
        ];
        let (first, _) = datapath_state(&desired(one.clone()), 251, &mut tables);
        let (again, _) = datapath_state(&desired(two), 251, &mut tables);
        assert_eq!(tables.len(), 2);
        assert_eq!(
            first.services[&vip("192.0.2.1", 80)],
            again.services[&vip("192.0.2.1", 80)]
        );
        // A backend change rebuilds that entry: the fresh result equals an uncached build.
        let changed = vec![(
            vip("192.0.2.1", 80),
            vec![b("10.0.0.1"), b("10.0.0.9")],
            vec![],
        )];
        let (cached, _) = datapath_state(&desired(changed.clone()), 251, &mut tables);
        let (fresh, _) = datapath_state(&desired(changed), 251, &mut Tables::default());
        assert_eq!(cached, fresh);
        assert_eq!(tables.len(), 1, "the vanished VIP left the cache");
        // A new ring size rebuilds too: three backends want 509 slots, capped at 257.
        let three = vec![(
            vip("192.0.2.1", 80),
            vec![b("10.0.0.1"), b("10.0.0.2"), b("10.0.0.3")],
            vec![],
        )];
        let (capped, _) = datapath_state(&desired(three.clone()), 257, &mut tables);
        assert_eq!(capped.services[&vip("192.0.2.1", 80)].ring().len(), 257);
        let (fitted, _) = datapath_state(&desired(three), 65_537, &mut tables);
        assert_eq!(fitted.services[&vip("192.0.2.1", 80)].ring().len(), 509);
    }

    #[test]
    fn each_ring_is_sized_to_its_backends_the_same_on_every_edge() {
        let pods = |n: usize| (1..=n).map(|i| b(&format!("10.0.0.{i}"))).collect();
        for (n, m) in [(1, 251), (2, 251), (3, 509), (10, 1_021), (11, 2_039)] {
            let d = desired(vec![(vip("192.0.2.1", 80), pods(n), vec![])]);
            let (a, _) = datapath_state(&d, 65_537, &mut Tables::default());
            let (b, _) = datapath_state(&d, 65_537, &mut Tables::default());
            let e = &a.services[&vip("192.0.2.1", 80)];
            assert_eq!(e.ring().len(), m, "{n} pods");
            assert_eq!(e, &b.services[&vip("192.0.2.1", 80)], "a pure function");
        }
    }

    fn with_failover(ready: usize, draining: usize, weight: u8) -> Serving {
        let mut d = desired(vec![(
            vip("192.0.2.1", 80),
            (1..=ready).map(|i| b(&format!("10.0.0.{i}"))).collect(),
            (1..=draining).map(|i| b(&format!("10.0.1.{i}"))).collect(),
        )]);
        for v in d.vips.values_mut() {
            v.failover = Some(Failover {
                remote: remote(),
                weight,
            });
        }
        d
    }

    fn remote() -> std::net::IpAddr {
        "198.51.100.7".parse().unwrap()
    }

    /// The share of the ring's slots that go to the remote VIP.
    fn remote_share(e: &ServiceEntry) -> f64 {
        let idx = e.backends().iter().position(|a| *a == remote()).unwrap();
        let n = e.ring().iter().filter(|&&i| i as usize == idx).count();
        n as f64 / e.ring().len() as f64
    }

    #[test]
    fn the_failover_weight_is_the_remote_share_of_the_ring() {
        for (ready, weight, lo, hi) in [
            (1, 1, 0.009, 0.011),
            (3, 1, 0.009, 0.011),
            (10, 1, 0.009, 0.011),
            (4, 10, 0.099, 0.101),
            (2, 50, 0.499, 0.501),
            (5, 0, 0.0, 0.0),
        ] {
            let d = with_failover(ready, 1, weight);
            let (s, problems) = datapath_state(&d, 65537, &mut Tables::default());
            assert!(problems.is_empty(), "{problems:?}");
            let e = &s.services[&vip("192.0.2.1", 80)];
            let share = remote_share(e);
            eprintln!("{ready} ready, weight {weight}%: remote share {:.4}", share);
            assert!(
                (lo..=hi).contains(&share),
                "{ready} ready, weight {weight}: share {share}"
            );
            assert!(e.is_remote(&remote()), "the remote VIP is marked remote");
            assert_eq!(e.backends().len(), ready + 2, "local, draining and remote");
            assert!(!e.failover_alias());
        }
    }

    #[test]
    fn with_no_ready_pod_the_remote_vip_is_the_only_ring_member() {
        for draining in [0, 2] {
            let d = with_failover(0, draining, 1);
            let (s, problems) = datapath_state(&d, 251, &mut Tables::default());
            assert!(problems.is_empty(), "{problems:?}");
            let e = &s.services[&vip("192.0.2.1", 80)];
            assert_eq!(remote_share(e), 1.0, "{draining} draining");
            assert_eq!(
                e.backends().len(),
                draining + 1,
                "draining kept for their flows"
            );
            assert_eq!(e.remote_backends().len(), 1);
            // Still announced: clients that cached the address are forwarded.
            assert_eq!(routes(&d, &s).len(), 1);
        }
    }

    #[test]
    fn an_alias_is_programmed_as_such_and_never_announced() {
        let mut d = desired(vec![(vip("192.0.2.1", 80), vec![b("10.2.0.1")], vec![])]);
        d.vips.values_mut().for_each(|v| v.alias = true);
        let mut tables = Tables::default();
        let (s, _) = datapath_state(&d, 251, &mut tables);
        let e = &s.services[&vip("192.0.2.1", 80)];
        assert!(e.failover_alias() && e.remote_backends().is_empty());
        assert!(routes(&d, &s).is_empty(), "an alias is never announced");
        // The cache key holds the alias flag and the failover target.
        d.vips.values_mut().for_each(|v| v.alias = false);
        let (s, _) = datapath_state(&d, 251, &mut tables);
        assert!(!s.services[&vip("192.0.2.1", 80)].failover_alias());
        d.vips.values_mut().for_each(|v| {
            v.failover = Some(Failover {
                remote: remote(),
                weight: 0,
            })
        });
        let (s, _) = datapath_state(&d, 251, &mut tables);
        assert!(s.services[&vip("192.0.2.1", 80)].is_remote(&remote()));
        // A failover VIP that is also a local pod is refused, not programmed.
        d.vips.values_mut().for_each(|v| {
            v.ready.push(Backend {
                addr: remote(),
                ..b("10.0.0.1")
            })
        });
        let (s, problems) = datapath_state(&d, 251, &mut tables);
        assert!(s.services.is_empty());
        assert!(
            problems[0].reason.contains("also a local backend"),
            "{problems:?}"
        );
    }

    /// VIP 192.0.2.1:80 with one backend, its entry computed after each edit of
    /// what it serves, all through the same tables (a cache hit keeps the old entry).
    struct OneVip {
        v: Vip,
        d: Serving,
        tables: Tables,
    }

    impl OneVip {
        fn new() -> Self {
            let v = vip("192.0.2.1", 80);
            OneVip {
                v,
                d: desired(vec![(v, vec![b("10.2.0.1")], vec![])]),
                tables: Tables::default(),
            }
        }

        fn entry_after(&mut self, edit: impl Fn(&mut VipBackends)) -> ServiceEntry {
            self.d.vips.values_mut().for_each(edit);
            let (s, _) = datapath_state(&self.d, 251, &mut self.tables);
            s.services[&self.v].clone()
        }
    }

    /// Source ranges reach the entry, and a change of them alone (same backends)
    /// rebuilds it: the cache key holds them.
    #[test]
    fn source_ranges_reach_the_entry_and_are_part_of_the_cache_key() {
        let mut one = OneVip::new();
        assert_eq!(one.entry_after(|_| {}).source_ranges(), None);
        let r = |a: &str, p| SourceRange::new(a.parse().unwrap(), p).unwrap();
        let ranges = vec![r("198.51.100.0", 24), r("2001:db8::", 32)];
        let e = one.entry_after(|x| x.source_ranges = Some(ranges.clone()));
        let got: Vec<_> = e.source_ranges().unwrap().iter().copied().collect();
        assert_eq!(got, vec![r("198.51.100.0", 24)], "the VIP's family only");
        let e = one.entry_after(|x| x.source_ranges = Some(vec![]));
        assert!(e.source_ranges().unwrap().is_empty(), "closed");
    }

    /// Client affinity reaches the entry, and a change of it alone rebuilds it.
    #[test]
    fn client_affinity_reaches_the_entry_and_is_part_of_the_cache_key() {
        let mut one = OneVip::new();
        assert_eq!(one.entry_after(|_| {}).client_affinity(), None);
        let e = one.entry_after(|x| x.client_affinity = Some(60));
        assert_eq!(e.client_affinity(), Some(60));
    }
}
