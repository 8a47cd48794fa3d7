//! The map layer in memory, for tests of the real apply path without a kernel
//! (feature `memory-maps`; never in a program). It holds what the kernel maps
//! would, and fails a chosen write to model a map write failing halfway.

use std::collections::{BTreeMap, BTreeSet};

use super::Maps;
use crate::{BpfError, Counters, Error, SourceRange, Vip, abi, src_ranges, vip_filter::VipFilter};

/// The XDP program's maps as plain collections.
#[derive(Clone, Debug, Default)]
pub struct MemoryMaps {
    pub vips: BTreeMap<Vip, abi::VipInfo>,
    pub rings: BTreeMap<u32, Vec<u32>>,
    /// Rings `create_ring` and `del_ring` made, not yet flushed into `rings`.
    pub staged: BTreeMap<u32, Vec<u32>>,
    /// Flushes that moved staged rings into `rings` (each is one write to the
    /// kernel's map of maps, and one grace period).
    pub ring_flushes: usize,
    pub backends: BTreeMap<u32, abi::BackendValue>,
    /// id -> vip_id (the `owners` value without its ranges bit)
    pub owners: BTreeMap<u32, u32>,
    /// The ids whose `owners` value has `abi::OWNER_F_SRC_RANGES`.
    pub owners_src_ranges: BTreeSet<u32>,
    /// Ids whose owner value carries `abi::OWNER_F_DRAINING` (not in their ring).
    pub owners_draining: BTreeSet<u32>,
    /// `src_ranges` by vip_id.
    pub src_ranges: BTreeMap<u32, BTreeSet<SourceRange>>,
    /// `src_sets` (the sets ever written).
    pub src_sets: BTreeMap<u32, abi::SrcSet>,
    /// `src_set_of`, its non-zero entries.
    pub src_set_of: BTreeMap<u32, u32>,
    pub vip_filter: VipFilter,
    pub vip_addrs: BTreeSet<std::net::IpAddr>,
    /// Writes left before one fails (`None`: never). Each trait call that writes
    /// counts once; the failing one changes nothing.
    pub fail_after: Option<usize>,
    /// Writes made so far.
    pub writes: usize,
    /// Every read fails while set (a re-read after a failed write failing too).
    pub fail_reads: bool,
}

impl MemoryMaps {
    /// Counts a write; the error of the one that is set to fail.
    fn write(&mut self, what: &'static str) -> Result<(), Error> {
        if let Some(left) = self.fail_after.as_mut() {
            if *left == 0 {
                return Err(Error::Syscall {
                    call: what,
                    source: std::io::Error::other("injected map write failure"),
                });
            }
            *left -= 1;
        }
        self.writes += 1;
        Ok(())
    }

    fn read(&self, what: &'static str) -> Result<(), Error> {
        if self.fail_reads {
            return Err(Error::Syscall {
                call: what,
                source: std::io::Error::other("injected map read failure"),
            });
        }
        Ok(())
    }

    /// The ids whose `backends` entry is live (family set).
    pub fn live(&self) -> BTreeSet<u32> {
        self.backends
            .iter()
            .filter(|(_, b)| b.family != 0)
            .map(|(id, _)| *id)
            .collect()
    }
}

impl MemoryMaps {
    /// The ring of `vip_id` a write goes to: the staged one, else the live one.
    fn ring_mut(&mut self, vip_id: u32) -> Result<&mut Vec<u32>, Error> {
        match self.staged.get_mut(&vip_id) {
            Some(r) => Ok(r),
            None => self
                .rings
                .get_mut(&vip_id)
                .ok_or_else(|| BpfError::Missing { name: "ring" }.into()),
        }
    }
}

impl Maps for MemoryMaps {
    fn put_backends(&mut self, ids: &[u32], values: &[abi::BackendValue]) -> Result<(), Error> {
        self.write("put_backends")?;
        self.backends
            .extend(ids.iter().copied().zip(values.iter().copied()));
        Ok(())
    }

    fn backend(&self, id: u32) -> Result<Option<abi::BackendValue>, Error> {
        self.read("backend")?;
        let in_range = id < abi::MAX_BACKENDS;
        Ok(in_range.then(|| self.backends.get(&id).copied().unwrap_or_default()))
    }

    fn create_ring(&mut self, vip_id: u32, size: u32) -> Result<(), Error> {
        self.write("create_ring")?;
        self.staged.insert(vip_id, vec![0; size as usize]);
        Ok(())
    }

    fn write_slots(&mut self, vip_id: u32, slots: &[(u32, u32)]) -> Result<(), Error> {
        self.write("write_slots")?;
        let ring = self.ring_mut(vip_id)?;
        for &(slot, id) in slots {
            ring[slot as usize] = id;
        }
        Ok(())
    }

    fn write_ring(&mut self, vip_id: u32, ids: &[u32]) -> Result<(), Error> {
        self.write("write_ring")?;
        let ring = self.ring_mut(vip_id)?;
        if ids.len() > ring.len() {
            return Err(Error::Syscall {
                call: "write_ring",
                source: std::io::Error::other(format!(
                    "{} ids for a ring of {}",
                    ids.len(),
                    ring.len()
                )),
            });
        }
        ring[..ids.len()].copy_from_slice(ids);
        Ok(())
    }

