//! The orchestrator's shape, as docs/LAYOUT.md draws it: its top-level modules are stages of a
//! run, and a stage uses only the stages below it. This reads every `crate::` path in
//! orchestrator/src (a `use crate::...` line or a path written inline) and fails on an import
//! from a lower stage to a higher one, or on a cycle between top-level modules. It also holds
//! every file to 600 lines and every function to 100.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The stages, lowest first. A module may use its own stage's modules and the stages below.
const STAGES: &[&[&str]] = &[
    &["util"],
    &["unit"],
    &["legs"],
    &["gates"],
    &["numbers"],
    &["record"],
    &["render"],
    &["run", "report", "compare", "clock"],
];

const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 100;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to: `gates/kv.rs` -> "gates", `run.rs` -> "run"; None
/// for the crate roots (lib.rs declares, main.rs is the binary and uses the library's paths).
fn module_of(rel: &Path) -> Option<String> {
    let first = rel
        .components()
        .next()?
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    match first.as_str() {
        "lib.rs" | "main.rs" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

fn stage_of(module: &str) -> Option<usize> {
    STAGES.iter().position(|s| s.contains(&module))
}

/// The source with comments, string and character literals blanked to spaces (line breaks
/// kept), so that braces and paths are counted from code only.
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            while i < b.len() && !(b[i] == '*' && b.get(i + 1) == Some(&'/')) {
                out.push(blank(b[i]));
                i += 1;
            }
            out.push_str("  ");
            i += 2;
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&b, i) {
            // A raw string: r"...", r#"..."#, r##"..."##.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &x in &b[i..j.min(b.len())] {
                out.push(blank(x));
            }
            i = j;
        } else if c == '"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != '"' {
                j += if b[j] == '\\' { 2 } else { 1 };
            }
            for &x in &b[i..(j + 1).min(b.len())] {
                out.push(blank(x));
            }
            i = j + 1;
        } else if c == '\'' && char_literal_len(&b, i).is_some() {
            let n = char_literal_len(&b, i).unwrap();
            out.push_str(&" ".repeat(n));
            i += n;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

/// The length of a character literal starting at `i` ('x', '\n', '\''), None for a lifetime.
fn char_literal_len(b: &[char], i: usize) -> Option<usize> {
    match (b.get(i + 1), b.get(i + 2)) {
        (Some('\\'), _) => {
            let mut j = i + 2;
            while j < b.len() && b[j] != '\'' {
                j += 1;
            }
            Some(j + 1 - i)
        }
        (Some(_), Some('\'')) => Some(3),
        _ => None,
    }
}

/// The top-level modules a file's code names through `crate::`.
fn imports(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `$crate::` or another path ending in "crate"
        }
        if let Some(group) = rest.strip_prefix('{') {
            // use crate::{a::X, b};
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name = part.trim().split("::").next().unwrap_or("").trim();
                if !name.is_empty() {
                    out.insert(name.to_string());
                }
            }
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    out
}

struct Source {
    rel: PathBuf,
    text: String,
    code: String,
}

fn sources() -> Vec<Source> {
    let mut v = vec![];
    files(&src(), &mut v);
    v.sort();
    v.into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            Source {
                rel: p.strip_prefix(src()).unwrap().to_path_buf(),
                code: code_only(&text),
                text,
            }
        })
        .collect()
}

/// Who imports whom, between top-level modules, with one file that does it for each edge.
fn graph(sources: &[Source]) -> BTreeMap<(String, String), PathBuf> {
    let mut edges = BTreeMap::new();
    for s in sources {
        let Some(from) = module_of(&s.rel) else {
            continue;
        };
        for to in imports(&s.code) {
            if to != from {
                edges
                    .entry((from.clone(), to))
                    .or_insert_with(|| s.rel.clone());
            }
        }
    }
    edges
}

