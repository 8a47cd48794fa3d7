//! Which kernels the matrix boots, and how a kernel line (say "6.1") becomes the
//! Debian packages to download. Pure: the apt output comes in as text.

/// A line of Debian kernels: the suites that carry it, best first (a security
/// suite carries the newest build of a stable kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelLine {
    /// What the report calls it, and what `--kernel` takes.
    pub label: &'static str,
    pub suites: &'static [&'static str],
}

pub const LINES: &[KernelLine] = &[
    KernelLine {
        label: "5.10",
        suites: &["bullseye-security", "bullseye"],
    },
    KernelLine {
        label: "6.1",
        suites: &["bookworm-security", "bookworm"],
    },
    KernelLine {
        label: "6.12",
        suites: &["trixie-security", "trixie"],
    },
    KernelLine {
        label: "newest",
        suites: &["trixie-backports"],
    },
];

/// The kernels a plain `kernel-matrix` boots: every line Debian's archive has,
/// the datacenters' LTS kernels and the newest build.
pub const DEFAULT: &[&str] = &["5.10", "6.1", "6.12", "newest"];

/// Every suite the private apt configuration must list.
pub fn suites() -> Vec<&'static str> {
    let mut v: Vec<&str> = LINES
        .iter()
        .flat_map(|l| l.suites.iter().copied())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

pub fn line(label: &str) -> Option<&'static KernelLine> {
    LINES.iter().find(|l| l.label == label)
}

/// The version of `linux-image-amd64` to take for `line`, from `apt-cache
/// madison linux-image-amd64` (`pkg | version | archive suite/main arch Packages`):
/// the first (newest) row of the line's first suite that has one.
pub fn pick_version(madison: &str, line: &KernelLine) -> Option<String> {
    let rows: Vec<(&str, &str)> = madison
        .lines()
        .filter_map(|l| {
            let mut cols = l.split('|').map(str::trim);
            let (_pkg, ver, src) = (cols.next()?, cols.next()?, cols.next()?);
            let suite = src.split_whitespace().nth(1)?.split('/').next()?;
            Some((ver, suite))
        })
        .collect();
    line.suites.iter().find_map(|want| {
        rows.iter()
            .find(|(_, s)| s == want)
            .map(|(v, _)| v.to_string())
    })
}

/// Package names from an apt `Depends:` field that start with `prefix`
/// (alternatives and version constraints dropped).
pub fn depends_with_prefix(show: &str, prefix: &str) -> Vec<String> {
    let Some(dep) = show
        .lines()
        .find_map(|l| l.strip_prefix("Depends:"))
        .map(str::trim)
    else {
        return Vec::new();
    };
    dep.split([',', '|'])
        .filter_map(|d| d.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

/// From `linux-image-<abi>`'s own `Depends:`: the packages that carry its vmlinuz
/// and modules when Debian splits them out (6.16 and later: `linux-binary-<abi>`,
/// `linux-modules-<abi>`). Empty for the older one-package kernels.
pub fn split_parts(show: &str, abi: &str) -> Vec<String> {
    ["linux-binary-", "linux-modules-"]
        .iter()
        .flat_map(|p| depends_with_prefix(show, &format!("{p}{abi}")))
        .collect()
}

/// `(major, minor)` of a kernel release or ABI name ("5.10.0-46-amd64", "7.3.4+deb13-amd64").
pub fn major_minor(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MADISON: &str = "\
linux-image-amd64 | 7.3.4-1~bpo13+1 | http://deb.debian.org/debian trixie-backports/main amd64 Packages
linux-image-amd64 | 6.12.118-1 | http://deb.debian.org/debian-security trixie-security/main amd64 Packages
linux-image-amd64 | 6.12.117-1 | http://deb.debian.org/debian trixie/main amd64 Packages
linux-image-amd64 |  6.1.176-1 | http://deb.debian.org/debian bookworm/main amd64 Packages
linux-image-amd64 | 5.10.262-1 | http://deb.debian.org/debian-security bullseye-security/main amd64 Packages
linux-image-amd64 | 5.10.223-1 | http://deb.debian.org/debian bullseye/main amd64 Packages
";

    #[test]
    fn the_best_suite_with_a_build_wins() {
        let v = |l| pick_version(MADISON, line(l).unwrap());
        assert_eq!(v("5.10").as_deref(), Some("5.10.262-1"));
        // no bookworm-security row: falls back to bookworm
        assert_eq!(v("6.1").as_deref(), Some("6.1.176-1"));
        assert_eq!(v("6.12").as_deref(), Some("6.12.118-1"));
        assert_eq!(v("newest").as_deref(), Some("7.3.4-1~bpo13+1"));
        assert_eq!(pick_version("", line("6.1").unwrap()), None);
    }

    #[test]
    fn the_image_and_its_split_parts_come_from_depends() {
        let meta = "Package: linux-image-amd64\nDepends: linux-base-amd64 (= 7.3.4-1~bpo13+1), \
                    linux-image-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-modules-amd64\n";
        assert_eq!(
            depends_with_prefix(meta, "linux-image-"),
            ["linux-image-7.3.4+deb13-amd64"]
        );
        let image = "Depends: dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, \
                     linux-base-7.3.4+deb13-amd64 (= 1), linux-binary-7.3.4+deb13-amd64 (= 1), \
                     linux-modules-7.3.4+deb13-amd64 (= 1)\n";
        assert_eq!(
            split_parts(image, "7.3.4+deb13-amd64"),
            [
                "linux-binary-7.3.4+deb13-amd64",
                "linux-modules-7.3.4+deb13-amd64"
            ]
        );
        assert!(split_parts("Depends: kmod, initramfs-tools\n", "5.10.0-46-amd64").is_empty());
    }

    #[test]
    fn versions_compare_by_major_and_minor() {
        assert_eq!(major_minor("5.10.0-46-amd64"), Some((5, 10)));
        assert_eq!(major_minor("7.3.4+deb13-amd64"), Some((7, 3)));
        assert_eq!(major_minor("6.1"), Some((6, 1)));
        assert_eq!(major_minor("newest"), None);
        assert!(suites().contains(&"trixie-backports"));
    }
}
