//! The map layer as a trait ([`NodeMaps`]): the loader implements it over
//! the kernel maps ([`KernelMaps`]), unit tests over [`FakeMaps`], and
//! [`apply`] (the one place map operations are executed) runs against
//! either.

use std::{collections::BTreeMap, net::IpAddr};

use aya::maps::{HashMap, MapData};

use crate::{
    Error, abi, map_err,
    state::{MapOp, NodeState, entry_from_raw, plan, service_entry, svc_key},
};

/// What [`apply`] needs from the maps.
pub trait NodeMaps {
    fn put_edge(&mut self, key: abi::PodKey) -> Result<(), Error>;
    fn del_edge(&mut self, key: &abi::PodKey) -> Result<(), Error>;
    fn put_pod(&mut self, key: abi::PodKey) -> Result<(), Error>;
    fn del_pod(&mut self, key: &abi::PodKey) -> Result<(), Error>;
    fn put_service(&mut self, key: abi::SvcKey, value: abi::SvcValue) -> Result<(), Error>;
    fn del_service(&mut self, key: &abi::SvcKey) -> Result<(), Error>;
    /// Every edge, pod and service entry (read back after a restart).
    fn read(&self) -> Result<NodeState, Error>;
}

/// Executes `ops` in order; stops at the first failure and returns how many
/// succeeded with the error. Deleting an absent entry is not an error.
pub fn apply(maps: &mut dyn NodeMaps, ops: &[MapOp]) -> Result<usize, (usize, Error)> {
    for (i, op) in ops.iter().enumerate() {
        let r = match op {
            MapOp::PutEdge(e) => maps.put_edge(abi::PodKey::new(*e)),
            MapOp::DelEdge(e) => maps.del_edge(&abi::PodKey::new(*e)),
            MapOp::PutPod(p) => maps.put_pod(abi::PodKey::new(*p)),
            MapOp::DelPod(p) => maps.del_pod(&abi::PodKey::new(*p)),
            MapOp::PutService(k, t) => {
                let (k, v) = service_entry(k, t);
                maps.put_service(k, v)
            }
            MapOp::DelService(k) => maps.del_service(&svc_key(k)),
        };
        r.map_err(|e| (i, e))?;
    }
    Ok(ops.len())
}

/// What the maps hold, and the one way to change it: [`Applier::apply`] validates
/// a desired state, plans the difference and writes it. The loader runs it over
/// [`KernelMaps`]; the node agent's sync tests run the same path over [`FakeMaps`].
#[derive(Debug)]
pub struct Applier<M> {
    maps: M,
    programmed: NodeState,
}

impl<M: NodeMaps> Applier<M> {
    /// Starts from what `maps` hold (pinned maps after a restart).
    pub fn new(maps: M) -> Result<Self, Error> {
        Ok(Self {
            programmed: maps.read()?,
            maps,
        })
    }

    /// What the maps hold (as last read or written).
    pub fn programmed(&self) -> &NodeState {
        &self.programmed
    }

    pub fn maps(&self) -> &M {
        &self.maps
    }

    pub fn maps_mut(&mut self) -> &mut M {
        &mut self.maps
    }

    /// Writes the difference between what the maps hold and `want`. Returns
    /// the number of map operations. After a failed write the maps are read
    /// back, so the next call plans from what really is there.
    pub fn apply(&mut self, want: &NodeState) -> Result<usize, Error> {
        want.validate()?;
        let ops = plan(&self.programmed, want);
        match apply(&mut self.maps, &ops) {
            Ok(n) => {
                self.programmed = want.clone();
                Ok(n)
            }
            Err((done, e)) => {
                tracing::warn!(done, total = ops.len(), error = %e, "node map write failed; re-reading the maps");
                if let Ok(s) = self.maps.read() {
                    self.programmed = s;
                }
                Err(e)
            }
        }
    }
}

fn pod_ip(k: &abi::PodKey) -> Option<IpAddr> {
    k.addr.to_ip(k.family)
}

/// The kernel maps `local_pods`, `edges` and `services`.
pub struct KernelMaps {
    pub(crate) pods: HashMap<MapData, abi::PodKey, abi::PodValue>,
    pub(crate) edges: HashMap<MapData, abi::PodKey, abi::EdgeValue>,
    pub(crate) services: HashMap<MapData, abi::SvcKey, abi::SvcValue>,
}

fn absent_ok(name: &'static str, r: Result<(), aya::maps::MapError>) -> Result<(), Error> {
    match r {
        Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(())
        }
        r => r.map_err(map_err(name)),
    }
}

impl NodeMaps for KernelMaps {
    fn put_edge(&mut self, key: abi::PodKey) -> Result<(), Error> {
        self.edges
            .insert(key, abi::EdgeValue::default(), 0)
            .map_err(map_err(abi::map::EDGES))
    }

    fn del_edge(&mut self, key: &abi::PodKey) -> Result<(), Error> {
        absent_ok(abi::map::EDGES, self.edges.remove(key))
    }

