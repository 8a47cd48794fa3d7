//! Checks of a loaded object's maps against this build's ABI header.

use aya::maps::MapData;

use crate::{BpfError, map_err};

/// Checks that map `name` holds `want` entries, as this build's ABI header
/// (`header`, e.g. `abi.h`) says. Maps pinned by an older release keep the
/// size they were created with; `fix` tells the operator what to do then.
pub fn check_capacity(
    name: &'static str,
    map: &MapData,
    want: u32,
    header: &str,
    fix: &str,
) -> Result<(), BpfError> {
    let have = map.info().map_err(map_err::<BpfError>(name))?.max_entries();
    if have == want {
        return Ok(());
    }
    Err(BpfError::Layout {
        name,
        reason: format!(
            "{have} entries, this build's {header} says {want}: a pinned map of an older release ({fix})"
        ),
    })
}