#[test]
fn every_top_level_module_has_a_stage() {
    let mut unknown: BTreeSet<String> = BTreeSet::new();
    for s in sources() {
        if let Some(m) = module_of(&s.rel) {
            if stage_of(&m).is_none() {
                unknown.insert(m);
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "top-level modules with no stage in tests/layering.rs (add each to STAGES and to docs/LAYOUT.md): {unknown:?}"
    );
}

#[test]
fn no_stage_imports_from_a_higher_stage() {
    let mut upward = vec![];
    for ((from, to), file) in graph(&sources()) {
        if let (Some(a), Some(b)) = (stage_of(&from), stage_of(&to)) {
            if b > a {
                upward.push(format!(
                    "{} ({from}, stage {a}) uses {to} (stage {b})",
                    file.display()
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports from a lower stage to a higher one:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let edges = graph(&sources());
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
    }
    // Depth-first search; a node met again on the current path closes a cycle.
    fn visit<'a>(
        n: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<&'a str>> {
        if let Some(i) = path.iter().position(|p| *p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n);
            return Some(cycle);
        }
        if !done.insert(n) {
            return None;
        }
        path.push(n);
        for m in next.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for n in next.keys() {
        if let Some(c) = visit(n, &next, &mut vec![], &mut done) {
            let edge_files: Vec<String> = c
                .windows(2)
                .map(|w| {
                    format!(
                        "{} -> {} ({})",
                        w[0],
                        w[1],
                        edges[&(w[0].to_string(), w[1].to_string())].display()
                    )
                })
                .collect();
            panic!("an import cycle: {}", edge_files.join(", "));
        }
    }
}

/// Each `fn` item's first line and the line of its closing brace (1-based), from code with
/// comments and literals blanked.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = vec![];
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let Some(pos) = t.find("fn ") else {
            continue;
        };
        let head = &t[..pos];
        let is_item = head
            .split_whitespace()
            .all(|w| matches!(w, "pub" | "pub(crate)" | "async" | "const" | "unsafe"));
        if !is_item {
            continue;
        }
        let name: String = t[pos + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The body opens at the first `{` after the signature (a `;` first: no body).
        let mut depth = 0i32;
        let mut opened = false;
        'scan: for (j, l) in lines.iter().enumerate().skip(i) {
            let from = if j == i { pos } else { 0 };
            let chars: Vec<char> = l.chars().collect();
            for &c in chars.iter().skip(from) {
                match c {
                    ';' if !opened && depth == 0 => break 'scan,
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => {
                        depth -= 1;
                        if opened && depth == 0 {
                            out.push((name.clone(), i + 1, j + 1));
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

#[test]
fn no_file_over_600_lines_and_no_function_over_100() {
    let mut over = vec![];
    for s in sources() {
        let n = s.text.lines().count();
        if n > MAX_FILE_LINES {
            over.push(format!("{}: {n} lines", s.rel.display()));
        }
        for (name, a, b) in functions(&s.code) {
            if b - a + 1 > MAX_FN_LINES {
                over.push(format!(
                    "{}:{a}: fn {name} is {} lines",
                    s.rel.display(),
                    b - a + 1
                ));
            }
        }
    }
    assert!(
        over.is_empty(),
        "over {MAX_FILE_LINES} lines a file or {MAX_FN_LINES} a function:\n{}",
        over.join("\n")
    );
}

#[test]
fn the_reader_sees_code_not_comments_or_strings() {
    let code = code_only(
        "use crate::a::X; // crate::b\nlet s = \"crate::c {\"; let r = r#\"crate::d }\"#;\nfn f<'a>(x: &'a str) -> char { '{' }\n",
    );
    assert_eq!(
        imports(&code),
        ["a"].iter().map(|s| s.to_string()).collect::<BTreeSet<_>>()
    );
    assert_eq!(functions(&code), vec![("f".to_string(), 3, 3)]);
    assert_eq!(
        imports("use crate::{x::Y, z};"),
        ["x", "z"]
            .iter()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>()
    );
}
