//! The layout checks of the XDP maps against this build's `abi.h`, at every load
//! and open: each map's key and value types and the capacity of pinned maps
//! (which keep the size they were created with), including the `owners` map
//! (backend id -> VIP), which the loader keeps and reads back and the program
//! reads on a conntrack hit.

use std::path::Path;

use aya::maps::{Array, ArrayOfMaps, HashMap, IterableMap, LpmTrie, MapData, PerCpuArray};
use ringlb_bpf_types::check_capacity;

use crate::abi::map::OWNERS;
use crate::{BpfError, Error, abi, map_err, maps::kernel::KernelMaps};

/// What to do about a pinned map of an older release.
const FIX: &str = "run `ringlb-edge datapath uninstall` or use a new --pin-dir";

/// Warns when pinned maps of a release without the `owners` map are reused.
pub(crate) fn warn_without_owners(dir: &Path) {
    if dir.join(abi::map::BACKENDS).exists() && !dir.join(OWNERS).exists() {
        tracing::warn!(pin = %dir.join(OWNERS).display(), "pinned maps without an owners map: backend ids no ring names cannot be attributed and are deleted at the next apply");
    }
}

/// Takes the `owners` map out of the loaded object (the program keeps its
/// own reference) and checks the size of a pinned one.
pub(crate) fn take_owners(ebpf: &mut aya::Ebpf) -> Result<Array<MapData, u32>, Error> {
    let m = ebpf
        .take_map(OWNERS)
        .ok_or(BpfError::Missing { name: OWNERS })?;
    let owners: Array<MapData, u32> = Array::try_from(m).map_err(map_err(OWNERS))?;
    check_capacity(OWNERS, owners.map(), abi::MAX_BACKENDS, "abi.h", FIX)?;
    Ok(owners)
}

/// Opens every map with its Rust key/value types: aya checks the sizes
/// against what the compiled object declares (the C side of abi.h).
pub(crate) fn check_abi(maps: &KernelMaps) -> Result<(), Error> {
    use abi::map::*;
    let vips: HashMap<_, abi::VipKey, abi::VipInfo> = maps.map(VIPS)?;
    let _: ArrayOfMaps<&MapData, Array<MapData, u32>> = maps.map(RINGS)?;
    let backends: Array<_, abi::BackendValue> = maps.map(BACKENDS)?;
    let ct: HashMap<_, abi::Flow, abi::CtValue> = maps.map(CONNTRACK)?;
    let addrs: HashMap<_, abi::VipKey, u32> = maps.map(VIP_ADDRS)?;
    let _: HashMap<_, abi::BfdHoldKey, abi::BfdHold> = maps.map(BFD_HOLD)?;
    let affinity: HashMap<_, abi::AffinityKey, abi::AffinityValue> = maps.map(AFFINITY)?;
    // pinned maps keep the size they were created with
    for (name, data, want) in [
        (VIPS, vips.map(), abi::MAX_VIPS),
        (VIP_ADDRS, addrs.map(), abi::MAX_VIPS),
        (BACKENDS, backends.map(), abi::MAX_BACKENDS),
        (CONNTRACK, ct.map(), abi::CT_SIZE),
        (AFFINITY, affinity.map(), abi::AFFINITY_SIZE),
    ] {
        check_capacity(name, data, want, "abi.h", FIX)?;
    }
    let filter: Array<_, u64> = maps.map(VIP_FILTER)?;
    check_capacity(
        VIP_FILTER,
        filter.map(),
        abi::VIP_FILTER_WORDS,
        "abi.h",
        FIX,
    )?;
    let _: Array<_, abi::ConfigValue> = maps.map(CONFIG)?;
    let _: PerCpuArray<_, abi::VipStats> = maps.map(VIP_STATS)?;
    let _: PerCpuArray<_, abi::CtBudget> = maps.map(CT_BUDGET)?;
    let _: PerCpuArray<_, u64> = maps.map(SRC_DROPS)?;
    let _: LpmTrie<_, abi::SrcRange, u32> = maps.map(SRC_RANGES)?;
    let _: Array<_, abi::SrcSet> = maps.map(SRC_SETS)?;
    let _: Array<_, u32> = maps.map(SRC_SET_OF)?;
    let stats: PerCpuArray<_, u64> = maps.map(STATS)?;
    if stats.len() != abi::STAT_MAX {
        return Err(Error::InvalidService {
            vip: "stats map".into(),
            reason: format!(
                "object has {} counters, Rust knows {}",
                stats.len(),
                abi::STAT_MAX
            ),
        });
    }
    Ok(())
}
