//! Keeps the docs usable as reference (docs/conventions.md, "Docs"):
//! - README.md stays a front door: at most 180 lines;
//! - no table cell in README.md or BENCHMARKS.md is over 300 characters;
//! - every relative link in README.md, BENCHMARKS.md and docs/*.md names a file
//!   that exists, and a heading of it when it names an anchor of a Markdown file;
//! - no Markdown, Rust, C, shell, TOML or YAML file says "issue" or "session"
//!   followed by a number, which means nothing to a reader of the repository
//!   (a CHANGELOG may).
//! - README.md's first `sh` block is `make demo` and `make test`, each with a
//!   `#` comment; both are targets of the Makefile, and `.ci/run` runs `make test`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const README_MAX_LINES: usize = 180;
const CELL_MAX_CHARS: usize = 300;
const MENTION_EXTS: &[&str] = &["md", "rs", "c", "h", "sh", "toml", "yaml"];

fn root() -> PathBuf {
    ringlb_testkit::cargo::workspace_root()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The lines of a Markdown text outside fenced code blocks, with their numbers
/// (1-based).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// `line` without its inline code spans (`...`).
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The cells of a Markdown table row: split on `|` outside code spans, `\|` kept.
fn cells(row: &str) -> Vec<String> {
    let row = row.trim();
    let row = row.strip_prefix('|').unwrap_or(row);
    let row = row.strip_suffix('|').unwrap_or(row);
    let (mut out, mut cell, mut in_code, mut escaped) = (Vec::new(), String::new(), false, false);
    for c in row.chars() {
        match c {
            '|' if !in_code && !escaped => out.push(std::mem::take(&mut cell)),
            _ => {
                if c == '`' {
                    in_code = !in_code;
                }
                cell.push(c);
            }
        }
        escaped = c == '\\';
    }
    out.push(cell);
    out.into_iter().map(|c| c.trim().to_string()).collect()
}

/// Table cells over `max` characters: (line, characters, the cell's start).
fn long_cells(text: &str, max: usize) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        if !line.trim_start().starts_with('|') {
            continue;
        }
        for cell in cells(line) {
            let len = cell.chars().count();
            if len > max {
                out.push((n, len, cell.chars().take(60).collect()));
            }
        }
    }
    out
}

/// The targets of the inline links `[text](target)` of a Markdown text, with
/// their line numbers; code spans and fenced blocks are left out.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = without_code(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            if !target.is_empty() {
                out.push((n, target.to_string()));
            }
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation (backticks too) dropped
/// (letters, digits, `-` and `_` kept), each space a `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings; a repeated heading gets `-1`, `-2`...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let t = line.trim_start();
        let hashes = t.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !t[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(t[hashes..].trim().trim_end_matches('#').trim());
        let mut anchor = base.clone();
        let mut k = 0;
        while out.contains(&anchor) {
            k += 1;
            anchor = format!("{base}-{k}");
        }
        out.insert(anchor);
    }
    out
}

/// Where a link of `doc` (relative to the root) to `target` breaks, if it does.
fn broken(doc: &str, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        root().join(doc)
    } else {
        root().join(doc).parent().unwrap().join(path)
    };
    if !file.exists() {
        return Some(format!("{} does not exist", file.display()));
    }
    match anchor {
        Some(a) if file.extension().is_some_and(|e| e == "md") => {
            let text = std::fs::read_to_string(&file).ok()?;
            (!anchors(&text).contains(a)).then(|| format!("no heading with anchor #{a}"))
        }
        _ => None,
    }
}

/// "issue N" or "session N" (any case) where "issue"/"session" starts a word.
fn mentions(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let lower = line.to_lowercase();
        for word in ["issue ", "session "] {
            for (at, _) in lower.match_indices(word) {
                let starts_word = lower[..at]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !c.is_alphanumeric() && c != '_');
                let digit = lower[at + word.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit());
                if starts_word && digit {
                    out.push((i + 1, line.trim().chars().take(100).collect()));
                }
            }
        }
    }
    out
}

