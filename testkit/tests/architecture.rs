//! Keeps `docs/architecture.md` and the structure rules true:
//! - the crate graph in the doc is the one `cargo metadata` reports (regenerate
//!   with `RINGLB_BLESS=1 cargo nextest run -p ringlb-testkit --test architecture`);
//! - the controller builds nothing of the datapath or BGP; the BGP speaker and the
//!   datapath crates build nothing of Kubernetes;
//! - no Rust file over 800 lines, no function over 150.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BEGIN: &str = "<!-- BEGIN GENERATED: crate graph (see testkit/tests/architecture.rs) -->";
const END: &str = "<!-- END GENERATED -->";
const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 150;

fn root() -> PathBuf {
    ringlb_testkit::cargo::workspace_root()
}

fn metadata() -> Value {
    ringlb_testkit::cargo::metadata(&["--no-deps"])
}

/// Workspace crates: name -> (description, workspace crates it depends on, normal
/// and build dependencies only).
fn workspace_graph() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let md = metadata();
    let members: BTreeSet<String> = md["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    md["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .map(|d| d["name"].as_str().unwrap().to_string())
                .filter(|n| members.contains(n))
                .collect();
            let desc = p["description"].as_str().unwrap_or("").to_string();
            (p["name"].as_str().unwrap().to_string(), (desc, deps))
        })
        .collect()
}

fn render(graph: &BTreeMap<String, (String, BTreeSet<String>)>) -> String {
    let mut s = String::from("```mermaid\ngraph TD\n");
    for (name, (_, deps)) in graph {
        for d in deps {
            s.push_str(&format!("  {name} --> {d}\n"));
        }
    }
    s.push_str("```\n\n| crate | what it holds | depends on (workspace) |\n|---|---|---|\n");
    for (name, (desc, deps)) in graph {
        let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
        s.push_str(&format!("| `{name}` | {desc} | {} |\n", deps.join(", ")));
    }
    s
}

#[test]
fn the_architecture_doc_shows_the_crate_graph_cargo_reports() {
    let path = root().join("docs/architecture.md");
    let doc = std::fs::read_to_string(&path).expect("docs/architecture.md");
    let (a, b) = (
        doc.find(BEGIN).expect("begin marker"),
        doc.find(END).expect("end marker"),
    );
    let want = format!("{BEGIN}\n{}{END}", render(&workspace_graph()));
    let have = &doc[a..b + END.len()];
    if std::env::var_os("RINGLB_BLESS").is_some() {
        let new = format!("{}{want}{}", &doc[..a], &doc[b + END.len()..]);
        std::fs::write(&path, new).unwrap();
        return;
    }
    assert_eq!(
        have, want,
        "docs/architecture.md is stale: RINGLB_BLESS=1 cargo nextest run -p ringlb-testkit --test architecture"
    );
}

/// Every package `name` pulls in (normal and build dependencies, transitively, with
/// the features `name` itself enables: `cargo tree`, not the workspace-wide resolve).
fn closure(name: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-p", name, "-e", "normal,build"])
        .args(["--prefix", "none", "--format", "{p}"])
        .current_dir(root())
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn crates_build_only_what_their_job_needs() {
    let forbidden: &[(&str, &[&str])] = &[
        (
            "ringlb-controller",
            &["aya", "netlink-sys", "bgp-rs", "ringlb-xdp"],
        ),
        ("ringlb-bgp", &["kube", "k8s-openapi", "aya"]),
        ("ringlb-maglev", &["kube", "aya", "tokio"]),
        ("ringlb-xdp", &["kube", "k8s-openapi", "bgp-rs"]),
        ("ringlb-bpf-types", &["kube", "k8s-openapi", "tokio"]),
        ("ringlb-nexthop", &["kube", "k8s-openapi", "aya"]),
        ("ringlb-ipvs", &["aya", "kube", "k8s-openapi", "ringlb-xdp"]),
        ("ringlb-datapath", &["aya", "kube", "tokio"]),
        ("ringlb-edge", &["ringlb-testkit", "criterion", "proptest"]),
    ];
    for (krate, bad) in forbidden {
        let deps = closure(krate);
        for b in *bad {
            assert!(!deps.contains(*b), "{krate} depends on {b}");
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        // not through symlinks: a build's rootfs (images/out) links out of the tree
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            if !(name.starts_with('.') || name == "target" || name == "fuzz") {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// (name, first line, length) of every `fn` whose body is a brace block: from the
/// line that starts the item to the line whose closing brace is at its indentation.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        let is_fn = [
            "fn ",
            "pub fn ",
            "pub(crate) fn ",
            "pub(super) fn ",
            "async fn ",
            "pub async fn ",
            "pub(crate) async fn ",
        ]
        .iter()
        .any(|p| t.starts_with(p));
        if !is_fn {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let end = lines[i..].iter().position(|l| {
            *l == close
                || (l.trim_end().ends_with(';')
                    && l.len() - l.trim_start().len() == indent
                    && !l.contains('{'))
        });
        if let Some(n) = end {
            let after = &t[t.find("fn ").map_or(0, |f| f + 3)..];
            let name = after.split(['(', '<']).next().unwrap_or(after).to_string();
            out.push((name, i + 1, n + 1));
        }
    }
    out
}

#[test]
fn no_file_over_800_lines_and_no_function_over_150() {
    let mut files = Vec::new();
    rust_files(&root(), &mut files);
    assert!(files.len() > 50, "found the sources: {}", files.len());
    let mut problems = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let rel = f.strip_prefix(root()).unwrap_or(f).display().to_string();
        let n = text.lines().count();
        if n > MAX_FILE_LINES {
            problems.push(format!("{rel}: {n} lines (split it by concern)"));
        }
        for (name, line, len) in functions(&text) {
            if len > MAX_FN_LINES {
                problems.push(format!("{rel}:{line}: fn {name} is {len} lines"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_function_scanner_measures_what_it_should() {
    let src = "fn a() {\n    x();\n}\n\nimpl T {\n    pub fn b(&self) -> u8 {\n        1\n    }\n    fn c(&self);\n}\n";
    assert_eq!(
        functions(src),
        vec![("a".into(), 1, 3), ("b".into(), 6, 3), ("c".into(), 9, 1)]
    );
}
