//! Reading a guest's results port (framed by guest/init.sh) into per-test
//! outcomes, and the kernel × test table. Pure: text in, values and text out.

use std::collections::BTreeSet;

use crate::catalog::major_minor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail,
    /// Passed by returning early: the test printed SKIP (no root, no VLAN, ...).
    Skip,
    Ignored,
    /// Failed where a known kernel limit says it must (see [`EXPECTED`]).
    ExpectedFail,
}

impl Outcome {
    fn cell(self) -> &'static str {
        match self {
            Outcome::Pass => "ok",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "skip",
            Outcome::Ignored => "ign",
            Outcome::ExpectedFail => "xfail",
        }
    }
}

/// One test of one executable; `name` is `(did not finish, rc N)` when the
/// executable died or timed out before libtest's summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestResult {
    pub bin: String,
    pub name: String,
    pub outcome: Outcome,
    /// Why an expected failure is expected.
    pub reason: Option<&'static str>,
    /// What the test printed before its status (its panic, its SKIP).
    pub output: String,
}

impl TestResult {
    fn failed(&self) -> bool {
        matches!(self.outcome, Outcome::Fail | Outcome::ExpectedFail)
    }
}

/// What one guest reported.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct GuestReport {
    pub release: Option<String>,
    pub modules_failed: Vec<String>,
    pub tests: Vec<TestResult>,
    /// Seconds each test executable ran.
    pub seconds: Vec<(String, f64)>,
    /// init reached the end (`@@DONE`): the guest neither hung nor crashed.
    pub done: bool,
}

/// The guest's uptime in a marker's `at 12.34s`.
fn uptime(marker: &str) -> Option<f64> {
    let (_, t) = marker.split_once(" at ")?;
    t.trim().strip_suffix('s')?.parse().ok()
}

/// A known kernel limit: on kernels older than `below`, a test that fails with
/// `needle` in its output fails for `reason`, not because of a regression. Any
/// other failure on those kernels still fails the matrix.
pub struct Expected {
    pub below: (u32, u32),
    pub needle: &'static str,
    pub reason: &'static str,
}

/// What the matrix found (docs/kernels.md has the verifier traces). Kernels
/// 6.13 to 6.17 are not in Debian's archive to test; 6.18 (a dev VM) and 7.3 load
/// both programs.
pub const EXPECTED: &[Expected] = &[
    Expected {
        below: (6, 3),
        needle: "needs Linux 6.3 to change the family",
        reason: "ringlb_node_ingress: 4-in-6 decap (bpf_skb_adjust_room changing the \
                 L3 family, BPF_F_ADJ_ROOM_DECAP_L3_IPV4: Linux 6.3)",
    },
    Expected {
        below: (6, 12),
        needle: "mss_at_an_odd_offset_is_clamped_with_a_right_checksum",
        reason: "ringlb_node_egress: the TCP checksum after clamping an MSS option at \
                 an odd offset is wrong on 6.1 (not understood yet; an MSS option at \
                 an even offset, the usual place, is right)",
    },
    Expected {
        below: (5, 12),
        needle: "the flow filter needs BPF atomic OR (Linux 5.12)",
        reason: "ringlb_xdp: the flow filter's bit sets (BPF atomic OR: Linux 5.12); \
                 the loader gives older kernels the build without the filter, whose \
                 every SYN looks conntrack up",
    },
    Expected {
        below: (5, 17),
        needle: "number of funcs in func_info doesn't match number of subprogs",
        reason: "ringlb_node_*: the bpf_loop callback (bpf_loop: Linux 5.17)",
    },
];

fn expected(release: &str, output: &str) -> Option<&'static Expected> {
    let v = major_minor(release)?;
    EXPECTED
        .iter()
        .find(|e| v < e.below && output.contains(e.needle))
}

/// libtest's word after `test NAME ... `, or alone on a line after a test's output.
fn status(rest: &str) -> Option<Outcome> {
    match rest.trim() {
        "ok" => Some(Outcome::Pass),
        "FAILED" => Some(Outcome::Fail),
        "ignored" => Some(Outcome::Ignored),
        r if r.starts_with("ignored, ") => Some(Outcome::Ignored),
        _ => None,
    }
}

