//! The layering test: ARCHITECTURE.md's import rules, checked on `src/`.
//!
//! As rust-analyzer's tidy tests do, it reads the sources: every
//! `crate::` path in code (comments and test code left out) is an import of
//! the top-level module it names. The rules:
//!
//! - an import names the defining module (`crate::kind::LeaseKind`), never
//!   a crate-root re-export (`crate::LeaseKind`), so that the layer
//!   imported shows;
//! - no import cycle between top-level modules;
//! - the data modules ([`DATA_MODULES`]) import only data modules;
//! - the store imports only data modules; the actor only data modules and the
//!   store, never `store::mongo`; the twin (`store::memory`) and the
//!   simulation never `store::mongo`; the test kit nothing of the library.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The data modules, at the bottom (ARCHITECTURE.md "`src/` top-level modules").
const DATA_MODULES: &[&str] = &[
    "backoff",
    "caller",
    "config",
    "document_update",
    "error",
    "foreign",
    "health",
    "info",
    "key",
    "kind",
    "lock_id_fields",
    "random",
    "status",
    "telemetry",
    "token",
];

/// One `crate::` import: the file, its line, and the path's segments.
#[derive(Debug)]
struct Import {
    file: String,
    line: usize,
    path: Vec<String>,
}

/// The source of one file without its test code: a file named `tests.rs`
/// or under a `tests/` folder is all test code; elsewhere the code from
/// `#[cfg(test)]` followed by `mod tests` on is.
fn without_tests(text: &str) -> &str {
    match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    }
}

/// Every `crate::` path in `text` (code only: what follows `//` on a line
/// is a comment), with each item of a `crate::{..}` group as a path of its
/// own.
fn imports(file: &str, text: &str) -> Vec<Import> {
    let mut code = String::new();
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.find("//").map_or(line, |i| &line[..i]);
        for _ in line.chars() {
            lines.push(n + 1);
        }
        lines.push(n + 1);
        code.push_str(line);
        code.push('\n');
    }
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i + 7 <= chars.len() {
        let preceded = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if preceded || chars[i..i + 7].iter().collect::<String>() != "crate::" {
            i += 1;
            continue;
        }
        let line = lines[i];
        i += 7;
        let (paths, end) = parse_tree(&chars, i);
        for path in paths {
            found.push(Import {
                file: file.to_owned(),
                line,
                path,
            });
        }
        i = end;
    }
    found
}

/// Parses a use tree at `i`: `a::b::c`, `a::{b, c::d}` or `{a, b}`;
/// returns its paths and where it ends.
fn parse_tree(chars: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        if i < chars.len() && chars[i] == '{' {
            let mut paths = Vec::new();
            i += 1;
            loop {
                while i < chars.len() && (chars[i].is_whitespace() || chars[i] == ',') {
                    i += 1;
                }
                if i >= chars.len() || chars[i] == '}' {
                    return (paths, i + 1);
                }
                let (inner, end) = parse_tree(chars, i);
                i = end;
                for path in inner {
                    let mut full = prefix.clone();
                    full.extend(path);
                    paths.push(full);
                }
                // Skip an `as name` or anything else up to the next item.
                while i < chars.len() && chars[i] != ',' && chars[i] != '}' {
                    i += 1;
                }
            }
        }
        let start = i;
        while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
            i += 1;
        }
        if i == start {
            return (vec![prefix], i);
        }
        prefix.push(chars[start..i].iter().collect());
        if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
            i += 2;
        } else {
            return (vec![prefix], i);
        }
    }
}

/// The module path of a file under `src/`: `store/mongo/acquire.rs` is
/// `["store", "mongo", "acquire"]`.
fn module_of(relative: &Path) -> Vec<String> {
    relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|c| c != "mod")
        .collect()
}

