//! Licences, checked on every `make test` from `cargo metadata --offline`:
//! - every workspace crate sets its own `license`;
//! - every crate it links (normal and build dependencies, transitively, on every
//!   target) has a licence that crate may be combined with: permissive licences and
//!   MPL-2.0 everywhere; GPL-3.0-compatible copyleft (bgp-rs is `GPL-3.0`) only in a
//!   crate that is itself GPL-3.0;
//! - the licence texts the crates name are in the repository, and the programs'
//!   crates have the licences docs/operating.md, "Licences", says.
//!
//! Dev-dependencies are left out: test binaries are not distributed, so a test of
//! an Apache-2.0 crate may use a GPL helper. MPL-2.0 is allowed everywhere because
//! its copyleft is per file: it asks that changes to the MPL files themselves stay
//! MPL, not that the work linking them does. Why GPL and where: docs/operating.md, "Licences".

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;

use serde_json::Value;

/// Licences any crate may link. SPDX identifiers, plus the deprecated spellings
/// crates still publish.
const PERMISSIVE: &[&str] = &[
    "0BSD",
    "Apache-2.0",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "BSL-1.0",
    "CC0-1.0",
    "CDLA-Permissive-2.0",
    "ISC",
    "MIT",
    "MIT-0",
    "MPL-2.0",
    "Unicode-3.0",
    "Unicode-DFS-2016",
    "Unlicense",
    "Zlib",
];

/// Copyleft licences a GPL-3.0 crate may link: GPL-3.0 itself, and the ones that
/// allow relicensing or linking into a GPL-3.0 work. GPL-2.0-only is not here.
const GPL3_COMPATIBLE: &[&str] = &[
    "GPL-3.0",
    "GPL-3.0-only",
    "GPL-3.0-or-later",
    "GPL-2.0-or-later",
    "LGPL-2.1-or-later",
    "LGPL-3.0",
    "LGPL-3.0-only",
    "LGPL-3.0-or-later",
];

/// Dependencies that publish only a `license-file`: name -> the SPDX expression its
/// file holds (read it before adding a line).
const LICENSE_FILE_ONLY: &[(&str, &str)] = &[
    // rand 0.4's Fuchsia RNG (a dev-dependency of ringlb-bench today): the
    // three-clause BSD text of the Fuchsia authors.
    ("fuchsia-cprng", "BSD-3-Clause"),
];

/// The programs, with the licence their crate must declare; images/Dockerfile labels
/// each image with the licence of the program as a whole (testkit/tests/images.rs).
const PROGRAMS: &[(&str, &str)] = &[
    ("ringlb-controller", "Apache-2.0"),
    // Links bgp-rs (GPL-3.0 only): the binary as a whole is GPL-3.0-only.
    ("ringlb-edge", "GPL-3.0-or-later"),
];

fn root() -> PathBuf {
    ringlb_testkit::cargo::workspace_root()
}

/// The resolve for the platform the programs are built for here (the images are
/// linux/amd64). Also what keeps this test working on a fresh machine: offline,
/// `cargo metadata` of every platform needs crates no Linux build downloads
/// (`android_system_properties`, the Windows crates), and fails without them.
fn metadata() -> Value {
    let platform = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    ringlb_testkit::cargo::metadata(&["--filter-platform", &platform])
}

// ---- SPDX expressions: OR, AND, WITH, parentheses, and the old `/` for OR ----

