//! The oldest Linux each ringlb datapath runs on, and the start-up check that
//! refuses an older kernel with a message naming the running kernel, the minimum
//! and why (instead of a BPF verifier log or a netlink error). The floors come
//! from the kernel matrix (docs/kernels.md). Pure but for [`running_release`].
//!
//! `RINGLB_SKIP_KERNEL_CHECK=1` skips the refusal, for kernels whose release
//! number understates what they carry (vendor kernels with backports); a kernel
//! that really lacks a feature then fails later, with the kernel's own error.

use std::fmt;

/// A kernel release's version numbers, from `uname -r` (`5.10.0-46-amd64`,
/// `6.1.0-56-cloud-amd64`, `7.3.4+bpo-amd64`, `6.12.118+deb13-amd64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32) -> Self {
        Version {
            major,
            minor,
            patch: 0,
        }
    }

    /// The leading `major.minor[.patch]` of a release string; `None` when it does
    /// not start with one.
    pub fn parse(release: &str) -> Option<Version> {
        let head = release
            .trim()
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .next()?;
        let mut n = head.split('.').filter(|s| !s.is_empty());
        let major = n.next()?.parse().ok()?;
        let minor = n.next()?.parse().ok()?;
        let patch = n.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        Some(Version {
            major,
            minor,
            patch,
        })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What a part of ringlb needs from the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requirement {
    /// The part, as the user started it.
    pub what: &'static str,
    /// Refused below this.
    pub min: Version,
    /// Why nothing older works.
    pub why: &'static str,
    /// The oldest kernel the matrix has run it on (a warning between `min` and
    /// this).
    pub tested_from: Version,
}

/// `ringlb-edge run --datapath xdp`.
pub const XDP_EDGE: Requirement = Requirement {
    what: "ringlb-edge run --datapath xdp (the XDP program ringlb_xdp)",
    min: Version::new(5, 10),
    why: "5.10 is the oldest kernel whose BPF verifier is known to accept ringlb_xdp \
          (the kernel matrix: 5.10, 6.1, 6.12 and 7.3 pass; nothing older is tested); \
          on an older kernel use --datapath ipvs",
    tested_from: Version::new(5, 10),
};

/// `ringlb-edge run --datapath ipvs`.
pub const IPVS_EDGE: Requirement = Requirement {
    what: "ringlb-edge run --datapath ipvs",
    min: Version::new(4, 18),
    why: "the IPVS Maglev scheduler `mh` appeared in Linux 4.18",
    tested_from: Version::new(5, 10),
};

/// `ringlb-edge node`.
pub const NODE: Requirement = Requirement {
    what: "ringlb-edge node (the tc programs ringlb_node_ingress/egress)",
    min: Version::new(5, 17),
    why: "the MSS clamp walks the TCP options with the bpf_loop helper (Linux 5.17); \
          from 6.1 everything but 4-in-6 decap (6.3) works, from 6.12 all of it",
    tested_from: Version::new(6, 1),
};

/// The refusal: the running kernel is older than a requirement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooOld {
    pub release: String,
    pub req: Requirement,
}

impl fmt::Display for TooOld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "this kernel is Linux {}; {} needs Linux {} or newer: {}. \
             (RINGLB_SKIP_KERNEL_CHECK=1 skips this check for a vendor kernel with backports.)",
            self.release, self.req.what, self.req.min, self.req.why
        )
    }
}

impl std::error::Error for TooOld {}

/// What the check found about a kernel that is not refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// At least as new as the oldest tested kernel.
    Supported,
    /// Newer than the minimum but older than any kernel the matrix ran: a warning.
    Untested,
    /// The release string has no version number: nothing is refused, a warning.
    Unknown,
}

/// Checks `release` (as `uname -r` prints it) against `req`.
pub fn check(release: &str, req: &Requirement) -> Result<Verdict, TooOld> {
    let Some(v) = Version::parse(release) else {
        return Ok(Verdict::Unknown);
    };
    if v < req.min {
        return Err(TooOld {
            release: release.trim().to_string(),
            req: *req,
        });
    }
    Ok(if v < req.tested_from {
        Verdict::Untested
    } else {
        Verdict::Supported
    })
}

/// The running kernel's release (`/proc/sys/kernel/osrelease`, what `uname -r`
/// prints).
pub fn running_release() -> std::io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/osrelease")?
        .trim()
        .to_string())
}

