//! A changed `--xdp-mode` is applied on restart (root; skips otherwise): a veth in
//! a namespace of its own, a private bpffs. Attach generic, restart asking for
//! generic (the program is replaced inside the pinned link: hitless), restart
//! asking for native (the link is detached and attached natively), then restart
//! on another interface (the first one's link is detached); a loader with another
//! pin directory is refused with the reason. The mode is read from
//! `ip -d link`, and from netlink by the loader's own query.

mod xdp_support;

use ringlb_xdp::attach_mode::{LinkMode, xdp_progs};
use ringlb_xdp::batch::{if_index, pinned_link_info};
use ringlb_xdp::xdp::{AttachMode, XdpDatapath};
use xdp_support::*;

/// What `ip -d link show dev` says of XDP on its first line: "xdpgeneric",
/// "xdp" (native), "xdpmulti", or "none".
fn ip_link_mode(dev: &str) -> &'static str {
    let text = sh(&["ip", "-d", "link", "show", "dev", dev]);
    let first = text.lines().next().unwrap_or_default();
    for mode in ["xdpgeneric", "xdpmulti", "xdpoffload", "xdp"] {
        if first.split_whitespace().any(|w| w == mode) {
            return mode;
        }
    }
    "none"
}

/// A new loader (a restarted edge) attaching to `dev` in `mode`.
fn restart(bpffs: &BpfFs, dev: &str, mode: AttachMode) -> &'static str {
    let mut dp = load_pinned(bpffs.path()).unwrap();
    let used = dp.attach(dev, mode).unwrap();
    drop(dp); // the process exits; the pinned link stays
    used
}

#[test]
fn a_changed_attach_mode_is_applied_on_restart() {
    let Some((bpffs, _ns)) = bpffs_and_netns("the XDP mode test", "mode") else {
        return;
    };
    veth_pair("pa", "pb");
    veth_pair("pc", "pd");
    let pin = bpffs.path().join("ringlb").join("link_pa");

    assert_eq!(restart(&bpffs, "pa", AttachMode::Generic), "generic");
    assert_eq!(ip_link_mode("pa"), "xdpgeneric");
    let first = pinned_link_info(&pin).unwrap();
    let progs = xdp_progs(if_index("pa")).unwrap();
    assert_eq!(progs.mode_of(first.prog_id), Some(LinkMode::Generic));

    // Same mode: the program is replaced inside the same link (hitless).
    assert_eq!(restart(&bpffs, "pa", AttachMode::Generic), "replaced");
    assert_eq!(ip_link_mode("pa"), "xdpgeneric");
    // `auto` keeps the mode the link has.
    assert_eq!(restart(&bpffs, "pa", AttachMode::Auto), "replaced");
    assert_eq!(ip_link_mode("pa"), "xdpgeneric");

    // Native asked for: the link is detached and attached natively.
    assert_eq!(restart(&bpffs, "pa", AttachMode::Native), "native");
    assert_eq!(
        ip_link_mode("pa"),
        "xdp",
        "{}",
        sh(&["ip", "-d", "link", "show", "pa"])
    );
    let now = pinned_link_info(&pin).unwrap();
    let progs = xdp_progs(if_index("pa")).unwrap();
    assert_eq!(progs.mode_of(now.prog_id), Some(LinkMode::Native));
    assert_eq!(
        progs.generic, None,
        "the generic program is gone: {progs:?}"
    );

    // And back to generic.
    assert_eq!(restart(&bpffs, "pa", AttachMode::Generic), "generic");
    assert_eq!(ip_link_mode("pa"), "xdpgeneric");

    // Another interface: the old one's link is detached.
    assert_eq!(restart(&bpffs, "pc", AttachMode::Generic), "generic");
    assert_eq!(ip_link_mode("pc"), "xdpgeneric");
    assert_eq!(ip_link_mode("pa"), "none", "pa's link was detached");
    assert!(!pin.exists(), "pa's link was unpinned");

    // A loader with another pin directory meets pc's link: refused, saying why.
    let other = BpfFs::new("mode-other");
    let mut dp = load_pinned(other.path()).unwrap();
    let err = dp.attach("pc", AttachMode::Auto).unwrap_err().to_string();
    assert!(
        err.contains("not the link pinned in this --pin-dir"),
        "{err}"
    );
    assert!(err.contains("ip link set dev pc xdp off"), "{err}");
    drop(dp);
    assert_eq!(
        ip_link_mode("pc"),
        "xdpgeneric",
        "the first link is untouched"
    );

    let dir = bpffs.path().join("ringlb");
    XdpDatapath::remove_pins(&dir).unwrap();
    assert_eq!(ip_link_mode("pc"), "none");
}
