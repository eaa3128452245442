//! The house's shape, checked on every test run:
//!
//! - the crate graph (each workspace crate's `tessera-*` dependencies) is the layer table in `ARCHITECTURE.md`;
//! - inside every crate, no file imports a file that imports it back, directly or through others (`use`, paths in
//!   code and intra-doc links; a module may use its own sub-modules, which are its parts, not its neighbours);
//! - the layer rules the crate graph cannot express hold (below);
//! - every path `ARCHITECTURE.md` names exists, and its lines stay under 120 characters;
//! - a library that tells `cargo test` to skip its unit tests or doc examples (`test = false`, `doctest = false`)
//!   has none;
//! - every library and binary target is marked `bench = false` and has no `#[bench]` function.
//!
//! It reads source as text (no compiler), so it sees what a reader sees. A failure says which file imports what,
//! and where the code belongs instead.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Layer rules inside a crate: the files matching `files` may import only files matching `may_import` (paths
/// relative to the crate's `src/`; a trailing `/` matches a folder).
struct Rule {
    krate: &'static str,
    files: &'static [&'static str],
    may_import: &'static [&'static str],
    why: &'static str,
}

/// What `App` holds and what those parts are built from: below the application state and every service.
const BELOW_APP: &[&str] = &[
    "state/",
    "email.rs",
    "auth/",
    "connections.rs",
    "streams.rs",
    "telemetry.rs",
    "hub.rs",
    "queue.rs",
    "throttle.rs",
    "outbound.rs",
    "error.rs",
    "redact.rs",
    "sealed.rs",
];

const RULES: &[Rule] = &[
    Rule {
        krate: "services",
        files: BELOW_APP,
        may_import: BELOW_APP,
        why: "the application state (`app.rs`) holds this, so it may not read `AppState` or a service: move the \
              code that needs them into a service, and keep here only the state itself (new shared state goes in \
              `services/src/state/`)",
    },
    Rule {
        krate: "services",
        files: &["app.rs"],
        may_import: BELOW_APP,
        why: "`app.rs` holds what handlers share; a type it holds belongs below it, in `services/src/state/` (or \
              a module listed in the house test's BELOW_APP), never in a service that reads `AppState`",
    },
    Rule {
        krate: "frontend",
        files: &["api.rs", "wire.rs", "widgets.rs"],
        may_import: &["api.rs", "wire.rs", "widgets.rs"],
        why: "pages build on the API client, the wire helpers and the widgets, not the other way round: move what \
              both need out of the page into `widgets.rs` or `wire.rs`",
    },
    Rule {
        krate: "frontend",
        files: &["pages/shared.rs"],
        may_import: &["api.rs", "wire.rs", "widgets.rs", "pages/shared.rs"],
        why: "pages share helpers through `pages/shared.rs`, which imports no page: move the helper itself here, \
              or leave it in its page",
    },
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The workspace members' folders, from the root `Cargo.toml`.
fn members() -> Vec<String> {
    let manifest = read(&root().join("Cargo.toml"));
    let line = manifest.lines().find(|l| l.trim_start().starts_with("members")).expect("workspace members");
    line.split('"').skip(1).step_by(2).map(str::to_string).collect()
}

/// A crate's name and its `tessera-*` dependencies (not dev-dependencies).
fn crate_deps(folder: &str) -> (String, BTreeSet<String>) {
    let manifest = read(&root().join(folder).join("Cargo.toml"));
    let mut name = String::new();
    let mut section = String::new();
    let mut deps = BTreeSet::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        if section == "[package]" && line.starts_with("name") {
            name = line.split('"').nth(1).unwrap_or_default().to_string();
        }
        if section == "[dependencies]" {
            let key = line.split(['=', '.', ' ']).next().unwrap_or_default();
            if key.starts_with("tessera-") {
                deps.insert(key.to_string());
            }
        }
    }
    (name, deps)
}

