//! The guard's I/O: the [`Nft`] trait (run one script as a transaction, read the
//! table's named counters) with two implementations. [`NftCommand`] runs the `nft`
//! binary: the script on the stdin of `nft -f -`, the counters from `nft -j list
//! counters table inet ringlb_guard`. [`MemoryNft`] (feature `memory-kernel`,
//! tests only) holds the table in memory and fails on demand.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use super::ruleset::TABLE;
use crate::Error;

/// What the guard needs from nftables.
pub trait Nft: Send {
    /// Runs `script` as one transaction: all of it or nothing.
    fn apply(&mut self, script: &str) -> Result<(), Error>;
    /// Packets of every named counter of the table; `None` when there is no table.
    fn counters(&mut self) -> Result<Option<BTreeMap<String, u64>>, Error>;
}

/// nft's answer when the table (or anything named) does not exist.
const NO_SUCH: &str = "No such file or directory";

/// The `nft` binary (in this process's network namespace, or the command line
/// given to [`NftCommand::with_command`]).
#[derive(Clone, Debug)]
pub struct NftCommand {
    argv: Vec<String>,
}

impl NftCommand {
    /// `nft` from `PATH`, checked with `nft list tables`: the binary runs and the
    /// kernel answers for nf_tables.
    pub fn open() -> Result<Self, Error> {
        Self::with_command(vec!["nft".into()])
    }

    /// `argv` in place of `nft` (tests: `ip netns exec NS nft`), checked the same way.
    pub fn with_command(argv: Vec<String>) -> Result<Self, Error> {
        let nft = NftCommand { argv };
        nft.run(&["list", "tables"], None)?;
        Ok(nft)
    }