#[derive(Debug, PartialEq)]
enum Expr {
    Id(String),
    With(String, String),
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

fn tokens(s: &str) -> Vec<String> {
    s.replace('(', " ( ")
        .replace(')', " ) ")
        .replace('/', " OR ")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

struct Parser {
    toks: Vec<String>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&str> {
        self.toks.get(self.pos).map(String::as_str)
    }

    fn next(&mut self) -> Result<String, String> {
        let t = self.toks.get(self.pos).cloned().ok_or("unexpected end")?;
        self.pos += 1;
        Ok(t)
    }

    /// `item (op item)*`: the one item, or `many` of them all.
    fn list(
        &mut self,
        op: &str,
        item: fn(&mut Self) -> Result<Expr, String>,
        many: fn(Vec<Expr>) -> Expr,
    ) -> Result<Expr, String> {
        let mut items = vec![item(self)?];
        while self.peek().is_some_and(|t| t.eq_ignore_ascii_case(op)) {
            self.pos += 1;
            items.push(item(self)?);
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            many(items)
        })
    }

    fn or(&mut self) -> Result<Expr, String> {
        self.list("OR", Self::and, Expr::Or)
    }

    fn and(&mut self) -> Result<Expr, String> {
        self.list("AND", Self::with, Expr::And)
    }

    fn with(&mut self) -> Result<Expr, String> {
        let atom = self.atom()?;
        if !self.peek().is_some_and(|t| t.eq_ignore_ascii_case("WITH")) {
            return Ok(atom);
        }
        self.pos += 1;
        match atom {
            Expr::Id(id) => Ok(Expr::With(id, self.next()?)),
            other => Err(format!("WITH after a group: {other:?}")),
        }
    }

    fn atom(&mut self) -> Result<Expr, String> {
        let t = self.next()?;
        match t.as_str() {
            "(" => {
                let e = self.or()?;
                match self.next()?.as_str() {
                    ")" => Ok(e),
                    other => Err(format!("expected `)`, found `{other}`")),
                }
            }
            ")" | "AND" | "OR" | "WITH" => Err(format!("unexpected `{t}`")),
            // `GPL-2.0+` is the old spelling of `GPL-2.0-or-later`.
            id => Ok(Expr::Id(match id.strip_suffix('+') {
                Some(base) => format!("{base}-or-later"),
                None => id.to_string(),
            })),
        }
    }
}

fn parse(s: &str) -> Result<Expr, String> {
    let mut p = Parser {
        toks: tokens(s),
        pos: 0,
    };
    let e = p.or()?;
    match p.peek() {
        None => Ok(e),
        Some(t) => Err(format!("trailing `{t}` in `{s}`")),
    }
}

/// Whether some choice among the ORs uses only `allowed` licences. An exception
/// (`WITH LLVM-exception`) only adds permissions, so the base licence decides.
fn satisfiable(e: &Expr, allowed: &BTreeSet<&str>) -> bool {
    match e {
        Expr::Id(id) | Expr::With(id, _) => allowed.contains(id.as_str()),
        Expr::And(items) => items.iter().all(|i| satisfiable(i, allowed)),
        Expr::Or(items) => items.iter().any(|i| satisfiable(i, allowed)),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Policy {
    Permissive,
    Gpl3,
}

impl Policy {
    fn allowed(self) -> BTreeSet<&'static str> {
        let mut s: BTreeSet<&str> = PERMISSIVE.iter().copied().collect();
        if self == Policy::Gpl3 {
            s.extend(GPL3_COMPATIBLE);
        }
        s
    }

    /// A crate that can be used under a permissive licence keeps its users free of
    /// copyleft, so it may link only permissive crates; a GPL-3.0 crate may also
    /// link GPL-3.0-compatible ones.
    fn of(license: &Expr) -> Option<Policy> {
        [Policy::Permissive, Policy::Gpl3]
            .into_iter()
            .find(|p| satisfiable(license, &p.allowed()))
    }
}

struct Package {
    name: String,
    version: String,
    license: Option<String>,
}

fn packages(md: &Value) -> BTreeMap<String, Package> {
    md["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let name = p["name"].as_str().unwrap().to_string();
            let license = p["license"].as_str().map(str::to_string).or_else(|| {
                LICENSE_FILE_ONLY
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, l)| l.to_string())
            });
            let pkg = Package {
                name,
                version: p["version"].as_str().unwrap().to_string(),
                license,
            };
            (p["id"].as_str().unwrap().to_string(), pkg)
        })
        .collect()
}

/// id -> the ids it links: normal and build dependencies, any target.
fn link_edges(md: &Value) -> BTreeMap<String, Vec<String>> {
    md["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let deps = n["deps"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|k| k["kind"].as_str() != Some("dev"))
                })
                .map(|d| d["pkg"].as_str().unwrap().to_string())
                .collect();
            (n["id"].as_str().unwrap().to_string(), deps)
        })
        .collect()
}

/// Every package `from` links, with the chain of names that brings it in.
fn closure(edges: &BTreeMap<String, Vec<String>>, from: &str) -> BTreeMap<String, Vec<String>> {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut queue = VecDeque::from([(from.to_string(), Vec::new())]);
    while let Some((id, path)) = queue.pop_front() {
        for dep in edges.get(&id).into_iter().flatten() {
            if dep != from && !seen.contains_key(dep) {
                let mut p = path.clone();
                p.push(dep.clone());
                seen.insert(dep.clone(), p.clone());
                queue.push_back((dep.clone(), p));
            }
        }
    }
    seen
}

/// The problems with one workspace crate's licence and what it links.
fn check_member(
    id: &str,
    pkgs: &BTreeMap<String, Package>,
    edges: &BTreeMap<String, Vec<String>>,
) -> Vec<String> {
    let me = &pkgs[id];
    let Some(own) = &me.license else {
        return vec![format!("{}: no `license` in its Cargo.toml", me.name)];
    };
    let policy = match parse(own).map(|e| Policy::of(&e)) {
        Ok(Some(p)) => p,
        Ok(None) => {
            return vec![format!(
                "{}: its own licence `{own}` is not allowed",
                me.name
            )];
        }
        Err(e) => return vec![format!("{}: cannot parse `{own}`: {e}", me.name)],
    };
    let allowed = policy.allowed();
    let mut problems = Vec::new();
    for (dep, path) in closure(edges, id) {
        let d = &pkgs[&dep];
        let chain: Vec<&str> = path.iter().map(|p| pkgs[p].name.as_str()).collect();
        let why = match &d.license {
            None => {
                Some("no licence field (add it to LICENSE_FILE_ONLY after reading its file)".into())
            }
            Some(l) => match parse(l) {
                Err(e) => Some(format!("unparsable `{l}`: {e}")),
                Ok(e) if !satisfiable(&e, &allowed) => Some(format!("`{l}`")),
                Ok(_) => None,
            },
        };
        if let Some(why) = why {
            problems.push(format!(
                "{} ({own}, may link {policy:?}) links {} {}: {why} (via {})",
                me.name,
                d.name,
                d.version,
                chain.join(" -> ")
            ));
        }
    }
    problems
}

