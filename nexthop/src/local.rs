//! Pods on this node: backends that no next hop reaches.
//!
//! A pod on the edge's own node sits behind a bridge or a veth of this node, not
//! behind a port the XDP program can send on. Its frames go up this node's
//! stack instead, where the node agent decapsulates them (docs/datapath.md, Pods
//! on edge nodes). Which pods are local is a fact of the API (an endpoint's
//! `nodeName`), not of the routing table, so the edge agent keeps the set
//! ([`LocalPods`]) and [`WithLocalPods`] answers [`Resolver::is_local`] from it.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{Arc, RwLock},
};

use crate::{Error, NextHop, Resolver};

/// The addresses of the pods on this node, shared between the agent that knows
/// them and the resolver that answers for them.
#[derive(Clone, Debug, Default)]
pub struct LocalPods(Arc<RwLock<BTreeSet<IpAddr>>>);

impl LocalPods {
    /// Replaces the set; returns whether it changed.
    pub fn set(&self, addrs: BTreeSet<IpAddr>) -> bool {
        let mut cur = self.0.write().unwrap_or_else(|p| p.into_inner());
        if *cur == addrs {
            return false;
        }
        *cur = addrs;
        true
    }

    pub fn contains(&self, addr: &IpAddr) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(addr)
    }

    pub fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A resolver that knows this node's pods: [`Resolver::is_local`] for them, and
/// the inner resolver for everything else.
pub struct WithLocalPods<R> {
    inner: R,
    local: LocalPods,
}

impl<R: Resolver> WithLocalPods<R> {
    pub fn new(inner: R, local: LocalPods) -> Self {
        Self { inner, local }
    }
}

impl<R: Resolver> Resolver for WithLocalPods<R> {
    fn resolve(&self, addr: IpAddr) -> Result<NextHop, Error> {
        self.inner.resolve(addr)
    }
    fn is_local(&self, addr: IpAddr) -> bool {
        self.local.contains(&addr) || self.inner.is_local(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StaticResolver;

    #[test]
    fn local_pods_are_local_and_the_rest_is_resolved() {
        let local = LocalPods::default();
        let nh = NextHop {
            ifindex: 3,
            smac: [2, 0, 0, 0, 0, 1],
            dmac: [2, 0, 0, 0, 0, 2],
            vlan: None,
        };
        let r = WithLocalPods::new(StaticResolver::everywhere(nh), local.clone());
        let (pod, other): (IpAddr, IpAddr) =
            ("10.244.1.5".parse().unwrap(), "10.244.2.5".parse().unwrap());
        assert!(!r.is_local(pod));
        assert!(local.set([pod].into()));
        assert!(!local.set([pod].into()), "the same set is no change");
        assert!(r.is_local(pod) && !r.is_local(other));
        assert_eq!(r.resolve(other), Ok(nh));
        assert!(local.set(BTreeSet::new()));
        assert!(!r.is_local(pod) && local.is_empty());
    }
}
