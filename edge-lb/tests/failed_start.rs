//! A start that fails leaves the node as it found it: `ringlb-edge run` and
//! `ringlb-edge node` with a kubeconfig that points nowhere, as root in a throwaway
//! network namespace with a veth, exit with an error naming the API's URL, and leave
//! no XDP or tc program on the interface and nothing in the pin directory.
//! Needs root (namespaces, bpffs); skips with a message otherwise.

use std::path::Path;
use std::process::Command;

use ringlb_testkit::netns::{BpfFs, Netns, in_netns, is_root, sh, xdp_prog_id};

const EDGE: &str = env!("CARGO_BIN_EXE_ringlb-edge");

/// A kubeconfig whose API server is loopback port 1, where nothing listens.
fn unreachable_kubeconfig(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig-unreachable");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user: {}\n",
    )
    .unwrap();
    path
}

/// Runs `ringlb-edge ARGS` in `ns`; (success, stdout + stderr).
fn edge_in(ns: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, EDGE])
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn pins(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).map_or(Vec::new(), |rd| {
        rd.flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    })
}

#[test]
fn a_start_with_an_unreachable_api_leaves_no_program_and_no_pin() {
    if !is_root() {
        eprintln!("SKIPPED failed_start: needs root (network namespace, bpffs, XDP)");
        return;
    }
    let tag = format!("fs{}", std::process::id());
    let ns = Netns::new(&format!("rlb-{tag}"));
    sh(&[
        "ip", "-n", &ns.0, "link", "add", "v0", "type", "veth", "peer", "name", "v1",
    ]);
    sh(&["ip", "-n", &ns.0, "link", "set", "v0", "up"]);
    sh(&["ip", "-n", &ns.0, "link", "set", "v1", "up"]);
    let bpffs = BpfFs::new(&tag);
    let kubeconfig = unreachable_kubeconfig(bpffs.path().parent().unwrap());
    let kc = kubeconfig.display().to_string();

    let edge_pins = bpffs.path().join("edge");
    let (ok, text) = edge_in(
        &ns.0,
        &[
            "run",
            "--kubeconfig",
            &kc,
            "--node-name",
            "n1",
            "--interface",
            "v0",
            "--source-v4",
            "192.0.2.1",
            "--pin-dir",
            &edge_pins.display().to_string(),
            "--metrics-addr",
            "127.0.0.1:0",
            "--bgp-listen-port",
            "0",
        ],
    );
    let node_pins = bpffs.path().join("node");
    let (node_ok, node_text) = edge_in(
        &ns.0,
        &[
            "node",
            "--kubeconfig",
            &kc,
            "--node-name",
            "n1",
            "--interface",
            "v1",
            "--pin-dir",
            &node_pins.display().to_string(),
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    );
    let xdp = in_netns(&ns.0, || xdp_prog_id("v0"));
    let tc = sh(&[
        "ip", "netns", "exec", &ns.0, "tc", "filter", "show", "dev", "v1", "ingress",
    ]);
    let _ = std::fs::remove_file(&kubeconfig);

    assert!(!ok, "run started without an API:\n{text}");
    assert!(
        text.contains("http://127.0.0.1:1"),
        "the error does not name the URL:\n{text}"
    );
    assert!(!node_ok, "node started without an API:\n{node_text}");
    assert!(
        node_text.contains("http://127.0.0.1:1"),
        "the error does not name the URL:\n{node_text}"
    );
    assert_eq!(xdp, None, "an XDP program was left on v0");
    assert!(!tc.contains("bpf"), "a tc program was left on v1: {tc}");
    assert_eq!(pins(&edge_pins), Vec::<String>::new(), "edge pins left");
    assert_eq!(pins(&node_pins), Vec::<String>::new(), "node pins left");
}

/// `run --datapath ipvs` on a kernel without IPVS (this test's host kernel, when it
/// has none) stops before the API is asked, naming the missing IPVS and the
/// `modprobe` that would add it, and leaves nothing on the node.
#[test]
fn an_ipvs_start_on_a_kernel_without_ipvs_names_it_before_the_api() {
    // IPVS loaded, or a module the kernel would load when the agent resolves the
    // IPVS netlink family (MODULE_ALIAS_GENL_FAMILY): then there is no absence
    // to show.
    let loadable = Command::new("modprobe")
        .args(["-n", "-q", "ip_vs"])
        .status()
        .is_ok_and(|s| s.success());
    if std::path::Path::new("/proc/net/ip_vs").exists() || loadable {
        eprintln!(
            "SKIPPED an_ipvs_start_on_a_kernel_without_ipvs: this kernel HAS IPVS \
             (/proc/net/ip_vs exists or `modprobe -n ip_vs` succeeds), so its absence \
             cannot be shown here"
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("rlb-noipvs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = unreachable_kubeconfig(&dir);
    let out = Command::new(EDGE)
        .args([
            "run",
            "--datapath",
            "ipvs",
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--node-name",
            "n1",
            "--source-v4",
            "192.0.2.1",
            "--metrics-addr",
            "127.0.0.1:0",
            "--bgp-listen-port",
            "0",
        ])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "run started without IPVS:\n{text}");
    assert!(
        text.contains("this kernel has no IPVS (modprobe ip_vs ip_vs_mh)"),
        "the error does not name the missing IPVS:\n{text}"
    );
    assert!(
        !text.contains("127.0.0.1:1"),
        "the API was asked before the kernel was checked:\n{text}"
    );
}