/// A test whose status line has not come yet.
struct Running {
    name: String,
    output: String,
}

/// Parses the results port. With `--nocapture` a test's own output sits between
/// `test NAME ... ` and its status word (alone on a line then).
/// What the guest printed between `@@BEGIN <bin>` and `@@END <bin>`, and the
/// exit status (a benchmark's output; `None` if it never began or ended).
pub fn section(text: &str, bin: &str) -> Option<(String, i32)> {
    let begin = text.find(&format!("@@BEGIN {bin} "))?;
    let body = &text[begin..];
    let body = &body[body.find('\n')? + 1..];
    let end_marker = format!("@@END {bin} ");
    let end = body.find(&end_marker)?;
    let rc = body[end + end_marker.len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((body[..end].to_string(), rc))
}

pub fn parse(text: &str) -> GuestReport {
    let mut r = GuestReport::default();
    let mut bin: Option<String> = None;
    let mut running: Option<Running> = None;
    let mut summary = false;
    let mut began = None;
    // a marker can follow a test's unfinished line (`test x ... @@END ...`)
    let lines = text.lines().flat_map(|l| match l.find("@@") {
        Some(i) if i > 0 => vec![&l[..i], &l[i..]],
        _ => vec![l],
    });
    for line in lines {
        let line = line.trim_end_matches('\r');
        if let Some(rel) = line.strip_prefix("@@KERNEL ") {
            r.release = Some(rel.trim().to_string());
        } else if let Some(m) = line.strip_prefix("@@MODULE ") {
            let mut w = m.split_whitespace();
            if let (Some(name), Some(st)) = (w.next(), w.next())
                && st != "ok"
            {
                r.modules_failed.push(name.to_string());
            }
        } else if let Some(b) = line.strip_prefix("@@BEGIN ") {
            bin = b.split_whitespace().next().map(str::to_string);
            began = uptime(b);
            (running, summary) = (None, false);
        } else if let Some(e) = line.strip_prefix("@@END ") {
            let rc = e.split_whitespace().nth(1).unwrap_or("?");
            if let (Some(b), Some(t0), Some(t1)) = (&bin, began, uptime(e)) {
                r.seconds.push((b.clone(), t1 - t0));
            }
            if let Some(b) = bin.take()
                && (!summary || rc != "0")
                && !(summary && r.tests.iter().any(|t| t.bin == b && t.failed()))
            {
                let (test, output) = running
                    .take()
                    .map(|t| (t.name + " ", t.output))
                    .unwrap_or_default();
                r.tests.push(TestResult {
                    bin: b,
                    name: format!("{test}(did not finish, rc {rc})"),
                    outcome: Outcome::Fail,
                    reason: None,
                    output,
                });
            }
            running = None;
        } else if line.starts_with("@@DONE") {
            r.done = true;
        } else if let Some(b) = &bin {
            summary |= line.starts_with("test result: ");
            if let Some(t) = line.strip_prefix("test ")
                && let Some((name, rest)) = t.split_once(" ... ")
            {
                running = Some(Running {
                    name: name.to_string(),
                    output: String::new(),
                });
                if status(rest).is_none() {
                    let out = &mut running.as_mut().unwrap().output;
                    out.push_str(rest);
                    out.push('\n');
                    continue;
                }
            }
            let Some(t) = running.as_mut() else { continue };
            let word = line.split_once(" ... ").map_or(line, |(_, rest)| rest);
            let Some(o) = status(word) else {
                t.output.push_str(line);
                t.output.push('\n');
                continue;
            };
            let t = running.take().unwrap();
            let skip = o == Outcome::Pass && t.output.contains("SKIP");
            let xfail = (o == Outcome::Fail)
                .then(|| {
                    r.release
                        .as_deref()
                        .and_then(|rel| expected(rel, &t.output))
                })
                .flatten();
            r.tests.push(TestResult {
                bin: b.clone(),
                name: t.name,
                outcome: match (skip, xfail) {
                    (true, _) => Outcome::Skip,
                    (_, Some(_)) => Outcome::ExpectedFail,
                    _ => o,
                },
                reason: xfail.map(|e| e.reason),
                output: t.output,
            });
        }
    }
    if let Some(b) = bin {
        r.tests.push(TestResult {
            bin: b,
            name: "(guest stopped during this executable)".into(),
            outcome: Outcome::Fail,
            reason: None,
            output: running.map(|t| t.output).unwrap_or_default(),
        });
    }
    r
}

/// Counts over all kernels; a guest that did not finish counts as one failure.
/// A test that skipped itself in a guest is a failure too: a guest is root and
/// loads every module the tests need, so a skip there means a module or a kernel
/// feature went missing (an IPVS test that printed SKIP would otherwise pass).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub passed: usize,
    /// Failed, skipped by the test itself, or in a guest that did not finish.
    pub failed: usize,
    pub expected: usize,
    /// `#[ignore]`d.
    pub skipped: usize,
    /// Of `failed`: the tests that skipped themselves.
    pub self_skipped: usize,
}