/// The layer table of `ARCHITECTURE.md`: crate -> (folder, workspace crates it depends on).
fn layer_table(doc: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut table = BTreeMap::new();
    let mut inside = false;
    for line in doc.lines() {
        if line.starts_with("| layer | crate | folder | depends on") {
            inside = true;
            continue;
        }
        if !inside {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 4 || cells[1].starts_with("---") {
            continue;
        }
        let ticked = |s: &str| -> Vec<String> { s.split('`').skip(1).step_by(2).map(str::to_string).collect() };
        let krate = ticked(cells[1]).into_iter().next().expect("a crate in backticks");
        let folder = ticked(cells[2]).into_iter().next().expect("a folder in backticks");
        // Dependencies may be written without the `tessera-` prefix.
        let deps = ticked(cells[3])
            .into_iter()
            .map(|d| if d.starts_with("tessera-") { d } else { format!("tessera-{d}") })
            .collect();
        table.insert(krate, (folder.trim_end_matches('/').to_string(), deps));
    }
    table
}

#[test]
fn crate_graph_is_the_layer_table() {
    let doc = read(&root().join("ARCHITECTURE.md"));
    let table = layer_table(&doc);
    assert!(!table.is_empty(), "ARCHITECTURE.md has no table headed `| layer | crate | folder | depends on ...`");
    let mut actual = BTreeMap::new();
    for folder in members() {
        let (name, deps) = crate_deps(&folder);
        actual.insert(name, (folder, deps));
    }
    let mut wrong = Vec::new();
    for (name, (folder, deps)) in &actual {
        match table.get(name) {
            None => wrong.push(format!("{name} ({folder}/) is a workspace crate the layer table leaves out")),
            Some((f, d)) if f != folder || d != deps => wrong.push(format!(
                "{name}: the table says folder {f}/ depending on {d:?}; {folder}/Cargo.toml says {deps:?}"
            )),
            Some(_) => {}
        }
    }
    for name in table.keys().filter(|n| !actual.contains_key(*n)) {
        wrong.push(format!("{name} is in the layer table but not a workspace member"));
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md's layer table and the crate graph disagree (change whichever is wrong; a dependency \
         against the layers is wrong):\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn architecture_names_only_paths_that_exist() {
    let root = root();
    let doc = read(&root.join("ARCHITECTURE.md"));
    let mut missing = Vec::new();
    for (n, line) in doc.lines().enumerate() {
        let width = line.chars().count();
        if width >= 120 {
            missing.push(format!("line {}: {width} characters (at most 119)", n + 1));
        }
        for token in line.split('`').skip(1).step_by(2) {
            if looks_like_path(token) && !root.join(token.trim_end_matches('/')).exists() {
                missing.push(format!("line {}: `{token}` does not exist", n + 1));
            }
        }
    }
    assert!(missing.is_empty(), "ARCHITECTURE.md is out of date:\n  {}", missing.join("\n  "));
}

fn looks_like_path(token: &str) -> bool {
    const EXTENSIONS: &[&str] = &[".rs", ".md", ".toml", ".json", ".sql", ".mjs", ".py", ".yml", ".yaml", ".sh"];
    let plain = !token.is_empty() && token.chars().all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c));
    // Build outputs (`target/...`) exist only after a build: not a claim about the source tree.
    let built = token.starts_with("target/");
    plain && !built && !token.starts_with('/') && (token.contains('/') || EXTENSIONS.iter().any(|e| token.ends_with(e)))
}

/// One crate's source files, by path relative to `src/`, with their module paths.
struct Modules {
    src: PathBuf,
    by_path: BTreeMap<Vec<String>, String>,
    files: BTreeMap<String, Vec<String>>,
}

fn modules(src: &Path) -> Modules {
    let mut files = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("a source folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(src).expect("under src").to_string_lossy().replace('\\', "/");
                if rel == "main.rs" || rel.starts_with("bin/") {
                    continue;
                }
                let mut segs: Vec<String> = rel.trim_end_matches(".rs").split('/').map(str::to_string).collect();
                if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
                    segs.pop();
                }
                files.insert(rel, segs);
            }
        }
    }
    let by_path = files.iter().map(|(f, m)| (m.clone(), f.clone())).collect();
    Modules { src: src.to_path_buf(), by_path, files }
}

/// The text of a file as code: comments and string literals blanked, intra-doc link targets kept as code.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("///") || trimmed.starts_with("//!") {
            for link in trimmed.split("[`").skip(1) {
                if let Some(target) = link.split("`]").next() {
                    out.push_str(target);
                    out.push_str(";\n");
                }
            }
            out.push('\n');
            continue;
        }
        let mut in_str = false;
        let mut prev = ' ';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if in_str {
                if c == '"' && prev != '\\' {
                    in_str = false;
                }
                prev = if prev == '\\' && c == '\\' { ' ' } else { c };
                continue;
            }
            if c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' {
                in_str = true;
                prev = ' ';
                continue;
            }
            out.push(c);
        }
        out.push('\n');
    }
    out
}