    fn del_ring(&mut self, vip_id: u32) -> Result<(), Error> {
        self.write("del_ring")?;
        self.staged.insert(vip_id, vec![0]);
        Ok(())
    }

    fn flush_rings(&mut self) -> Result<(), Error> {
        if self.staged.is_empty() {
            return Ok(());
        }
        self.write("flush_rings")?;
        self.ring_flushes += 1;
        self.rings.append(&mut self.staged);
        Ok(())
    }

    fn drop_staged_rings(&mut self) {
        self.staged.clear();
    }

    fn ring(&self, vip_id: u32, size: u32) -> Result<Option<Vec<u32>>, Error> {
        self.read("ring")?;
        Ok(self
            .rings
            .get(&vip_id)
            .filter(|r| r.len() == size as usize)
            .cloned())
    }

    fn put_vip(&mut self, vip: &Vip, info: &abi::VipInfo) -> Result<(), Error> {
        self.write("put_vip")?;
        self.vips.insert(*vip, *info);
        Ok(())
    }

    fn del_vip(&mut self, vip: &Vip) -> Result<(), Error> {
        self.write("del_vip")?;
        self.vips.remove(vip);
        Ok(())
    }

    fn vips(&self) -> Result<Vec<(Vip, abi::VipInfo)>, Error> {
        self.read("vips")?;
        Ok(self.vips.iter().map(|(v, i)| (*v, *i)).collect())
    }

    fn set_owners(&mut self, ids: &[u32], owner: u32) -> Result<(), Error> {
        self.write("set_owners")?;
        let (vip_id, ranges) = src_ranges::owner_of(owner);
        for id in ids {
            match vip_id {
                None => self.owners.remove(id),
                Some(v) => self.owners.insert(*id, v),
            };
            if ranges {
                self.owners_src_ranges.insert(*id);
            } else {
                self.owners_src_ranges.remove(id);
            }
            if owner & abi::OWNER_F_DRAINING != 0 {
                self.owners_draining.insert(*id);
            } else {
                self.owners_draining.remove(id);
            }
        }
        Ok(())
    }

    fn owners(&self) -> Result<BTreeMap<u32, u32>, Error> {
        self.read("owners")?;
        Ok(self.owners.clone())
    }

    fn vip_filter_add(&mut self, addr: std::net::IpAddr) -> Result<(), Error> {
        self.write("vip_filter_add")?;
        self.vip_filter.set(addr);
        Ok(())
    }

    fn vip_filter_set(&mut self, filter: &VipFilter) -> Result<(), Error> {
        self.write("vip_filter_set")?;
        self.vip_filter = filter.clone();
        Ok(())
    }

    fn vip_addrs(&self) -> Result<BTreeSet<std::net::IpAddr>, Error> {
        self.read("vip_addrs")?;
        Ok(self.vip_addrs.clone())
    }

    fn vip_addrs_update(
        &mut self,
        add: &[std::net::IpAddr],
        del: &[std::net::IpAddr],
    ) -> Result<(), Error> {
        self.write("vip_addrs_update")?;
        self.vip_addrs.extend(add);
        for a in del {
            self.vip_addrs.remove(a);
        }
        Ok(())
    }

    fn put_src_ranges(&mut self, vip_id: u32, ranges: &[SourceRange]) -> Result<(), Error> {
        self.write("put_src_ranges")?;
        self.src_ranges
            .entry(vip_id)
            .or_default()
            .extend(ranges.iter().copied());
        Ok(())
    }

    fn del_src_ranges(&mut self, vip_id: u32, ranges: &[SourceRange]) -> Result<(), Error> {
        self.write("del_src_ranges")?;
        if let Some(set) = self.src_ranges.get_mut(&vip_id) {
            for r in ranges {
                set.remove(r);
            }
            if set.is_empty() {
                self.src_ranges.remove(&vip_id);
            }
        }
        Ok(())
    }

    fn src_ranges(&self) -> Result<BTreeMap<u32, BTreeSet<SourceRange>>, Error> {
        self.read("src_ranges")?;
        Ok(self.src_ranges.clone())
    }

    fn put_src_set(&mut self, set: u32, value: &abi::SrcSet) -> Result<(), Error> {
        self.write("put_src_set")?;
        self.src_sets.insert(set, *value);
        Ok(())
    }

    fn point_src_set(&mut self, vip_id: u32, set: u32) -> Result<(), Error> {
        self.write("point_src_set")?;
        if set == 0 {
            self.src_set_of.remove(&vip_id);
        } else {
            self.src_set_of.insert(vip_id, set);
        }
        Ok(())
    }

    fn src_set_of(&self, vip_ids: &[u32]) -> Result<BTreeMap<u32, u32>, Error> {
        self.read("src_set_of")?;
        Ok(vip_ids
            .iter()
            .filter_map(|id| Some((*id, *self.src_set_of.get(id)?)))
            .collect())
    }

    /// No packets cross memory: every counter is zero.
    fn counters(&self, vips: &[(Vip, u32)]) -> Result<Counters, Error> {
        self.read("counters")?;
        Ok(Counters {
            global: abi::Stat::ALL.iter().map(|s| (s.label(), 0)).collect(),
            per_vip: vips.iter().map(|(v, _)| (*v, 0, 0)).collect(),
            per_vip_dropped: vips.iter().map(|(v, _)| (*v, "source_range", 0)).collect(),
        })
    }
}