/// The repository's files: tracked and untracked but not ignored (`git ls-files`),
/// or, without git, every file outside `target/` and hidden folders.
fn tree() -> Vec<PathBuf> {
    let out = Command::new("git")
        .args(["ls-files", "-co", "--exclude-standard", "-z"])
        .current_dir(root())
        .output();
    if let Some(out) = out.ok().filter(|o| o.status.success()) {
        return out
            .stdout
            .split(|&b| b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned()))
            .collect();
    }
    let mut files = Vec::new();
    walk(&root(), Path::new(""), &mut files);
    files
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
    let Ok(dir) = std::fs::read_dir(root.join(rel)) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = rel.join(&*name);
        if name.starts_with('.') || path == Path::new("target") {
            continue;
        }
        match entry.file_type() {
            Ok(t) if t.is_dir() => walk(root, &path, out),
            Ok(_) => out.push(path),
            Err(_) => {}
        }
    }
}

/// The commands of the first fenced `sh` block of a Markdown text, each with its
/// `#` comment (empty when it has none); blank lines left out.
fn first_sh_commands(text: &str) -> Vec<(String, String)> {
    let block = text
        .lines()
        .skip_while(|l| l.trim() != "```sh")
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with("```"));
    let mut out = Vec::new();
    for line in block {
        let (command, comment) = line.split_once('#').unwrap_or((line, ""));
        if !command.trim().is_empty() {
            out.push((command.trim().to_string(), comment.trim().to_string()));
        }
    }
    out
}

/// The targets a Makefile defines: `name:` at the start of a line (not `name :=`,
/// not a recipe line, not special targets such as `.PHONY`).
fn make_targets(makefile: &str) -> BTreeSet<String> {
    makefile
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let plain = !name.is_empty()
                && !name.starts_with('.')
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            (plain && !rest.starts_with('=')).then(|| name.to_string())
        })
        .collect()
}

fn docs() -> Vec<String> {
    let mut docs = vec!["README.md".to_string(), "BENCHMARKS.md".to_string()];
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    pages.sort();
    docs.extend(pages);
    docs
}

#[test]
fn readme_is_a_front_door() {
    let lines = read("README.md").lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, at most {README_MAX_LINES}: move details to a docs page"
    );
}

#[test]
fn no_table_cell_is_a_paragraph() {
    let mut problems = Vec::new();
    for doc in ["README.md", "BENCHMARKS.md"] {
        for (line, len, start) in long_cells(&read(doc), CELL_MAX_CHARS) {
            problems.push(format!(
                "{doc}:{line}: a cell of {len} characters: {start}..."
            ));
        }
    }
    assert_no_problems(
        &format!(
            "table cells over {CELL_MAX_CHARS} characters (put the detail on the linked page)"
        ),
        &problems,
    );
}

#[test]
fn every_relative_link_resolves() {
    let mut problems = Vec::new();
    for doc in docs() {
        for (line, target) in links(&read(&doc)) {
            if let Some(why) = broken(&doc, &target) {
                problems.push(format!("{doc}:{line}: ({target}): {why}"));
            }
        }
    }
    assert_no_problems("broken links", &problems);
}

#[test]
fn no_issue_or_session_numbers_in_the_tree() {
    let mut problems = Vec::new();
    for file in tree() {
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        let ext = file.extension().unwrap_or_default().to_string_lossy();
        if !MENTION_EXTS.contains(&ext.as_ref()) || name.to_uppercase().starts_with("CHANGELOG") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root().join(&file)) else {
            continue;
        };
        for (line, excerpt) in mentions(&text) {
            problems.push(format!("{}:{line}: {excerpt}", file.display()));
        }
    }
    assert_no_problems(
        "\"issue N\" or \"session N\" means nothing to a reader of the repository; say what \
         is meant",
        &problems,
    );
}

