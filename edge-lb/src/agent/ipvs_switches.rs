//! The IPVS sysctls the edge switches on at start, in its network namespace
//! (Documentation/networking/ipvs-sysctl.rst).

use std::path::Path;

use anyhow::Context;

/// This network namespace's `sloppy_tcp` switch (Documentation/networking/ipvs-sysctl.rst):
/// lets IPVS take up a connection from any packet, not only a SYN. When the ToR
/// moves a flow from another edge to this one (that edge died or drained), the
/// flow's next packet arrives here without a SYN; without this switch IPVS passes
/// it to the local stack, which holds the VIP on `lo` and answers with an RST.
/// With it, `mh` picks the same pod the other edge picked (docs/ipvs.md). Found in
/// the IPVS lab (docs/lab.md): 15 of 24 moved downloads were reset without it.
const SLOPPY_TCP: &str = "/proc/sys/net/ipv4/vs/sloppy_tcp";
/// The switch that ends a persistence template (sessionAffinity: ClientIP) whose
/// real server has weight 0: a terminating pod drains at weight 0, and its
/// affinity clients' new connections go to a ready pod, as kube-proxy's IPVS mode
/// sets it.
const EXPIRE_QUIESCENT_TEMPLATE: &str = "/proc/sys/net/ipv4/vs/expire_quiescent_template";

/// Sets the IPVS switch at `path` to 1 (`why`: for the error), logging a change.
fn switch_on(path: &Path, why: &str) -> anyhow::Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1") {
        return Ok(());
    }
    std::fs::write(path, "1\n")
        .with_context(|| format!("setting {} to 1 ({why})", path.display()))?;
    tracing::info!(sysctl = %path.display(), "IPVS switch on: {why}");
    Ok(())
}

/// Switches on every IPVS sysctl the edge needs.
pub(super) fn switch_on_all() -> anyhow::Result<()> {
    switch_on(
        Path::new(SLOPPY_TCP),
        "flows moved here from another edge need it",
    )?;
    switch_on(
        Path::new(EXPIRE_QUIESCENT_TEMPLATE),
        "a terminating pod's affinity clients move only with it",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipvs_switches_are_switched_on_or_refused_with_the_path() {
        let dir = std::env::temp_dir().join(format!("ringlb-sloppy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("sloppy_tcp");
        std::fs::write(&f, "0\n").unwrap();
        switch_on(&f, "test").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "1\n");
        switch_on(&f, "test").unwrap();
        // a kernel without IPVS has no such file (its start fails earlier, at the
        // netlink family); a missing directory is refused with the path and why
        let e = switch_on(&dir.join("missing/sloppy_tcp"), "flows need it").unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("missing/sloppy_tcp") && e.contains("flows need it"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