/// The rules' violations among `files` (path under `src/`, source), for a
/// crate whose top-level modules are `modules`.
fn violations(files: &[(PathBuf, String)], modules: &BTreeSet<String>) -> Vec<String> {
    let data: BTreeSet<&str> = DATA_MODULES.iter().copied().collect();
    let mut found = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (relative, text) in files {
        let module = module_of(relative);
        let Some(top) = module.first().cloned() else {
            continue;
        };
        // The crate root declares the modules; this file is test code.
        if top == "lib" || top == "layers" {
            continue;
        }
        let file = relative.display().to_string();
        for import in imports(&file, without_tests(text)) {
            let at = format!(
                "{}:{}: crate::{}",
                import.file,
                import.line,
                import.path.join("::")
            );
            let Some(first) = import.path.first() else {
                continue;
            };
            if !modules.contains(first) {
                found.push(format!(
                    "{at}: a crate-root re-export; name the defining module"
                ));
                continue;
            }
            if *first == top {
                continue;
            }
            edges.entry(top.clone()).or_default().insert(first.clone());
            let second = import.path.get(1).map(String::as_str);
            let to_mongo = first == "store" && second == Some("mongo");
            let rule = match top.as_str() {
                t if data.contains(t) && !data.contains(first.as_str()) => {
                    Some("a data module imports only data modules")
                }
                "store" if !data.contains(first.as_str()) => {
                    Some("the store imports only data modules")
                }
                "actor" if !data.contains(first.as_str()) && first != "store" => {
                    Some("the actor imports only data modules and the store")
                }
                "actor" | "sim" if to_mongo => Some("never `store::mongo` outside the store"),
                "testkit" => Some("the test kit imports nothing of the library"),
                _ => None,
            };
            if let Some(rule) = rule {
                found.push(format!("{at}: {rule}"));
            }
        }
        if module.get(..2) == Some(&["store".to_owned(), "memory".to_owned()][..]) {
            for import in imports(&file, without_tests(text)) {
                if import.path.get(..2) == Some(&["store".to_owned(), "mongo".to_owned()][..]) {
                    found.push(format!(
                        "{}:{}: the twin never imports `store::mongo`",
                        import.file, import.line
                    ));
                }
            }
        }
    }
    for cycle in cycles(&edges) {
        found.push(format!("an import cycle among {}", cycle.join(", ")));
    }
    found
}

/// The strongly connected components of more than one module, each sorted
/// (Tarjan's algorithm).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: BTreeSet<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w.as_str()]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w.as_str()) {
                    let low = self.low[v].min(self.index[w.as_str()]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.insert(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: BTreeSet::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// Every `.rs` file under `dir` that is not test code, as (path under
/// `root`, source).
fn sources(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if path.is_dir() {
            if name.as_deref() != Some("tests") {
                sources(root, &path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") && name.as_deref() != Some("tests.rs")
        {
            let text = std::fs::read_to_string(&path).expect("a source file");
            let relative = path.strip_prefix(root).expect("under src/").to_path_buf();
            out.push((relative, text));
        }
    }
}

/// The top-level modules `lib.rs` declares.
fn top_level_modules(lib: &str) -> BTreeSet<String> {
    lib.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("mod "))?;
            Some(rest.strip_suffix(';')?.to_owned())
        })
        .collect()
}

#[test]
fn src_keeps_the_import_rules_of_architecture_md() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    let lib = std::fs::read_to_string(root.join("lib.rs")).expect("src/lib.rs");
    let modules = top_level_modules(&lib);
    assert!(
        modules.contains("actor") && modules.contains("store"),
        "{modules:?}"
    );
    let found = violations(&files, &modules);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_checker_finds_each_kind_of_violation() {
    let modules: BTreeSet<String> = [
        "actor", "key", "kind", "manager", "store", "testkit", "error",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let file = |path: &str, text: &str| (PathBuf::from(path), text.to_owned());
    let files = vec![
        file("store/read.rs", "use crate::manager::LeaseManager;\n"),
        file(
            "actor/acquire.rs",
            "use crate::{store::mongo::MongoStore, LeaseKind};\n",
        ),
        file(
            "key.rs",
            "// crate::manager in a comment\nuse crate::error::Error;\n",
        ),
        file("error.rs", "use crate::{key::LeaseKey, kind::LeaseKind};\n"),
        file(
            "kind.rs",
            "use crate::error::Error;\nfn f() -> crate::store::X { todo!() }\n",
        ),
        file("store/mod.rs", "use crate::kind::LeaseKind;\n"),
        file("testkit/mod.rs", "use crate::key::LeaseKey;\n"),
        file(
            "manager.rs",
            "use crate::actor::Actor;\n#[cfg(test)]\nmod tests { use crate::LeaseKind; }\n",
        ),
    ];
    let found = violations(&files, &modules).join("\n");
    for expected in [
        "store/read.rs:1: crate::manager::LeaseManager: the store imports only data modules",
        "actor/acquire.rs:1: crate::store::mongo::MongoStore: never `store::mongo` outside the store",
        "actor/acquire.rs:1: crate::LeaseKind: a crate-root re-export",
        "kind.rs:2: crate::store::X: a data module imports only data modules",
        "testkit/mod.rs:1: crate::key::LeaseKey: the test kit imports nothing of the library",
        "an import cycle among actor, error, key, kind, manager, store",
    ] {
        assert!(
            found.contains(expected),
            "missing {expected:?} in:\n{found}"
        );
    }
    assert!(
        !found.contains("manager.rs"),
        "test code is left out:\n{found}"
    );
    assert!(
        !found.contains("key.rs:1"),
        "comments are left out:\n{found}"
    );
}
