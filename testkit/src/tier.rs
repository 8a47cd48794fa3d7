//! What a test does when it cannot run here (docs/conventions.md, "Tests").
//!
//! Tests that need root are left out of a plain `cargo nextest run` by the
//! `default-filter` of `.config/nextest.toml`, which reports them as skipped. A
//! test that is run and still finds something missing (root, a routing daemon, a
//! kernel feature) calls [`skip`]: it prints why and returns, except under
//! `CI=true` (or `CI=1`), where a skip would make a green run mean nothing ran, so
//! it fails the test instead.

use std::fmt::Display;

/// Whether this run is CI's: `CI` is `true` or `1` (any case).
pub fn ci() -> bool {
    ci_value(std::env::var("CI").ok().as_deref())
}

fn ci_value(v: Option<&str>) -> bool {
    v.is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// The test cannot run here for `reason`: prints `SKIP: reason` (the kernel
/// matrix looks for that word) so the caller can return; under CI, panics with the
/// reason instead.
#[track_caller]
pub fn skip(reason: impl Display) {
    if ci() {
        panic!("a test may not skip under CI=true: {reason}");
    }
    eprintln!("SKIP: {reason}");
}

/// `true` when running as root; otherwise [`skip`]s with `what` and returns `false`.
///
/// ```no_run
/// if !ringlb_testkit::tier::require_root("the netns traffic test (netns, BPF, tc)") {
///     return;
/// }
/// ```
#[track_caller]
pub fn require_root(what: &str) -> bool {
    if crate::netns::is_root() {
        return true;
    }
    skip(format_args!("{what} needs root"));
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_is_true_or_1() {
        for v in ["true", "TRUE", "True", "1"] {
            assert!(ci_value(Some(v)), "{v}");
        }
        for v in [None, Some(""), Some("false"), Some("0"), Some("yes")] {
            assert!(!ci_value(v), "{v:?}");
        }
    }
}