pub fn totals(runs: &[(String, GuestReport)]) -> Totals {
    let mut n = Totals::default();
    for (_, g) in runs {
        n.failed += usize::from(!g.done);
        for t in &g.tests {
            match t.outcome {
                Outcome::Pass => n.passed += 1,
                Outcome::Fail => n.failed += 1,
                Outcome::ExpectedFail => n.expected += 1,
                Outcome::Skip => {
                    n.failed += 1;
                    n.self_skipped += 1;
                }
                Outcome::Ignored => n.skipped += 1,
            }
        }
    }
    n
}

/// What the table does not show for one kernel: why failures were expected,
/// modules that did not load, how long each test executable ran.
pub fn notes(label: &str, g: &GuestReport) -> String {
    let mut s = format!("{label}:");
    let reasons: BTreeSet<&str> = g.tests.iter().filter_map(|t| t.reason).collect();
    for r in reasons {
        let n = g.tests.iter().filter(|t| t.reason == Some(r)).count();
        s.push_str(&format!("\n  xfail x{n}: {r}"));
    }
    if !g.modules_failed.is_empty() {
        s.push_str(&format!(
            "\n  modules that did not load: {:?}",
            g.modules_failed
        ));
    }
    let times: Vec<String> = g
        .seconds
        .iter()
        .map(|(b, t)| format!("{b} {t:.0}s"))
        .collect();
    s.push_str(&format!("\n  seconds: {}", times.join(", ")));
    s
}

/// Lines of a failed test's output [`failures`] shows: the last ones (a
/// panic's message, or the end of a verifier log), after the line that says
/// where it panicked.
const FAILURE_LINES: usize = 6;

/// Characters of one such line shown (a verifier log can be one long line).
const FAILURE_LINE_CHARS: usize = 300;

/// The lines of `output` that [`failures`] shows, indented.
fn failure_excerpt(output: &str) -> String {
    let lines: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines.len().saturating_sub(FAILURE_LINES);
    let panic = lines[..tail].iter().position(|l| l.contains("panicked at"));
    panic
        .into_iter()
        .chain(tail..lines.len())
        .map(|i| {
            let l: String = lines[i].chars().take(FAILURE_LINE_CHARS).collect();
            format!("    {l}\n")
        })
        .collect()
}

/// What failed and why, kernel by kernel: each failed (or self-skipped) test
/// with the last lines of its output, and each guest that did not finish.
/// Printed just above the matrix's closing line, so a log's tail names them.
pub fn failures(runs: &[(String, GuestReport)]) -> String {
    let mut s = String::new();
    for (label, g) in runs {
        if !g.done {
            s.push_str(&format!(
                "FAILED on {label}: the guest did not finish (see its console.log)\n"
            ));
        }
        for t in g
            .tests
            .iter()
            .filter(|t| matches!(t.outcome, Outcome::Fail | Outcome::Skip))
        {
            let what = if t.outcome == Outcome::Skip {
                "skipped itself"
            } else {
                "FAILED"
            };
            s.push_str(&format!("{what} on {label}: {}::{}\n", t.bin, t.name));
            s.push_str(&failure_excerpt(&t.output));
        }
    }
    s
}