/// `code` without its `#[cfg(test)] mod ... { ... }` blocks: tests may reach anything in their crate.
fn without_tests(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        let after = &rest[at + "#[cfg(test)]".len()..];
        let body = after.trim_start();
        let is_mod = body.starts_with("mod ") || body.starts_with("pub mod ") || body.starts_with("pub(crate) mod ");
        let Some(open) = body.find('{').filter(|o| is_mod && !body[..*o].contains(';')) else {
            out.push_str(&rest[..at + "#[cfg(test)]".len()]);
            rest = after;
            continue;
        };
        out.push_str(&rest[..at]);
        let mut depth = 0usize;
        let mut end = body.len();
        for (i, c) in body.char_indices().skip(open) {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &body[end..];
    }
    out.push_str(rest);
    out
}

/// `code` with `super::` inside inline modules (`mod x { ... }`) read as the file's own module when it names the
/// file itself, so that only paths leaving the file count.
fn inline_supers(code: &str) -> String {
    let chars: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    // For each open brace: whether it opened an inline module.
    let mut braces: Vec<bool> = Vec::new();
    let mut pending_mod = false;
    let mut i = 0;
    while i < chars.len() {
        let rest: String = chars[i..chars.len().min(i + 8)].iter().collect();
        let at_word = i == 0 || !is_ident(chars[i - 1]);
        if at_word && rest.starts_with("mod ") {
            pending_mod = true;
        }
        match chars[i] {
            ';' => pending_mod = false,
            '{' => {
                braces.push(pending_mod);
                pending_mod = false;
            }
            '}' => {
                braces.pop();
            }
            _ => {}
        }
        if at_word && rest.starts_with("super::") {
            let depth = braces.iter().filter(|m| **m).count();
            let mut n = 0;
            let mut j = i;
            while chars[j..].iter().take(7).collect::<String>() == "super::" {
                n += 1;
                j += 7;
            }
            if depth > 0 {
                if n <= depth {
                    out.push_str("self::");
                } else {
                    out.push_str(&"super::".repeat(n - depth));
                }
                i = j;
                continue;
            }
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// Every path a file names: `use` trees expanded, and `a::b::c` paths in code.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let starts =
            (c.is_ascii_alphabetic() || c == '_') && (i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != ':');
        if !starts {
            i += 1;
            continue;
        }
        let (path, next) = path_at(&bytes, i);
        paths.extend(path);
        i = next.max(i + 1);
    }
    paths
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths starting at `i` (several when a `{...}` group follows), and where they end.
fn path_at(chars: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut segs = Vec::new();
    loop {
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        if start == i {
            break;
        }
        segs.push(chars[start..i].iter().collect::<String>());
        let mut j = i;
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        if j + 1 < chars.len() && chars[j] == ':' && chars[j + 1] == ':' {
            j += 2;
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            if j < chars.len() && chars[j] == '{' {
                let (inner, end) = group_at(chars, j + 1);
                let all = inner
                    .into_iter()
                    .map(|tail| segs.iter().cloned().chain(tail).collect::<Vec<String>>())
                    .collect::<Vec<_>>();
                return (if all.is_empty() { vec![segs] } else { all }, end);
            }
            i = j;
            continue;
        }
        break;
    }
    (if segs.len() > 1 { vec![segs] } else { Vec::new() }, i)
}

/// The paths of a `{a::b, c, d::{e, f}}` group whose `{` is just before `i`, and where it ends.
fn group_at(chars: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut out = Vec::new();
    while i < chars.len() {
        let c = chars[i];
        if c == '}' {
            return (out, i + 1);
        }
        if is_ident(c) {
            let (paths, next) = path_at(chars, i);
            if paths.is_empty() {
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                out.push(vec![chars[start..i].iter().collect()]);
            } else {
                out.extend(paths);
                i = next;
            }
            continue;
        }
        i += 1;
    }
    (out, i)
}

/// The file-to-file imports inside one crate.
fn import_graph(m: &Modules) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (file, module) in &m.files {
        let text = read(&m.src.join(file));
        let code = inline_supers(&without_tests(&code_of(&text)));
        // Sub-modules a file declares (`mod x;`): names it may use without `self::`.
        let children: BTreeSet<String> = code
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let l = l.strip_prefix("pub ").or_else(|| l.strip_prefix("pub(crate) ")).unwrap_or(l);
                l.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')).map(str::to_string)
            })
            .collect();
        let here = module.clone();
        // `super` of `a/b.rs` and of `a/b/mod.rs` (both module `a::b`) is `a`.
        let parent: Vec<String> = here.iter().take(here.len().saturating_sub(1)).cloned().collect();
        for path in paths_in(&code) {
            let (mut base, rest): (Vec<String>, &[String]) = match path[0].as_str() {
                "crate" => (Vec::new(), &path[1..]),
                "self" => (here.clone(), &path[1..]),
                "super" => {
                    let mut base = parent.clone();
                    let mut k = 1;
                    while path.get(k).is_some_and(|s| s == "super") {
                        base.pop();
                        k += 1;
                    }
                    (base, &path[k..])
                }
                first if children.contains(first) => (here.clone(), &path[..]),
                _ => continue,
            };
            base.extend(rest.iter().cloned());
            // The longest prefix that is a module of this crate.
            let target = (0..=base.len()).rev().find_map(|n| m.by_path.get(&base[..n]).map(|f| (f, n)));
            let Some((target, n)) = target else { continue };
            let target_module = &m.files[target];
            // A module may use itself and its own parts.
            if target == file || target_module.starts_with(&here) && target_module.len() > here.len() {
                continue;
            }
            let name = base.get(n).cloned().unwrap_or_else(|| "(the module)".to_string());
            graph.entry(file.clone()).or_default().entry(target.clone()).or_default().insert(name);
        }
        graph.entry(file.clone()).or_default();
    }
    graph
}