#[test]
fn readme_commands_are_make_targets_and_ci_runs_make_test() {
    let commands = first_sh_commands(&read("README.md"));
    let targets = make_targets(&read("Makefile"));
    let mut problems = Vec::new();
    for (command, comment) in &commands {
        match command.strip_prefix("make ") {
            Some(target) if targets.contains(target.trim()) => {}
            Some(target) => {
                problems.push(format!("`{command}`: no target `{target}:` in Makefile"))
            }
            None => problems.push(format!("`{command}` is not `make <target>`")),
        }
        if comment.is_empty() {
            problems.push(format!(
                "`{command}` has no `#` comment saying what it does"
            ));
        }
    }
    let names: Vec<&str> = commands.iter().map(|(c, _)| c.as_str()).collect();
    if names != ["make demo", "make test"] {
        problems.push(format!(
            "the first sh block holds {names:?}, not `make demo` then `make test`"
        ));
    }
    for target in ["demo", "test"] {
        if !targets.contains(target) {
            problems.push(format!("Makefile has no `{target}:` target"));
        }
    }
    let ci = read(".ci/run");
    let runs_make_test = ci
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .any(|words| words == ["make", "test"]);
    if !runs_make_test {
        problems.push("`.ci/run` has no line `make test`, the README's test command".into());
    }
    assert_no_problems("README.md's commands and the code disagree", &problems);
}

/// The checks' own pieces, on small inputs, so a check that passes is one that can fail.
#[test]
fn the_checks_find_what_they_look_for() {
    assert_eq!(
        slug("At HEAD: the flow filter in bits, -mcpu=v3"),
        "at-head-the-flow-filter-in-bits--mcpuv3"
    );
    assert_eq!(slug("History of §1"), "history-of-1");
    assert_eq!(slug("What `make demo` installs"), "what-make-demo-installs");
    let page = "# A\n## B c\n```\n## not a heading\n```\n## B c\n";
    let a = anchors(page);
    assert!(
        a.contains("a") && a.contains("b-c") && a.contains("b-c-1"),
        "{a:?}"
    );
    assert!(!a.contains("not-a-heading"), "{a:?}");

    let text = "see [x](docs/a.md#b) and `[y](no.md)` [z](https://e.x/y)\n```\n[w](in.md)\n```";
    let found: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(found, ["docs/a.md#b", "https://e.x/y"]);

    assert_eq!(cells("| a | `b|c` | d\\|e |"), ["a", "`b|c`", "d\\|e"]);
    let long = format!("| short | {} |\n", "x".repeat(CELL_MAX_CHARS + 1));
    assert_eq!(long_cells(&long, CELL_MAX_CHARS).len(), 1);

    let readme =
        "# x\n```text\nmake no\n```\n```sh\nmake a   # one\n\nmake b\n```\n```sh\nmake c\n```";
    assert_eq!(
        first_sh_commands(readme),
        [
            ("make a".to_string(), "one".to_string()),
            ("make b".to_string(), String::new())
        ]
    );
    let makefile = ".PHONY: a b\nX := 1\nY ?= $(or a:b)\na: b\n\tmake b:\nb:\nc:=2\n d:\n";
    let t = make_targets(makefile);
    assert_eq!(t.into_iter().collect::<Vec<_>>(), ["a", "b"]);

    // Built at run time, so this file does not trip its own check.
    let n = 12;
    for s in [
        format!("see Issue {n}"),
        format!("session {n} measured"),
        format!("(issue {n})"),
    ] {
        assert_eq!(mentions(&s).len(), 1, "{s}");
    }
    let quiet = [
        format!("tissue {n}"),
        "issue tracker".into(),
        format!("sessions {n}"),
    ];
    for s in quiet {
        assert!(mentions(&s).is_empty(), "{s}");
    }
}

/// Fails with `what` and every problem, one a line, unless there is none.
#[track_caller]
fn assert_no_problems(what: &str, problems: &[String]) {
    assert!(problems.is_empty(), "{what}:\n{}", problems.join("\n"));
}