    /// Runs nft with `args`, `stdin` on its standard input; its standard output.
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, Error> {
        let op = format!("{} {}", self.argv.join(" "), args.join(" "));
        let fail = |detail: String| Error::Guard {
            op: op.clone(),
            detail,
        };
        let mut child = Command::new(&self.argv[0])
            .args(&self.argv[1..])
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                fail(format!(
                    "cannot run {:?}: {e} (the IPVS datapath needs nft, Debian's nftables package)",
                    self.argv[0]
                ))
            })?;
        if let (Some(script), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(script.as_bytes())
                .map_err(|e| fail(format!("writing the script to nft: {e}")))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| fail(format!("waiting for nft: {e}")))?;
        if !out.status.success() {
            return Err(fail(format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Nft for NftCommand {
    fn apply(&mut self, script: &str) -> Result<(), Error> {
        self.run(&["-f", "-"], Some(script)).map(drop)
    }

    fn counters(&mut self) -> Result<Option<BTreeMap<String, u64>>, Error> {
        let mut args = vec!["-j", "list", "counters", "table"];
        args.extend(TABLE.split(' '));
        match self.run(&args, None) {
            Ok(json) => parse_counters(&json)
                .map(Some)
                .map_err(|detail| Error::Guard {
                    op: format!("nft {}", args.join(" ")),
                    detail,
                }),
            Err(Error::Guard { detail, .. }) if detail.contains(NO_SUCH) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The packets of each named counter of the table, from `nft -j list counters`.
pub fn parse_counters(json: &str) -> Result<BTreeMap<String, u64>, String> {
    let v: serde_json::Value =
        serde_json::from_str(json.trim()).map_err(|e| format!("nft printed no JSON ({e})"))?;
    let items = v["nftables"]
        .as_array()
        .ok_or("nft's JSON has no \"nftables\" list")?;
    let (family, table) = TABLE.split_once(' ').unwrap_or_default();
    let mut out = BTreeMap::new();
    for c in items.iter().filter_map(|i| i.get("counter")) {
        if c["family"] != family || c["table"] != table {
            continue;
        }
        let (Some(name), Some(packets)) = (c["name"].as_str(), c["packets"].as_u64()) else {
            return Err(format!("a counter without name or packets: {c}"));
        };
        out.insert(name.to_string(), packets);
    }
    Ok(out)
}

#[cfg(any(test, feature = "memory-kernel"))]
pub use memory::{MemoryNft, MemoryNftState};

#[cfg(any(test, feature = "memory-kernel"))]
mod memory {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex, MutexGuard};

    use super::Nft;
    use crate::Error;
    use crate::guard::ruleset::removal;

    /// The table as nftables would hold it.
    #[derive(Clone, Debug, Default)]
    pub struct MemoryNftState {
        /// The script that made the table (`None`: no table).
        pub table: Option<String>,
        /// Packets per named counter of the table; a replaced table starts at 0.
        pub counters: BTreeMap<String, u64>,
        /// Every script applied, in order.
        pub applied: Vec<String>,
        /// Every apply fails while set (nothing changes).
        pub fail_apply: bool,
        /// Every read fails while set.
        pub fail_read: bool,
    }

    /// nftables in memory, for tests of the guard without a kernel (feature
    /// `memory-kernel`). Clones share one state, so a test keeps a handle to the
    /// one it gave the datapath.
    #[derive(Clone, Debug, Default)]
    pub struct MemoryNft(Arc<Mutex<MemoryNftState>>);

    impl MemoryNft {
        pub fn state(&self) -> MutexGuard<'_, MemoryNftState> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    fn injected(op: &str) -> Error {
        Error::Guard {
            op: op.into(),
            detail: "injected failure".into(),
        }
    }

    impl Nft for MemoryNft {
        fn apply(&mut self, script: &str) -> Result<(), Error> {
            let mut s = self.state();
            if s.fail_apply {
                return Err(injected("nft -f -"));
            }
            s.applied.push(script.to_string());
            if script == removal() {
                s.table = None;
                s.counters.clear();
                return Ok(());
            }
            // every named counter the script declares, at 0
            s.counters = script
                .lines()
                .filter_map(|l| l.trim().strip_prefix("counter "))
                .filter_map(|l| l.strip_suffix(" {"))
                .map(|name| (name.to_string(), 0))
                .collect();
            s.table = Some(script.to_string());
            Ok(())
        }

        fn counters(&mut self) -> Result<Option<BTreeMap<String, u64>>, Error> {
            let s = self.state();
            if s.fail_read {
                return Err(injected("nft -j list counters"));
            }
            Ok(s.table.as_ref().map(|_| s.counters.clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_of_the_guard_table_only() {
        let j = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
            {"counter": {"family": "inet", "name": "drop_no_service", "table": "ringlb_guard", "handle": 5, "packets": 42, "bytes": 3000}},
            {"counter": {"family": "inet", "name": "src_10.100.0.1_tcp_443", "table": "ringlb_guard", "handle": 8, "packets": 0, "bytes": 0}},
            {"counter": {"family": "ip", "name": "drop_no_service", "table": "other", "handle": 1, "packets": 9, "bytes": 9}}]}"#;
        let c = parse_counters(j).unwrap();
        assert_eq!(
            c,
            BTreeMap::from([
                ("drop_no_service".to_string(), 42),
                ("src_10.100.0.1_tcp_443".to_string(), 0),
            ])
        );
        assert!(
            parse_counters("Error: oops")
                .unwrap_err()
                .contains("no JSON")
        );
        assert!(parse_counters("{}").is_err());
    }

    /// A missing binary and a refused script are errors that name the table, the
    /// command and what nft said; a missing table reads as none.
    #[test]
    fn nft_errors_name_the_command_and_say_what_nft_said() {
        let e = NftCommand::with_command(vec!["/nonexistent/nft".into()]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("inet ringlb_guard")
                && msg.contains("/nonexistent/nft")
                && msg.contains("nftables package"),
            "{msg}"
        );
        assert_eq!(e.metric_label(), "guard");
        // `sh -c '...' nft ARGS`: a fake nft that fails like nft does
        let fake = |body: &str| NftCommand {
            argv: vec!["sh".into(), "-c".into(), body.into(), "nft".into()],
        };
        let mut refused = fake("cat >/dev/null; echo 'Error: syntax error' >&2; exit 1");
        let msg = refused
            .apply("table inet ringlb_guard {")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("nft -f -") && msg.contains("Error: syntax error"),
            "{msg}"
        );
        let mut absent = fake("echo 'Error: No such file or directory' >&2; exit 1");
        assert_eq!(absent.counters().unwrap(), None);
        let mut reads = fake(r#"echo '{"nftables": []}'"#);
        assert_eq!(reads.counters().unwrap(), Some(BTreeMap::new()));
    }
}
