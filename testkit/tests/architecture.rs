//! Keeps `docs/architecture.md` and the structure rules true:
//! - the crate graph in the doc is the one `cargo metadata` reports (regenerate
//!   with `RINGLB_BLESS=1 cargo nextest run -p ringlb-testkit --test architecture`);
//! - the controller builds nothing of the datapath or BGP; the BGP speaker and the
//!   datapath crates build nothing of Kubernetes;
//! - no Rust file over 800 lines, no function over 150;
//! - no two files of a crate need each other (`no_file_cycles_within_a_crate`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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
    let out = ringlb_testkit::cargo::cargo(&[
        "tree",
        "--offline",
        "-p",
        name,
        "-e",
        "normal,build",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ]);
    String::from_utf8_lossy(&out)
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

// ---- file cycles ----------------------------------------------------------

/// A token of Rust source, as far as paths and modules need: comments, lifetimes,
/// char literals and numbers are dropped.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Path, // `::`
    Punct(char),
}

/// The tokens of `src` with their line numbers.
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let ident_char = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let (mut depth, start) = (0, i);
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += c[start..i].iter().filter(|&&x| x == '\n').count();
        } else if ch == '"' {
            let start = i + 1;
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            let s: String = c[start..i.min(c.len())].iter().collect();
            out.push((Tok::Str(s.clone()), line));
            line += s.matches('\n').count();
            i += 1;
        } else if ch == '\'' {
            // a char literal ('x', '\n', '\u{..}') or a lifetime / label
            if at(i + 1) == '\\' {
                i += 3; // past the escaped char, which may be a quote
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && ident_char(c[i]) {
                    i += 1;
                }
            }
        } else if ident_char(ch) {
            let start = i;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let raw = matches!(word.as_str(), "r" | "br" | "cr");
            if raw && (at(i) == '"' || (at(i) == '#' && matches!(at(i + 1), '#' | '"'))) {
                let hashes = c[i..].iter().take_while(|&&x| x == '#').count();
                let close: String = std::iter::once('"')
                    .chain("#".repeat(hashes).chars())
                    .collect();
                let body_start = i + hashes + 1;
                let rest: String = c[body_start..].iter().collect();
                let len = rest.find(&close).unwrap_or(rest.len());
                let body = &rest[..len];
                out.push((Tok::Str(body.to_string()), line));
                line += body.matches('\n').count();
                i = body_start + body.chars().count() + close.chars().count();
            } else if word == "r" && at(i) == '#' {
                i += 1; // a raw identifier: the word follows
            } else if ch.is_ascii_digit() {
                // a number: no path in it
            } else {
                out.push((Tok::Ident(word), line));
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// One leaf of a `use` tree: the path, and the name it binds (none for a glob).
type UseLeaf = (Vec<String>, Option<String>);

/// The leaves of the `use` tree at `t[*i..]`, under `prefix`.
fn use_tree(t: &[(Tok, usize)], i: &mut usize, prefix: &[String], out: &mut Vec<UseLeaf>) {
    let mut path = prefix.to_vec();
    loop {
        match t.get(*i).map(|x| &x.0) {
            Some(Tok::Path) => *i += 1,
            Some(Tok::Ident(w)) if w == "as" => {
                if let Some(Tok::Ident(alias)) = t.get(*i + 1).map(|x| &x.0) {
                    out.push((path, Some(alias.clone()).filter(|a| a != "_")));
                }
                *i += 2;
                return;
            }
            // `a::{self, B}` binds `a`
            Some(Tok::Ident(w)) if w == "self" && !path.is_empty() => {
                *i += 1;
                out.push((path.clone(), path.last().cloned()));
            }
            Some(Tok::Ident(w)) => {
                path.push(w.clone());
                *i += 1;
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                out.push((path, None));
                return;
            }
            Some(Tok::Punct('{')) => {
                *i += 1;
                loop {
                    match t.get(*i).map(|x| &x.0) {
                        None => return,
                        Some(Tok::Punct('}')) => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::Punct(',')) => *i += 1,
                        _ => {
                            let before = *i;
                            use_tree(t, i, &path, out);
                            *i = (*i).max(before + 1);
                        }
                    }
                }
            }
            _ => {
                if path.len() > prefix.len() {
                    let name = path.last().cloned();
                    out.push((path, name));
                }
                return;
            }
        }
    }
}

/// What one file declares and refers to. Module paths here are relative to the
/// file's own module: `[]` is the file, `["tests"]` its inline `mod tests { .. }`.
#[derive(Default)]
struct Scan {
    /// `mod x;`: the inline module it sits in, its name and its `#[path]`.
    mods: Vec<(Vec<String>, String, Option<String>)>,
    /// Every `mod x { .. }`.
    inline: Vec<Vec<String>>,
    /// `use` leaves: (inline module, leaf, line).
    uses: Vec<(Vec<String>, UseLeaf, usize)>,
    /// `crate::`, `super::` and `self::` paths outside `use`: (inline module, path, line).
    paths: Vec<(Vec<String>, Vec<String>, usize)>,
}

fn scan(src: &str) -> Scan {
    let t = tokens(src);
    let tok = |k: usize| t.get(k).map(|x| &x.0);
    let ident = |k: usize| match tok(k) {
        Some(Tok::Ident(w)) => Some(w.clone()),
        _ => None,
    };
    let punct = |k: usize, c: char| tok(k) == Some(&Tok::Punct(c));
    let (mut s, mut i, mut depth) = (Scan::default(), 0, 0);
    let mut open: Vec<(String, usize)> = Vec::new(); // inline modules, the depth they opened at
    let mut path_attr = None;
    while i < t.len() {
        let here: Vec<String> = open.iter().map(|(n, _)| n.clone()).collect();
        let word = ident(i);
        match (&t[i].0, word.as_deref()) {
            (Tok::Punct('#'), _) => {
                let j = i + 1 + usize::from(punct(i + 1, '!'));
                if punct(j, '[')
                    && ident(j + 1).as_deref() == Some("path")
                    && punct(j + 2, '=')
                    && let Some(Tok::Str(p)) = tok(j + 3)
                {
                    path_attr = Some(p.clone());
                }
                i += 1;
            }
            (Tok::Punct('{'), _) => {
                depth += 1;
                i += 1;
            }
            (Tok::Punct('}'), _) => {
                depth -= 1;
                if open.last().is_some_and(|(_, d)| *d == depth) {
                    open.pop();
                }
                i += 1;
            }
            (_, Some("mod")) if ident(i + 1).is_some() && punct(i + 2, ';') => {
                s.mods.push((here, ident(i + 1).unwrap(), path_attr.take()));
                i += 3;
            }
            (_, Some("mod")) if ident(i + 1).is_some() && punct(i + 2, '{') => {
                let name = ident(i + 1).unwrap();
                s.inline.push([here, vec![name.clone()]].concat());
                open.push((name, depth));
                depth += 1;
                i += 3;
            }
            // not `impl Trait + use<'a>`
            (_, Some("use")) if !punct(i + 1, '<') => {
                let end = (i..t.len()).find(|&k| punct(k, ';')).unwrap_or(t.len());
                let mut leaves = Vec::new();
                use_tree(&t[i + 1..end], &mut 0, &[], &mut leaves);
                for leaf in leaves {
                    s.uses.push((here.clone(), leaf, t[i].1));
                }
                i = end + 1;
            }
            (_, Some(w @ ("crate" | "super" | "self")))
                if tok(i + 1) == Some(&Tok::Path)
                    && !(i > 0 && (punct(i - 1, '$') || tok(i - 1) == Some(&Tok::Path))) =>
            {
                let mut path = vec![w.to_string()];
                let mut j = i + 1;
                while let (Some(Tok::Path), Some(n)) = (tok(j), ident(j + 1)) {
                    path.push(n);
                    j += 2;
                }
                s.paths.push((here, path, t[i].1));
                i = j;
            }
            _ => i += 1,
        }
    }
    s
}

/// One crate's module tree, read from its root file through `mod` declarations.
struct Crate {
    /// Every module (inline ones too) and the file that holds it.
    module_file: BTreeMap<Vec<String>, PathBuf>,
    /// Every file: its module and what it says.
    files: BTreeMap<PathBuf, (Vec<String>, Scan)>,
    /// The names each module imports (`use`), and the paths they stand for.
    imports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
    /// The glob imports (`use x::*`) of each module.
    globs: BTreeMap<Vec<String>, Vec<Vec<String>>>,
}

impl Crate {
    fn load(root: &Path) -> Crate {
        let mut c = Crate {
            module_file: BTreeMap::new(),
            files: BTreeMap::new(),
            imports: BTreeMap::new(),
            globs: BTreeMap::new(),
        };
        // (file, its module, whether its children live beside it: a root, a
        // mod.rs or a #[path] file)
        let mut todo = vec![(root.to_path_buf(), Vec::<String>::new(), true)];
        while let Some((file, module, mod_rs)) = todo.pop() {
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            let s = scan(&text);
            let dir = file.parent().unwrap().to_path_buf();
            let own_dir = if mod_rs {
                dir.clone()
            } else {
                dir.join(file.file_stem().unwrap())
            };
            c.module_file.insert(module.clone(), file.clone());
            for m in &s.inline {
                c.module_file
                    .insert([module.clone(), m.clone()].concat(), file.clone());
            }
            for (inline, name, attr) in &s.mods {
                let child = [module.clone(), inline.clone(), vec![name.clone()]].concat();
                let d = inline.iter().fold(own_dir.clone(), |d, m| d.join(m));
                let (path, mod_rs) = match attr {
                    Some(p) => (dir.join(p), true),
                    None if d.join(format!("{name}.rs")).exists() => {
                        (d.join(format!("{name}.rs")), false)
                    }
                    None => (d.join(name).join("mod.rs"), true),
                };
                todo.push((path, child, mod_rs));
            }
            for (inline, (path, name), _) in &s.uses {
                let at = [module.clone(), inline.clone()].concat();
                match name {
                    Some(name) => {
                        let names = c.imports.entry(at).or_default();
                        names.insert(name.clone(), path.clone());
                    }
                    None => c.globs.entry(at).or_default().push(path.clone()),
                }
            }
            c.files.insert(file, (module, s));
        }
        c
    }

    /// The module that holds what `path` names, seen from module `from`: the
    /// longest prefix that is a module, then through that module's `use` of the
    /// next name (a re-export) to where the item lives. Anything outside the crate
    /// resolves to `from` itself.
    fn resolve(&self, from: &[String], path: &[String], hops: usize) -> Option<Vec<String>> {
        let (mut cur, rest) = match path.first().map(String::as_str) {
            Some("crate") => (vec![], &path[1..]),
            Some("super" | "self") => {
                let mut cur = from.to_vec();
                let supers = path.iter().take_while(|s| *s == "super").count();
                for _ in 0..supers {
                    cur.pop()?;
                }
                (cur, &path[supers.max(1)..])
            }
            _ => (from.to_vec(), path),
        };
        for (k, seg) in rest.iter().enumerate() {
            let next = [cur.clone(), vec![seg.clone()]].concat();
            if self.module_file.contains_key(&next) {
                cur = next;
                continue;
            }
            if hops >= 8 {
                return Some(cur);
            }
            if let Some(p) = self.imports.get(&cur).and_then(|m| m.get(seg)) {
                let p = [p.clone(), rest[k + 1..].to_vec()].concat();
                return self.resolve(&cur, &p, hops + 1);
            }
            // a module or import a glob import brought in
            for g in self.globs.get(&cur).into_iter().flatten() {
                let Some(m) = self.resolve(&cur, g, hops + 1) else {
                    continue;
                };
                let there = [m.clone(), vec![seg.clone()]].concat();
                let imported = self.imports.get(&m).is_some_and(|i| i.contains_key(seg));
                if m != cur && (self.module_file.contains_key(&there) || imported) {
                    return self.resolve(&m, &rest[k..], hops + 1);
                }
            }
            return Some(cur);
        }
        Some(cur)
    }

    /// file -> the files it depends on -> the first reference that says so. A file
    /// never depends on its own submodules (see [`no_file_cycles_within_a_crate`]).
    fn file_edges(&self, root: &Path) -> BTreeMap<PathBuf, BTreeMap<PathBuf, String>> {
        let mut edges: BTreeMap<PathBuf, BTreeMap<PathBuf, String>> = BTreeMap::new();
        for (file, (module, s)) in &self.files {
            let uses = s.uses.iter().map(|(m, (p, _), l)| (m, p, *l));
            for (inline, path, line) in uses.chain(s.paths.iter().map(|(m, p, l)| (m, p, *l))) {
                let from = [module.clone(), inline.clone()].concat();
                let Some(target) = self.resolve(&from, path, 0) else {
                    continue;
                };
                let to = &self.module_file[&target];
                let to_module = &self.files[to].0;
                let below = to_module.len() > module.len() && to_module.starts_with(module);
                if to == file || below {
                    continue;
                }
                let rel = |f: &Path| f.strip_prefix(root).unwrap_or(f).display().to_string();
                edges
                    .entry(file.clone())
                    .or_default()
                    .entry(to.clone())
                    .or_insert_with(|| {
                        format!("{}:{line} {} -> {}", rel(file), path.join("::"), rel(to))
                    });
            }
        }
        edges
    }
}

/// The strongly connected sets of more than one file in `edges`, each with the
/// references that tie it.
fn cycles(
    edges: &BTreeMap<PathBuf, BTreeMap<PathBuf, String>>,
) -> Vec<(BTreeSet<PathBuf>, Vec<String>)> {
    let reach = |from: &PathBuf| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(f) = todo.pop() {
            for to in edges.get(&f).into_iter().flat_map(|m| m.keys()) {
                if seen.insert(to.clone()) {
                    todo.push(to.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&PathBuf, BTreeSet<PathBuf>> =
        edges.keys().map(|f| (f, reach(f))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for (f, r) in &reaches {
        if done.contains(*f) || !r.contains(*f) {
            continue;
        }
        let set: BTreeSet<PathBuf> = r
            .iter()
            .filter(|g| reaches.get(g).is_some_and(|rg| rg.contains(*f)))
            .cloned()
            .collect();
        let why = set
            .iter()
            .flat_map(|a| edges[a].iter().filter(|(b, _)| set.contains(*b)))
            .map(|(_, r)| r.clone())
            .collect();
        done.extend(set.iter().cloned());
        out.push((set, why));
    }
    out
}

/// Cycles that stay for now, by their files (from the workspace root), with why.
const ALLOWED_CYCLES: &[(&[&str], &str)] = &[];

/// No two files of a crate need each other, directly or through others. A file
/// needs the file of each module it names: `use` paths and `crate::`, `super::`
/// and `self::` paths, followed through re-exports (a `use`, also a glob, in the
/// named module) to the file the item lives in. A file never needs its own
/// submodules: a parent declares and assembles its children (`mod x;`,
/// `pub use x::Y`) while a child uses its parent's items (`super::Error`), the
/// ordinary shape of a Rust module, so only references upward and across count.
/// Test code counts like any other. Per crate target (lib, each bin, test and
/// bench), read from its root file; a text scan, so a path only a macro builds is
/// not seen.
#[test]
fn no_file_cycles_within_a_crate() {
    let root = root().canonicalize().unwrap();
    let mut roots = BTreeSet::new();
    for p in metadata()["packages"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            if t["kind"]
                .as_array()
                .unwrap()
                .iter()
                .all(|k| k != "custom-build")
            {
                roots.insert(PathBuf::from(t["src_path"].as_str().unwrap()));
            }
        }
    }
    let (mut found, mut read) = (BTreeMap::new(), 0);
    for r in &roots {
        let krate = Crate::load(r);
        read += krate.files.len();
        for (set, why) in cycles(&krate.file_edges(&root)) {
            let files: Vec<String> = set
                .iter()
                .map(|f| f.strip_prefix(&root).unwrap_or(f).display().to_string())
                .collect();
            found.insert(files, why);
        }
    }
    assert!(read > 200, "read the crates' files: {read}");
    let mut problems = Vec::new();
    for (files, why) in &found {
        if !ALLOWED_CYCLES.iter().any(|(a, _)| a == files) {
            problems.push(format!(
                "{} need each other (move the shared piece down into its own module):\n  {}",
                files.join(", "),
                why.join("\n  ")
            ));
        }
    }
    for (files, _) in ALLOWED_CYCLES {
        if !found.keys().any(|f| f == files) {
            problems.push(format!(
                "{files:?} is no cycle any more: drop it from ALLOWED_CYCLES"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_cycle_scanner_resolves_what_it_should() {
    let s = scan(
        "use super::{a::{self, B as C}, d::*};\n#[path = \"t.rs\"]\nmod tests;\nmod inner {\n    fn f() { crate::x::Y::new(); let c = '\"'; }\n}\nfn g() -> &'static str { \"crate::no\" }\n",
    );
    let leaves: Vec<UseLeaf> = s.uses.iter().map(|(_, l, _)| l.clone()).collect();
    let v = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        leaves,
        vec![
            (v(&["super", "a"]), Some("a".into())),
            (v(&["super", "a", "B"]), Some("C".into())),
            (v(&["super", "d"]), None),
        ]
    );
    assert_eq!(s.mods, vec![(vec![], "tests".into(), Some("t.rs".into()))]);
    assert_eq!(s.inline, vec![v(&["inner"])]);
    assert_eq!(
        s.paths,
        vec![(v(&["inner"]), v(&["crate", "x", "Y", "new"]), 5)]
    );
}
