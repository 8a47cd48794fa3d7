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
        "--interface",
        "--xdp-mode",
        "--ring-size",
        "--drain-seconds",
    ] {
        assert!(text.contains(want), "run --help lacks {want}:\n{text}");
    }
}

#[test]
fn bad_input_is_refused_with_the_flag_named() {
    let run_args = ["run", "--node-name", "n", "--interface", "lo"];
    let cases: [(&[&str], &[&str], &str); 3] = [
        (&["--metrics-addr", "nonsense"], &[], "--metrics-addr"),
        (&["--log-level", "info,["], &[], "--log-level"),
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