/// A markdown table: one row per test, one column per kernel.
pub fn table(runs: &[(String, GuestReport)]) -> String {
    let rows: BTreeSet<(String, String)> = runs
        .iter()
        .flat_map(|(_, g)| g.tests.iter().map(|t| (t.bin.clone(), t.name.clone())))
        .collect();
    let mut s = String::from("| test |");
    for (label, g) in runs {
        let rel = g.release.as_deref().unwrap_or("no boot");
        s.push_str(&format!(" {label} ({rel}) |"));
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(runs.len()));
    s.push('\n');
    for (bin, name) in &rows {
        s.push_str(&format!("| {bin}::{name} |"));
        for (_, g) in runs {
            let cell = g
                .tests
                .iter()
                .find(|t| &t.bin == bin && &t.name == name)
                .map_or("—", |t| t.outcome.cell());
            s.push_str(&format!(" {cell} |"));
        }
        s.push('\n');
    }
    s.push_str("| (guest finished) |");
    for (_, g) in runs {
        s.push_str(if g.done { " ok |" } else { " FAIL |" });
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_benchmark_section_is_cut_out_with_its_status() {
        let t = "@@KERNEL 6.1\n@@BEGIN ipvs-bench at 3.1s\n| a | b |\nratio 2.0\n@@END ipvs-bench 0 at 9.5s\n@@DONE\n";
        assert_eq!(
            section(t, "ipvs-bench"),
            Some(("| a | b |\nratio 2.0\n".to_string(), 0))
        );
        let failed = "@@BEGIN x at 1s\nError: no IPVS\n@@END x 1 at 2s\n";
        assert_eq!(
            section(failed, "x"),
            Some(("Error: no IPVS\n".to_string(), 1))
        );
        assert_eq!(section("@@BEGIN x at 1s\nhung", "x"), None);
        assert_eq!(section(t, "other"), None);
    }

    const PORT: &str = "@@KERNEL 6.1.0-56-amd64\r
@@MODULE veth ok
@@MODULE nft_counter FAILED modprobe: module nft_counter not found
@@BEGIN xdp_fixtures

running 3 tests
test abi_sizes_match_object ... ok
test ipv4_tcp_is_ipip_encapsulated_with_exact_bytes ... SKIP: xdp fixtures need root
ok
test needs_vlan ... SKIPPED needs_vlan: this kernel cannot create VLAN devices
ok
test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 2.17s

@@END xdp_fixtures 0
@@BEGIN node_fixtures at 10.5s

running 3 tests
test abi_matches_object ... thread 'abi_matches_object' panicked at node/tests/x.rs:1:1:
loading node.o: the BPF_PROG_LOAD syscall failed. Verifier output: unknown func bpf_loop#181
FAILED
test mss ... 
thread 'mss' panicked at node/tests/support/mod.rs:52:44:
loading node.o: verifier_log: ; if (bpf_skb_load_bytes(skb, l4 + 20, w.opts, w.olen))
assertion failed: 4-in-6 decap needs Linux 6.3 to change the family
FAILED
test later ... ignored

failures:
    abi_matches_object

test result: FAILED. 0 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out

@@END node_fixtures 101 at 12.75s
@@BEGIN node_netns
running 1 test
test edge_to_node ... @@END node_netns 124
@@BEGIN xdp_vlan
";

    #[test]
    fn libtest_lines_become_outcomes() {
        let g = parse(PORT);
        assert_eq!(g.release.as_deref(), Some("6.1.0-56-amd64"));
        assert_eq!(g.modules_failed, ["nft_counter"]);
        assert!(!g.done);
        assert_eq!(g.seconds, [("node_fixtures".to_string(), 2.25)]);
        let got: Vec<(&str, &str, Outcome)> = g
            .tests
            .iter()
            .map(|t| (t.bin.as_str(), t.name.as_str(), t.outcome))
            .collect();
        assert_eq!(
            got,
            [
                ("xdp_fixtures", "abi_sizes_match_object", Outcome::Pass),
                (
                    "xdp_fixtures",
                    "ipv4_tcp_is_ipip_encapsulated_with_exact_bytes",
                    Outcome::Skip
                ),
                ("xdp_fixtures", "needs_vlan", Outcome::Skip),
                ("node_fixtures", "abi_matches_object", Outcome::Fail),
                ("node_fixtures", "mss", Outcome::ExpectedFail),
                ("node_fixtures", "later", Outcome::Ignored),
                (
                    "node_netns",
                    "edge_to_node (did not finish, rc 124)",
                    Outcome::Fail
                ),
                (
                    "xdp_vlan",
                    "(guest stopped during this executable)",
                    Outcome::Fail
                ),
            ]
        );
        assert!(
            g.tests[4]
                .reason
                .unwrap()
                .starts_with("ringlb_node_ingress")
        );
        let xfail_only = "@@KERNEL 6.1.0-56-amd64\n@@BEGIN n\ntest mss ... \n4-in-6 decap \
                          needs Linux 6.3 to change the family\nFAILED\ntest result: FAILED.\n@@END n 101\n";
        assert_eq!(parse(xfail_only).tests.len(), 1);
        // the same failure on a kernel that should load the program is a failure
        let newer = parse(&PORT.replace("6.1.0-56-amd64", "6.18.1"));
        assert_eq!(newer.tests[4].outcome, Outcome::Fail);
    }

    #[test]
    fn a_failures_excerpt_keeps_where_it_panicked_and_the_last_lines() {
        let long = "x".repeat(500);
        let out = format!(
            "setup\nthread 't' panicked at a.rs:1:2:\nloading: verifier log:\n1\n\n2\n3\n4\n5\n{long}\n"
        );
        let want = format!(
            "    thread 't' panicked at a.rs:1:2:\n    1\n    2\n    3\n    4\n    5\n    {}\n",
            "x".repeat(300)
        );
        assert_eq!(failure_excerpt(&out), want);
        // a panic among the last lines is shown once
        assert_eq!(
            failure_excerpt("a\nthread 't' panicked at b.rs:3:4:\nboom\n"),
            "    a\n    thread 't' panicked at b.rs:3:4:\n    boom\n"
        );
    }

    #[test]
    fn the_table_has_a_column_per_kernel_and_totals_count_unfinished_guests() {
        let done = parse(
            "@@KERNEL 5.10.0-46-amd64\n@@BEGIN a\ntest t ... ok\ntest result: ok.\n@@END a 0\n@@DONE\n",
        );
        assert!(done.done);
        let runs = vec![("5.10".to_string(), done), ("6.1".to_string(), parse(PORT))];
        let t = table(&runs);
        assert!(t.starts_with("| test | 5.10 (5.10.0-46-amd64) | 6.1 (6.1.0-56-amd64) |\n"));
        assert!(t.contains("| a::t | ok | — |\n"), "{t}");
        assert!(
            t.contains("| node_fixtures::abi_matches_object | — | FAIL |\n"),
            "{t}"
        );
        assert!(t.ends_with("| (guest finished) | ok | FAIL |\n"));
        let f = failures(&runs);
        assert!(
            f.starts_with("FAILED on 6.1: the guest did not finish"),
            "{f}"
        );
        assert!(
            f.contains(
                "FAILED on 6.1: node_fixtures::abi_matches_object\n    thread 'abi_matches_object' \
                 panicked at node/tests/x.rs:1:1:\n    loading node.o: the BPF_PROG_LOAD syscall \
                 failed. Verifier output: unknown func bpf_loop#181\n"
            ),
            "{f}"
        );
        assert!(
            f.contains("skipped itself on 6.1: xdp_fixtures::needs_vlan\n    SKIPPED needs_vlan"),
            "{f}"
        );
        assert!(
            f.contains("FAILED on 6.1: node_netns::edge_to_node (did not finish, rc 124)\n"),
            "{f}"
        );
        assert!(
            !f.contains("5.10") && !f.contains("mss"),
            "passes and xfails are not listed: {f}"
        );
        assert_eq!(
            totals(&runs),
            Totals {
                passed: 2,
                failed: 6,
                expected: 1,
                skipped: 1,
                self_skipped: 2,
            }
        );
    }
}
