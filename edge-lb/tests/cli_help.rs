//! `--help` shows real usage with the common flags, and bad flags fail clearly.

use std::process::Command;

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringlb-edge"))
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn help_lists_common_flags_and_subcommands() {
    let (ok, text) = run(&["--help"]);
    assert!(ok, "{text}");
    for want in [
        "--kubeconfig",
        "--metrics-addr",
        "--log-level",
        "run",
        "speaker",
    ] {
        assert!(text.contains(want), "--help lacks {want}:\n{text}");
    }
    let (ok, text) = run(&["run", "--help"]);
    assert!(ok, "{text}");
    for want in [
        "--node-name",
        "--datapath",
        "--interface",
        "--xdp-mode",
        "--forwarding",
        "--mh-port",
        "--mh-fallback",
        "--ring-size",
        "--drain",
        "--kubeconfig",
    ] {
        assert!(text.contains(want), "run --help lacks {want}:\n{text}");
    }
}

#[test]
fn bad_input_is_refused_with_the_flag_named() {
    let run_args = ["run", "--node-name", "n", "--interface", "lo"];
    let cases: [(&[&str], &[&str], &str); 7] = [
        (&["--metrics-addr", "nonsense"], &[], "--metrics-addr"),
        (&["--log-level", "info,["], &[], "--log-level"),
        // the common flags work after the subcommand too
        (&[], &["--metrics-addr", "nonsense"], "--metrics-addr"),
        (&[], &["--log-level", "info,["], "--log-level"),
        (&[], &["--drain", "soon"], "--drain"),
        // a pin directory off bpffs is refused before anything is created, with the fix
        (
            &[],
            &["--pin-dir", "/proc/ringlb", "--source-v4", "192.0.2.1"],
            "mount -t bpf bpf /sys/fs/bpf",
        ),
        (
            &[],
            &["--ring-size", "1000", "--source-v4", "192.0.2.1"],
            "--ring-size 1000",
        ),
    ];
    for (before, after, named) in cases {
        let args: Vec<&str> = before
            .iter()
            .chain(&run_args)
            .chain(after)
            .copied()
            .collect();
        let (ok, text) = run(&args);
        assert!(!ok, "{args:?} was accepted");
        assert!(
            text.contains(named),
            "{args:?}: the error does not name {named}:\n{text}"
        );
    }
}

#[test]
fn the_datapath_flags_are_checked() {
    let base = ["run", "--node-name", "n", "--source-v4", "192.0.2.1"];
    let with = |extra: &[&str]| run(&[&base[..], extra].concat());
    let (ok, text) = with(&[]);
    assert!(
        !ok && text.contains("--interface is required with --datapath xdp"),
        "{text}"
    );
    let (ok, text) = with(&["--datapath", "nft"]);
    assert!(!ok && text.contains("--datapath"), "{text}");
    let (ok, text) = with(&["--datapath", "ipvs", "--forwarding", "nat"]);
    assert!(!ok && text.contains("--forwarding"), "{text}");
}

/// The `--flags` in `text`.
fn flags_in(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("--") {
        let tail = &rest[i + 2..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        if name.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.insert(format!("--{name}"));
        }
        rest = &tail[end..];
    }
    out
}

/// docs/operating.md's "### Flags" section and `--help` name the same flags: every flag of every
/// `ringlb-edge` command is in the section, and every flag the section's `ringlb-edge`
/// paragraphs name is one the program takes.
#[test]
fn readme_flags_section_matches_help() {
    let readme = include_str!("../../docs/operating.md");
    let start = readme
        .find("### Flags")
        .expect("docs/operating.md has a ### Flags section");
    let section = &readme[start..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let documented = flags_in(section);

    let mut helped = std::collections::BTreeSet::new();
    for cmd in [
        &[][..],
        &["run"],
        &["node"],
        &["node", "uninstall"],
        &["speaker"],
        &["datapath"],
        &["datapath", "dump"],
        &["datapath", "counters"],
        &["datapath", "lookup"],
        &["datapath", "uninstall"],
    ] {
        let args: Vec<&str> = cmd.iter().copied().chain(["--help"]).collect();
        let (ok, text) = run(&args);
        assert!(ok, "{args:?}: {text}");
        for flag in flags_in(&text) {
            if flag != "--help" && flag != "--version" {
                assert!(
                    documented.contains(&flag),
                    "`ringlb-edge {}` takes {flag}, docs/operating.md's Flags section does not name it",
                    cmd.join(" ")
                );
            }
            helped.insert(flag);
        }
    }
    // hidden aliases still accepted: say so, but they are not in --help
    helped.insert("--drain-seconds".into());
    for para in section.split("\n\n") {
        if para.trim_start().starts_with("`ringlb-edge") {
            for flag in flags_in(para) {
                assert!(
                    helped.contains(&flag),
                    "docs/operating.md names {flag} for ringlb-edge, which no `--help` of it lists:\n{para}"
                );
            }
        }
    }
}
