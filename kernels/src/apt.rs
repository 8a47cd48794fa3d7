//! Debian kernel packages through a private apt configuration: its own sources
//! list (more suites than the host uses), lists and download cache, all under the
//! matrix's cache directory. `apt-get download` only: nothing is installed and the
//! host's apt state is untouched.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result, bail};

use crate::catalog::{self, KernelLine};

const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// Lists younger than this are used as they are: a new kernel build is days
/// away, and a run that finds a package gone refreshes them anyway.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// The archive addresses the host already uses: (main archive, security archive),
/// from deb822 `*.sources` text and one-line `sources.list` text.
pub fn archive_uris(deb822: &str, one_line: &str) -> Option<(String, String)> {
    let mut main = None;
    let mut sec = None;
    let mut uri: Option<&str> = None;
    for l in deb822.lines() {
        if let Some(u) = l.strip_prefix("URIs:") {
            uri = u.split_whitespace().next();
        } else if let (Some(s), Some(u)) = (l.strip_prefix("Suites:"), uri) {
            let first = s.split_whitespace().next().unwrap_or("");
            if first.ends_with("-security") {
                sec.get_or_insert(u.to_string());
            } else if !first.contains('-') {
                main.get_or_insert(u.to_string());
            }
        }
    }
    for l in one_line.lines() {
        let cols: Vec<&str> = l
            .split_whitespace()
            .filter(|c| !c.starts_with('['))
            .collect();
        if let ["deb", u, suite, ..] = cols[..] {
            if suite.ends_with("-security") {
                sec.get_or_insert(u.to_string());
            } else if !suite.contains('-') {
                main.get_or_insert(u.to_string());
            }
        }
    }
    let main = main?;
    let sec = sec.unwrap_or_else(|| format!("{}-security", main.trim_end_matches('/')));
    Some((main, sec))
}

/// The private apt configuration under `dir`.
pub struct Apt {
    dir: PathBuf,
}