/// The start-up check of a program: refuses a too-old running kernel (unless
/// `RINGLB_SKIP_KERNEL_CHECK=1`), logs a warning for an untested or unreadable
/// one.
pub fn require(req: &Requirement) -> Result<(), TooOld> {
    let release = match running_release() {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, what = req.what, "cannot read the kernel release; not checking it");
            return Ok(());
        }
    };
    let skip = std::env::var("RINGLB_SKIP_KERNEL_CHECK").is_ok_and(|v| v == "1");
    match check(&release, req) {
        Ok(Verdict::Supported) => Ok(()),
        Ok(Verdict::Untested) => {
            tracing::warn!(%release, what = req.what, tested_from = %req.tested_from, "this kernel is older than any the kernel matrix tested");
            Ok(())
        }
        Ok(Verdict::Unknown) => {
            tracing::warn!(%release, what = req.what, "no version number in the kernel release; not checking it");
            Ok(())
        }
        Err(e) if skip => {
            tracing::warn!(%e, "RINGLB_SKIP_KERNEL_CHECK=1: starting anyway");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_as_uname_prints_them() {
        let v = |s| Version::parse(s).map(|v| (v.major, v.minor, v.patch));
        assert_eq!(v("5.10.0-46-amd64"), Some((5, 10, 0)));
        assert_eq!(v("6.1.0-56-cloud-amd64"), Some((6, 1, 0)));
        assert_eq!(v("7.3.4+bpo-amd64"), Some((7, 3, 4)));
        assert_eq!(v("6.12.118+deb13-amd64"), Some((6, 12, 118)));
        assert_eq!(v("6.18.44-fc-v769\n"), Some((6, 18, 44)));
        assert_eq!(v("4.18.0-553.el8_10.x86_64"), Some((4, 18, 0)));
        assert_eq!(v("6.8"), Some((6, 8, 0)));
        assert_eq!(v("5.17-rc3"), Some((5, 17, 0)));
        for bad in ["", "linux", "6", "6.", ".10", "x5.10"] {
            assert_eq!(v(bad), None, "{bad:?}");
        }
        // 5.10 is newer than 5.9: numbers, not strings
        assert!(Version::parse("5.10.0").unwrap() > Version::parse("5.9.16").unwrap());
    }

    #[test]
    fn each_datapath_refuses_a_kernel_older_than_its_floor() {
        assert_eq!(check("5.10.0-46-amd64", &XDP_EDGE), Ok(Verdict::Supported));
        assert_eq!(check("7.3.4+bpo-amd64", &XDP_EDGE), Ok(Verdict::Supported));
        assert!(check("5.4.0-150-generic", &XDP_EDGE).is_err());
        assert_eq!(
            check("4.18.0-553.el8_10.x86_64", &IPVS_EDGE),
            Ok(Verdict::Untested)
        );
        assert_eq!(check("5.10.0-46-amd64", &IPVS_EDGE), Ok(Verdict::Supported));
        assert!(check("4.17.19", &IPVS_EDGE).is_err());
        assert!(check("5.10.0-46-amd64", &NODE).is_err());
        assert!(check("5.16.20", &NODE).is_err());
        assert_eq!(check("5.17.0", &NODE), Ok(Verdict::Untested));
        assert_eq!(check("6.1.0-56-cloud-amd64", &NODE), Ok(Verdict::Supported));
        assert_eq!(check("no version", &NODE), Ok(Verdict::Unknown));
    }

    #[test]
    fn the_refusal_names_the_kernel_the_minimum_and_why() {
        let e = check("5.10.0-46-amd64", &NODE).unwrap_err().to_string();
        for part in [
            "Linux 5.10.0-46-amd64",
            "ringlb-edge node",
            "Linux 5.17 or newer",
            "bpf_loop",
        ] {
            assert!(e.contains(part), "{part:?} in {e}");
        }
        let e = check("4.9.0-19-amd64", &IPVS_EDGE).unwrap_err().to_string();
        assert!(
            e.contains("Linux 4.18 or newer") && e.contains("`mh`"),
            "{e}"
        );
        let e = check("5.4.0", &XDP_EDGE).unwrap_err().to_string();
        assert!(e.contains("--datapath ipvs"), "{e}");
    }
}
