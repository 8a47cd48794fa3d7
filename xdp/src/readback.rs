//! Reading the maps back: what a (restarted) loader or the operator CLI finds
//! in the pinned maps (`read_programmed`, turned into the loader's view by the
//! pure `state::Programmed::restore`), the backends and the rings from their
//! mapped memory, and the layout check of the maps (`abi_check`).

use crate::{Error, abi, abi_check, maps::Maps, xdp::XdpDatapath};

impl XdpDatapath {
    /// `backends[id]` for each of `ids` (ids outside the map are skipped).
    pub fn backend_values(
        &self,
        ids: impl IntoIterator<Item = u32>,
    ) -> Result<std::collections::BTreeMap<u32, abi::BackendValue>, Error> {
        let mut v = std::collections::BTreeMap::new();
        for id in ids {
            if let Some(b) = self.maps().backend(id)? {
                v.insert(id, b);
            }
        }
        Ok(v)
    }

    /// The backend id in every slot of `vip_id`'s ring, read from the mapped
    /// ring memory; `None` if there is no ring there, its size is not
    /// `size`, or it cannot be mapped (a ring without `BPF_F_MMAPABLE`).
    pub fn read_ring(&self, vip_id: u32, size: u32) -> Result<Option<Vec<u32>>, Error> {
        self.maps().ring(vip_id, size)
    }

    /// Slots per backend id in one VIP's ring.
    pub fn ring_slot_counts(
        &self,
        vip_id: u32,
        size: u32,
    ) -> Result<std::collections::BTreeMap<u32, u32>, Error> {
        let mut c = std::collections::BTreeMap::new();
        for id in self.read_ring(vip_id, size)?.unwrap_or_default() {
            *c.entry(id).or_default() += 1;
        }
        Ok(c)
    }

    /// See [`abi_check::check_abi`].
    pub fn check_abi(&self) -> Result<(), Error> {
        abi_check::check_abi(self.maps())
    }
}