    fn put_pod(&mut self, key: abi::PodKey) -> Result<(), Error> {
        self.pods
            .insert(key, abi::PodValue::default(), 0)
            .map_err(map_err(abi::map::LOCAL_PODS))
    }
    fn del_pod(&mut self, key: &abi::PodKey) -> Result<(), Error> {
        absent_ok(abi::map::LOCAL_PODS, self.pods.remove(key))
    }
    fn put_service(&mut self, key: abi::SvcKey, value: abi::SvcValue) -> Result<(), Error> {
        self.services
            .insert(key, value, 0)
            .map_err(map_err(abi::map::SERVICES))
    }
    fn del_service(&mut self, key: &abi::SvcKey) -> Result<(), Error> {
        absent_ok(abi::map::SERVICES, self.services.remove(key))
    }
    fn read(&self) -> Result<NodeState, Error> {
        let mut s = NodeState::default();
        for k in self.pods.keys() {
            let k = k.map_err(map_err(abi::map::LOCAL_PODS))?;
            s.pods.extend(pod_ip(&k));
        }
        for k in self.edges.keys() {
            let k = k.map_err(map_err(abi::map::EDGES))?;
            s.edges.extend(pod_ip(&k));
        }
        for kv in self.services.iter() {
            let (k, v) = kv.map_err(map_err(abi::map::SERVICES))?;
            match entry_from_raw(&k, &v) {
                Some((k, t)) => {
                    s.services.insert(k, t);
                }
                // an entry this build cannot read: plan() will not delete
                // it either; uninstall (or a fresh pin dir) does
                None => tracing::warn!(?k, "unreadable service entry in the pinned map"),
            }
        }
        Ok(s)
    }
}

/// In-memory maps for tests of the apply path (no kernel). `fail_after`
/// makes the n-th write fail.
#[derive(Debug, Default)]
pub struct FakeMaps {
    pub edges: BTreeMap<abi::PodKey, abi::EdgeValue>,
    pub pods: BTreeMap<abi::PodKey, abi::PodValue>,
    pub services: BTreeMap<abi::SvcKey, abi::SvcValue>,
    pub fail_after: Option<usize>,
    pub writes: usize,
}

impl FakeMaps {
    fn write(&mut self) -> Result<(), Error> {
        if self.fail_after == Some(self.writes) {
            return Err(Error::InvalidEntry {
                entry: "fake".into(),
                reason: "injected failure".into(),
            });
        }
        self.writes += 1;
        Ok(())
    }
}

impl NodeMaps for FakeMaps {
    fn put_edge(&mut self, key: abi::PodKey) -> Result<(), Error> {
        self.write()?;
        self.edges.insert(key, abi::EdgeValue::default());
        Ok(())
    }

    fn del_edge(&mut self, key: &abi::PodKey) -> Result<(), Error> {
        self.write()?;
        self.edges.remove(key);
        Ok(())
    }

    fn put_pod(&mut self, key: abi::PodKey) -> Result<(), Error> {
        self.write()?;
        self.pods.insert(key, abi::PodValue::default());
        Ok(())
    }
    fn del_pod(&mut self, key: &abi::PodKey) -> Result<(), Error> {
        self.write()?;
        self.pods.remove(key);
        Ok(())
    }
    fn put_service(&mut self, key: abi::SvcKey, value: abi::SvcValue) -> Result<(), Error> {
        self.write()?;
        self.services.insert(key, value);
        Ok(())
    }
    fn del_service(&mut self, key: &abi::SvcKey) -> Result<(), Error> {
        self.write()?;
        self.services.remove(key);
        Ok(())
    }
    fn read(&self) -> Result<NodeState, Error> {
        let mut s = NodeState::default();
        s.pods.extend(self.pods.keys().filter_map(pod_ip));
        s.edges.extend(self.edges.keys().filter_map(pod_ip));
        for (k, v) in &self.services {
            if let Some((k, t)) = entry_from_raw(k, v) {
                s.services.insert(k, t);
            }
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Proto;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn two() -> NodeState {
        let mut s = NodeState::default();
        s.add_backend(ip("10.100.0.1"), 80, Proto::Tcp, ip("10.2.0.5"), 8080)
            .add_backend(
                ip("2001:db8:100::1"),
                53,
                Proto::Udp,
                ip("2001:db8:2::5"),
                5353,
            );
        s
    }

    #[test]
    fn applying_a_plan_makes_the_maps_read_back_as_the_desired_state() {
        let mut m = FakeMaps::default();
        let want = two();
        let ops = plan(&m.read().unwrap(), &want);
        assert_eq!(apply(&mut m, &ops).unwrap(), 4);
        assert_eq!(m.read().unwrap(), want);
        // and back to empty
        let ops = plan(&want, &NodeState::default());
        apply(&mut m, &ops).unwrap();
        assert!(m.pods.is_empty() && m.services.is_empty());
    }

    #[test]
    fn a_failed_write_reports_how_far_it_got() {
        let mut m = FakeMaps {
            fail_after: Some(1),
            ..Default::default()
        };
        let ops = plan(&NodeState::default(), &two());
        let (done, _) = apply(&mut m, &ops).unwrap_err();
        assert_eq!(done, 1);
        // the maps hold exactly what succeeded; re-reading and re-planning
        // finishes the job
        m.fail_after = None;
        let ops = plan(&m.read().unwrap(), &two());
        assert_eq!(ops.len(), 3);
        apply(&mut m, &ops).unwrap();
        assert_eq!(m.read().unwrap(), two());
    }

    #[test]
    fn the_applier_retries_from_what_the_maps_really_hold() {
        let mut a = Applier::new(FakeMaps {
            fail_after: Some(2),
            ..Default::default()
        })
        .unwrap();
        assert!(a.apply(&two()).is_err());
        assert_eq!(
            a.programmed().pods.len(),
            2,
            "the two pod writes went through"
        );
        a.maps_mut().fail_after = None;
        assert_eq!(
            a.apply(&two()).unwrap(),
            2,
            "only the two services are left"
        );
        assert_eq!(a.programmed(), &two());
        assert_eq!(a.apply(&two()).unwrap(), 0);
        let mut bad = two();
        bad.pods.clear();
        assert!(a.apply(&bad).is_err(), "validated before any write");
        assert_eq!(a.maps().read().unwrap(), two());
    }
}