/// The packages, the link edges and the ids of the workspace's members.
type Workspace = (
    BTreeMap<String, Package>,
    BTreeMap<String, Vec<String>>,
    Vec<String>,
);

fn workspace() -> Workspace {
    let md = metadata();
    let members = md["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    (packages(&md), link_edges(&md), members)
}

#[test]
fn every_crate_links_only_licences_it_may() {
    let (pkgs, edges, members) = workspace();
    let mut problems = Vec::new();
    for m in &members {
        problems.extend(check_member(m, &pkgs, &edges));
    }
    assert!(
        problems.is_empty(),
        "licence problems (see testkit/tests/licenses.rs and docs/operating.md, Licences):\n{}",
        problems.join("\n")
    );
}

#[test]
fn gpl_reaches_only_gpl_crates() {
    // The point of the split: the controller and the libraries stay Apache-2.0.
    let (pkgs, edges, members) = workspace();
    let mut gpl = BTreeSet::new();
    for m in &members {
        if closure(&edges, m).keys().any(|d| pkgs[d].name == "bgp-rs") {
            gpl.insert(pkgs[m].name.clone());
        }
    }
    let expected: BTreeSet<String> = ["ringlb-bench", "ringlb-bgp", "ringlb-e2e", "ringlb-edge"]
        .map(String::from)
        .into();
    assert_eq!(
        gpl, expected,
        "the crates that link bgp-rs changed: set their `license` (docs/operating.md, Licences)"
    );
}

#[test]
fn licence_texts_and_program_licences() {
    let root = root();
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_default();
    assert!(read("LICENSE").contains("Apache License\n                           Version 2.0"));
    assert!(
        read("LICENSE-GPL-3.0")
            .contains("GNU GENERAL PUBLIC LICENSE\n                       Version 3")
    );
    let md = metadata();
    let pkgs = packages(&md);
    for (program, licence) in PROGRAMS {
        let pkg = pkgs.values().find(|p| p.name == *program).unwrap();
        assert_eq!(pkg.license.as_deref(), Some(*licence), "{program}");
    }
}

#[test]
fn spdx_parser() {
    let id = |s: &str| Expr::Id(s.into());
    assert_eq!(parse("MIT").unwrap(), id("MIT"));
    assert_eq!(
        parse("MIT/Apache-2.0").unwrap(),
        Expr::Or(vec![id("MIT"), id("Apache-2.0")])
    );
    assert_eq!(
        parse("(MIT OR Apache-2.0) AND Unicode-3.0").unwrap(),
        Expr::And(vec![
            Expr::Or(vec![id("MIT"), id("Apache-2.0")]),
            id("Unicode-3.0")
        ])
    );
    assert_eq!(
        parse("Apache-2.0 WITH LLVM-exception OR MIT").unwrap(),
        Expr::Or(vec![
            Expr::With("Apache-2.0".into(), "LLVM-exception".into()),
            id("MIT")
        ])
    );
    assert_eq!(parse("GPL-2.0+").unwrap(), id("GPL-2.0-or-later"));
    assert!(parse("MIT OR").is_err());
    assert!(parse("(MIT").is_err());
    assert!(parse("MIT Apache-2.0").is_err());

    let permissive = Policy::Permissive.allowed();
    let ok = |s: &str, a: &BTreeSet<&str>| satisfiable(&parse(s).unwrap(), a);
    assert!(ok("MIT OR Apache-2.0 OR LGPL-2.1-or-later", &permissive));
    assert!(!ok("GPL-3.0", &permissive));
    assert!(!ok("MIT AND GPL-3.0", &permissive));
    assert!(ok("GPL-3.0", &Policy::Gpl3.allowed()));
    assert!(!ok("GPL-2.0-only", &Policy::Gpl3.allowed()));
    assert_eq!(
        Policy::of(&parse("Apache-2.0").unwrap()),
        Some(Policy::Permissive)
    );
    assert_eq!(
        Policy::of(&parse("GPL-3.0-or-later").unwrap()),
        Some(Policy::Gpl3)
    );
    assert_eq!(Policy::of(&parse("GPL-2.0-only").unwrap()), None);
}
