//! Pure glue between the pieces of `ringlb-edge run`: the desired backends (`desired`) become Maglev tables
//! and the datapath's desired state (the routes to announce come from `vip_health`).

use std::collections::BTreeMap;

use crate::serving::{Serving, VipBackends};
use ringlb_datapath::{DesiredState, ServiceEntry, Vip};
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
    built: BTreeMap<Vip, (u32, Vec<Backend>, Vec<Backend>, ServiceEntry)>,
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
pub fn datapath_state(
    desired: &Serving,
    ring_size: u32,
    tables: &mut Tables,
) -> (DesiredState, Vec<Problem>) {
    let mut state = DesiredState::default();
    let mut problems = Vec::new();
    tables.built.retain(|vip, _| desired.vips.contains_key(vip));
    for (vip, b) in &desired.vips {
        if b.ready.is_empty() && b.draining.is_empty() {
            tables.built.remove(vip);
            continue;
        }
        if let Some((size, ready, draining, entry)) = tables.built.get(vip)
            && *size == ring_size
            && *ready == b.ready
            && *draining == b.draining
        {
            state.services.insert(*vip, entry.clone());
            continue;
        }
        match entry_for(vip, b, ring_size) {
            Ok(e) => {
                tables.built.insert(
                    *vip,
                    (ring_size, b.ready.clone(), b.draining.clone(), e.clone()),
                );
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

fn entry_for(vip: &Vip, b: &VipBackends, ring_size: u32) -> Result<ServiceEntry, String> {
    let table_backends = if b.ready.is_empty() {
        &b.draining
    } else {
        &b.ready
    };
    let table = Table::build(table_backends, ring_size).map_err(|e| e.to_string())?;
    let mut ips: Vec<_> = table.backends().iter().map(|b| b.addr).collect();
    for d in &b.draining {
        if !ips.contains(&d.addr) {
            ips.push(d.addr);
        }
    }
    ServiceEntry::new(vip, ips, table.slots().to_vec()).map_err(|e| e.to_string())
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
                    policy: Default::default(),
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
    fn only_terminating_backends_still_serve_and_are_not_announced() {
        let d = desired(vec![(vip("192.0.2.1", 80), vec![], vec![b("10.0.0.3")])]);
        let (s, _) = datapath_state(&d, 251, &mut Tables::default());
        assert_eq!(s.services[&vip("192.0.2.1", 80)].backends().len(), 1);
        assert!(routes(&d, &s).is_empty(), "no ready backend: not announced");
    }

    #[test]
    fn a_bad_ring_size_is_a_problem_not_a_crash() {
        let d = desired(vec![
            (vip("192.0.2.1", 80), vec![b("10.0.0.1")], vec![]),
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
        // A new ring size rebuilds too.
        let (bigger, _) = datapath_state(&desired(one), 257, &mut tables);
        assert_eq!(bigger.services[&vip("192.0.2.1", 80)].ring().len(), 257);
    }
}