/// Strongly connected components with more than one file (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        let graph = s.graph;
        for w in graph.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn matches(file: &str, patterns: &[&str]) -> bool {
    patterns.iter().any(|p| if p.ends_with('/') { file.starts_with(p) } else { file == *p })
}

#[test]
fn no_import_circle_and_no_layer_break_inside_a_crate() {
    let root = root();
    let mut problems = Vec::new();
    for folder in members() {
        let src = root.join(&folder).join("src");
        if !src.is_dir() {
            continue;
        }
        let graph = import_graph(&modules(&src));
        for circle in circles(&graph) {
            let mut ties = Vec::new();
            for a in &circle {
                for b in &circle {
                    if let Some(names) = graph[a].get(b) {
                        let names: Vec<&str> = names.iter().map(String::as_str).collect();
                        ties.push(format!("{folder}/src/{a} -> {folder}/src/{b}: {}", names.join(", ")));
                    }
                }
            }
            problems.push(format!(
                "an import circle in {folder}/src: {}\n    {}\n    Give what these files share a module of its own \
                 that imports none of them (as `services/src/placement.rs` does for approvals, reservations and \
                 wait reasons).",
                circle.join(", "),
                ties.join("\n    ")
            ));
        }
        for rule in RULES.iter().filter(|r| r.krate == folder) {
            for (file, targets) in &graph {
                if !matches(file, rule.files) {
                    continue;
                }
                for (target, names) in targets {
                    if !matches(target, rule.may_import) {
                        let names: Vec<&str> = names.iter().map(String::as_str).collect();
                        problems.push(format!(
                            "{folder}/src/{file} imports {folder}/src/{target} ({}): {}",
                            names.join(", "),
                            rule.why
                        ));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "the layers inside the crates are broken:\n  {}", problems.join("\n  "));
}

/// The checker itself: a circle and a rule break in a made-up crate are found, and a module using its own parts
/// is not a circle.
#[test]
fn the_checker_finds_circles_and_parts_are_not_circles() {
    let dir = std::env::temp_dir().join(format!("house-check-{}", std::process::id()));
    let src = dir.join("src");
    fs::create_dir_all(src.join("state")).expect("a scratch crate");
    let write = |p: &str, s: &str| fs::write(src.join(p), s).expect("a scratch file");
    write(
        "lib.rs",
        "pub mod a;\npub mod b;\npub mod c;\npub mod state;\npub use a::A;\nmod inner {\n    use super::a::A;\n}\n",
    );
    write("a.rs", "use crate::b::B;\n/// See [`super::c::C`].\npub struct A;\n");
    write("b.rs", "use crate::{c::C, state::S};\npub struct B; // crate::a::A in a comment is no import\n");
    write(
        "c.rs",
        "pub struct C;\nfn f() { let _ = super::a::A; let _ = \"crate::b::B\"; }\n\
         #[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::b::B;\n}\n",
    );
    write("state/mod.rs", "pub mod cache;\npub use cache::S;\n");
    write("state/cache.rs", "pub struct S;\n#[cfg(feature = \"x\")]\nmod x {\n    use super::S;\n}\n");
    let graph = import_graph(&modules(&src));
    let three = ["a.rs", "b.rs", "c.rs"].map(String::from).to_vec();
    assert_eq!(circles(&graph), vec![three], "{graph:?}");
    assert!(graph["b.rs"].contains_key("c.rs") && graph["b.rs"].contains_key("state/mod.rs"), "{graph:?}");
    assert!(!graph["b.rs"].contains_key("a.rs"), "a comment is no import: {graph:?}");
    assert!(!graph["c.rs"].contains_key("b.rs"), "a string is no import: {graph:?}");
    assert!(graph["state/mod.rs"].is_empty() && graph["lib.rs"].is_empty(), "parts are not neighbours: {graph:?}");
    assert!(graph["state/cache.rs"].is_empty(), "`super` in an inline module is the file: {graph:?}");
    fs::remove_dir_all(&dir).ok();
}

/// The `.rs` files under `dir`, at any depth.
fn rust_sources(dir: &Path) -> Vec<PathBuf> {
    let (mut stack, mut found) = (vec![dir.to_path_buf()], Vec::new());
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for path in entries.flatten().map(|e| e.path()) {
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found
}

/// Every `[lib]` and `[[bin]]` says `bench = false`, and no source holds a `#[bench]` function: a target left at
/// cargo's default is compiled once more, as a test copy, by `cargo build --benches` (CI's one build), for no
/// benchmark (the web layer's copy alone took 92 s of a 2-core machine's build).
#[test]
fn libraries_and_binaries_are_not_compiled_again_as_benchmarks() {
    let root = root();
    let mut twice = Vec::new();
    for folder in members() {
        let manifest = read(&root.join(&folder).join("Cargo.toml"));
        let mut section = String::new();
        let mut marked = true;
        for line in manifest.lines().map(str::trim).chain(std::iter::once("[end]")) {
            if line.starts_with('[') {
                if !marked {
                    twice.push(format!("{folder}/Cargo.toml: {section} has no `bench = false`"));
                }
                section = line.to_string();
                marked = !(section == "[lib]" || section == "[[bin]]");
            } else if line.replace(' ', "") == "bench=false" {
                marked = true;
            }
        }
        for path in rust_sources(&root.join(&folder).join("src")) {
            if read(&path).contains("#[bench]") {
                twice.push(format!("{}: a #[bench] function in a target marked bench = false", path.display()));
            }
        }
    }
    assert!(twice.is_empty(), "targets compiled again by `cargo build --benches`:\n  {}", twice.join("\n  "));
}

/// What `cargo test` skips is empty: a library marked `test = false` has no `#[cfg(test)]` code in `src/`, and one
/// marked `doctest = false` no Rust example in its doc comments (a fence that is not `text`, `toml`, `sh`, ...),
/// so that neither mark hides a test that would not run.
#[test]
fn libraries_skip_only_tests_they_do_not_have() {
    let root = root();
    let mut hidden = Vec::new();
    for folder in members() {
        let manifest = read(&root.join(&folder).join("Cargo.toml"));
        let mut section = String::new();
        let (mut no_tests, mut no_doctests) = (false, false);
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line.to_string();
            } else if section == "[lib]" {
                no_tests |= line.replace(' ', "") == "test=false";
                no_doctests |= line.replace(' ', "") == "doctest=false";
            }
        }
        for path in rust_sources(&root.join(&folder).join("src")) {
            let text = read(&path);
            let file = path.strip_prefix(&root).unwrap_or(&path).display().to_string();
            if no_tests && text.contains("#[cfg(test)]") {
                hidden.push(format!("{file}: #[cfg(test)] in a library marked test = false"));
            }
            if no_doctests {
                let mut open = false;
                for (n, line) in text.lines().enumerate() {
                    let doc = line.trim_start();
                    let Some(fence) = doc.strip_prefix("///").or_else(|| doc.strip_prefix("//!")) else {
                        continue;
                    };
                    let Some(lang) = fence.trim_start().strip_prefix("```") else { continue };
                    if !open && (lang.is_empty() || lang.split(',').any(|l| l.trim() == "rust")) {
                        hidden.push(format!("{file}:{}: a Rust example in a library marked doctest = false", n + 1));
                    }
                    open = !open;
                }
            }
        }
    }
    assert!(hidden.is_empty(), "tests that cargo test would skip:\n  {}", hidden.join("\n  "));
}