impl Apt {
    /// Writes the sources list and apt.conf (every run: cheap, and follows the host's
    /// archive address).
    pub fn new(dir: &Path) -> Result<Self> {
        for d in ["lists/partial", "archives/partial"] {
            fs::create_dir_all(dir.join(d))?;
        }
        let read_all = |d: &str, ext: &str| -> String {
            fs::read_dir(d)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == ext))
                .filter_map(|e| fs::read_to_string(e.path()).ok())
                .collect()
        };
        let deb822 = read_all("/etc/apt/sources.list.d", "sources");
        let one_line = fs::read_to_string("/etc/apt/sources.list").unwrap_or_default()
            + &read_all("/etc/apt/sources.list.d", "list");
        let (main, sec) = archive_uris(&deb822, &one_line)
            .context("no Debian archive address in the host's /etc/apt sources")?;
        let list: String = catalog::suites()
            .iter()
            .map(|s| {
                let uri = if s.ends_with("-security") {
                    &sec
                } else {
                    &main
                };
                format!("deb [signed-by={KEYRING}] {uri} {s} main\n")
            })
            .collect();
        fs::write(dir.join("sources.list"), list)?;
        let d = dir.display();
        fs::write(
            dir.join("apt.conf"),
            format!(
                "Dir::Etc::sourcelist \"{d}/sources.list\";\nDir::Etc::sourceparts \"-\";\n\
                 Dir::State::lists \"{d}/lists\";\nDir::Cache::archives \"{d}/archives\";\n\
                 Dir::Cache::pkgcache \"{d}/pkgcache.bin\";\n\
                 Dir::Cache::srcpkgcache \"{d}/srcpkgcache.bin\";\n\
                 APT::Sandbox::User \"root\";\n"
            ),
        )?;
        Ok(Apt {
            dir: dir.to_path_buf(),
        })
    }

    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        c.env("APT_CONFIG", self.dir.join("apt.conf"));
        c
    }

    fn output(&self, prog: &str, args: &[&str]) -> Result<String> {
        let out = self
            .cmd(prog)
            .args(args)
            .output()
            .with_context(|| format!("{prog} {args:?}"))?;
        if !out.status.success() {
            bail!(
                "{prog} {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `apt-get update` of the private lists, unless they are recent (or `force`).
    pub fn update(&self, force: bool) -> Result<()> {
        let stamp = self.dir.join("lists/.updated");
        let fresh = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < LISTS_MAX_AGE);
        if fresh && !force {
            return Ok(());
        }
        eprintln!("kernel-matrix: apt-get update (private lists)");
        self.output("apt-get", &["update", "-q"])?;
        fs::write(stamp, "")?;
        let _ = fs::remove_file(self.dir.join("resolved"));
        Ok(())
    }

    /// The packages that make up the newest kernel of `line`: the image package
    /// first (its name after `linux-image-` is the kernel's ABI name), then its
    /// split-out binary and modules packages if it has them.
    /// Remembered until the next `update` (apt-cache takes seconds per call).
    pub fn resolve(&self, line: &KernelLine) -> Result<Vec<String>> {
        let memo = self.dir.join("resolved");
        let known = fs::read_to_string(&memo).unwrap_or_default();
        if let Some(pkgs) = known
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{} ", line.label)))
        {
            return Ok(pkgs.split_whitespace().map(str::to_string).collect());
        }
        let pkgs = self.resolve_now(line)?;
        fs::write(&memo, format!("{known}{} {}\n", line.label, pkgs.join(" ")))?;
        Ok(pkgs)
    }

    fn resolve_now(&self, line: &KernelLine) -> Result<Vec<String>> {
        let madison = self.output("apt-cache", &["madison", "linux-image-amd64"])?;
        let ver = catalog::pick_version(&madison, line)
            .with_context(|| format!("no linux-image-amd64 in {:?}", line.suites))?;
        let meta = self.output("apt-cache", &["show", &format!("linux-image-amd64={ver}")])?;
        let image = catalog::depends_with_prefix(&meta, "linux-image-")
            .into_iter()
            .next()
            .with_context(|| format!("linux-image-amd64={ver} names no linux-image package"))?;
        self.packages_of(&image)
    }

    /// An image package given by name (`--kernel linux-image-...`) and its parts.
    pub fn packages_of(&self, image: &str) -> Result<Vec<String>> {
        let abi = image.strip_prefix("linux-image-").unwrap_or(image);
        let show = self.output("apt-cache", &["show", image])?;
        let mut pkgs = vec![image.to_string()];
        pkgs.extend(catalog::split_parts(&show, abi));
        Ok(pkgs)
    }

    /// Downloads `pkgs` into `dest` (skipping those already there); the .deb paths.
    pub fn download(&self, pkgs: &[String], dest: &Path) -> Result<Vec<PathBuf>> {
        fs::create_dir_all(dest)?;
        let find = |p: &str| -> Option<PathBuf> {
            fs::read_dir(dest)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .find(|f| {
                    f.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("{p}_")) && n.ends_with(".deb"))
                })
        };
        let missing: Vec<&str> = pkgs
            .iter()
            .map(String::as_str)
            .filter(|p| find(p).is_none())
            .collect();
        if !missing.is_empty() {
            eprintln!("kernel-matrix: downloading {}", missing.join(" "));
            let mut args = vec!["download", "-q"];
            args.extend(&missing);
            let out = self
                .cmd("apt-get")
                .args(&args)
                .current_dir(dest)
                .output()
                .context("apt-get download")?;
            if !out.status.success() {
                bail!(
                    "apt-get download {missing:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        pkgs.iter()
            .map(|p| find(p).with_context(|| format!("{p}: no .deb after download")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_addresses_come_from_deb822_sources() {
        let deb822 = "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\n\
                      Components: main\n\nTypes: deb\nURIs: http://deb.example/debian-security\n\
                      Suites: bookworm-security\n";
        assert_eq!(
            archive_uris(deb822, ""),
            Some((
                "http://deb.example/debian".into(),
                "http://deb.example/debian-security".into()
            ))
        );
    }

    #[test]
    fn archive_addresses_come_from_one_line_sources() {
        let list = "# comment\ndeb [arch=amd64] http://m.example/debian bookworm main\n\
                    deb http://m.example/debian bookworm-updates main\n";
        assert_eq!(
            archive_uris("", list),
            Some((
                "http://m.example/debian".into(),
                "http://m.example/debian-security".into()
            ))
        );
        assert_eq!(archive_uris("", ""), None);
    }
}
