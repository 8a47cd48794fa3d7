//! What the kernel holds, and how an operation changes it: the model the
//! planner's tests and the in-memory kernel share. It follows the kernel's
//! rules where they matter to the planner: `NEW_DEST` puts the server at the
//! head of the service's list (`list_add_rcu`), `SET_DEST` keeps its place,
//! `DEL_DEST` keeps the others' order, and adding what exists or touching
//! what does not is refused with the kernel's errno.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::Op;
use crate::model::{Dest, Service, ServiceKey};

/// One service as the kernel holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldService {
    pub service: Service,
    /// In the kernel's list order (what a `GET_DEST` dump returns): head first.
    pub dests: Vec<Dest>,
}

/// ringlb's services and bound VIPs, as the kernel holds them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub services: BTreeMap<ServiceKey, HeldService>,
    pub vips: BTreeSet<IpAddr>,
}

/// `-EEXIST`
pub(super) const EEXIST: i32 = -libc::EEXIST;
/// `-ESRCH`: the kernel's answer for a service that does not exist.
pub(super) const ESRCH: i32 = -libc::ESRCH;
/// `-ENOENT`: for a real server that does not exist.
pub(super) const ENOENT: i32 = -libc::ENOENT;
/// `-EADDRNOTAVAIL`: deleting an address that is not there.
pub(super) const EADDRNOTAVAIL: i32 = -libc::EADDRNOTAVAIL;

impl Held {
    /// Applies `op` as the kernel would, or returns its -errno.
    pub fn apply(&mut self, op: &Op) -> Result<(), i32> {
        match op {
            Op::NewService(s) => {
                if self.services.contains_key(&s.key) {
                    return Err(EEXIST);
                }
                let held = HeldService {
                    service: s.clone(),
                    dests: Vec::new(),
                };
                self.services.insert(s.key, held);
            }
            Op::SetService(s) => self.service(&s.key)?.service = s.clone(),
            Op::DelService(k) => {
                self.services.remove(k).ok_or(ESRCH)?;
            }
            Op::NewDest(k, d) => {
                let dests = &mut self.service(k)?.dests;
                if dests.iter().any(|x| x.key == d.key) {
                    return Err(EEXIST);
                }
                dests.insert(0, d.clone());
            }
            Op::SetDest(k, d) => {
                let dests = &mut self.service(k)?.dests;
                *dests.iter_mut().find(|x| x.key == d.key).ok_or(ENOENT)? = d.clone();
            }
            Op::DelDest(k, dk) => {
                let dests = &mut self.service(k)?.dests;
                let at = dests.iter().position(|x| x.key == *dk).ok_or(ENOENT)?;
                dests.remove(at);
            }
            Op::BindVip(a) => {
                if !self.vips.insert(*a) {
                    return Err(EEXIST);
                }
            }
            Op::UnbindVip(a) => {
                if !self.vips.remove(a) {
                    return Err(EADDRNOTAVAIL);
                }
            }
        }
        Ok(())
    }

    fn service(&mut self, k: &ServiceKey) -> Result<&mut HeldService, i32> {
        self.services.get_mut(k).ok_or(ESRCH)
    }
}
