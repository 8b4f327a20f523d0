//! The files of moe-oracle form layers: no file refers to another that refers back to it.
//!
//! A file refers to another when its code or its doc comments (whose links rustdoc resolves)
//! name the other module, or when its code calls a method that the other file adds to a type
//! defined elsewhere. Names count in these forms:
//! - `crate::module::...` and `super::module::...` paths, in `use` lists over several lines
//!   too (`use crate::{a, b::C}`);
//! - `crate::Name` where the crate root re-exports `Name` from a module (`pub use module::Name`
//!   in `lib.rs`);
//! - `.method(` and `Type::method(` where `method` is defined in an inherent `impl Type` block
//!   of a file that does not define `Type` (the support hooks on `KernelId`, for instance,
//!   which a caller reaches without naming the file that holds them).
//!
//! Test modules (`#[cfg(test)]` items) and plain `//` comments are left out; `lib.rs` is the
//! root and may name every module.
//!
//! The crate docs list the modules bottom-up, each using only modules before it; a second test
//! checks that list against the graph, so the documented layering stays true.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

fn oracle_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace root")
        .join("crates/moe-oracle/src")
}

/// One source file split into its code and its doc comments, test modules and plain comments
/// removed.
struct Parts {
    code: String,
    docs: String,
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The leading identifier of `s`.
fn ident(s: &str) -> &str {
    let end = s.find(|c: char| !is_ident(c)).unwrap_or(s.len());
    &s[..end]
}

/// The change in brace depth over a line of code.
fn brace_delta(code: &str) -> i64 {
    code.chars()
        .map(|c| match c {
            '{' => 1,
            '}' => -1,
            _ => 0,
        })
        .sum()
}

/// Skips the item gated by a `#[cfg(test)]` whose line ended in `rest`: further attributes,
/// then the item up to its `;` or the brace that closes its body.
fn skip_item<'a>(rest: &str, lines: &mut impl Iterator<Item = &'a str>) {
    let mut line = rest.to_string();
    let mut depth = 0;
    let mut opened = false;
    loop {
        let code = line.split("//").next().unwrap_or("");
        let t = code.trim();
        if opened || !(t.is_empty() || t.starts_with("#[")) {
            depth += brace_delta(code);
            opened |= code.contains('{');
            if (opened && depth <= 0) || (!opened && t.ends_with(';')) {
                return;
            }
        }
        match lines.next() {
            Some(next) => line = next.to_string(),
            None => return,
        }
    }
}

/// Splits `source` into code and doc comments, leaving out each `#[cfg(test)]` item and plain
/// `//` comments.
fn parts(source: &str) -> Parts {
    let mut code = String::new();
    let mut docs = String::new();
    let mut lines = source.lines();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("#[cfg(test)]") {
            skip_item(rest, &mut lines);
        } else if let Some(doc) = t.strip_prefix("///").or_else(|| t.strip_prefix("//!")) {
            docs.push_str(doc);
            docs.push('\n');
        } else if !t.starts_with("//") {
            code.push_str(line.split("//").next().unwrap_or(""));
            code.push('\n');
        }
    }
    Parts { code, docs }
}

/// The entries of a braced list whose opening brace has been consumed: the text of each
/// top-level entry, up to the matching closing brace.
fn list_entries(list: &str) -> Vec<&str> {
    let mut entries = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                entries.push(&list[start..i]);
                return entries;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                entries.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    entries.push(&list[start..]);
    entries
}

/// The names that `text` reaches through `crate::` or `super::` paths, each with its prefix:
/// the first segment of each path, and of each entry of a braced list right after the prefix.
fn path_heads(text: &str) -> Vec<String> {
    let mut heads = Vec::new();
    for prefix in ["crate::", "super::"] {
        for (i, _) in text.match_indices(prefix) {
            if text[..i].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            let rest = text[i + prefix.len()..].trim_start();
            let names = match rest.strip_prefix('{') {
                Some(list) => list_entries(list)
                    .into_iter()
                    .map(|e| ident(e.trim()))
                    .collect(),
                None => vec![ident(rest)],
            };
            heads.extend(
                names
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .map(|n| format!("{prefix}{n}")),
            );
        }
    }
    heads
}

/// The names the crate root re-exports, each with the module it comes from
/// (`pub use module::{A, B}` and `pub use module::A` in `lib.rs`).
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let code = parts(lib).code;
    let mut names = BTreeMap::new();
    for (i, _) in code.match_indices("pub use ") {
        let stmt = &code[i + "pub use ".len()..];
        let stmt = &stmt[..stmt.find(';').unwrap_or(stmt.len())];
        let Some((module, rest)) = stmt.split_once("::") else {
            continue;
        };
        let module = module.trim();
        let rest = rest.trim_start();
        let items = match rest.strip_prefix('{') {
            Some(list) => list_entries(list),
            None => vec![rest],
        };
        for item in items {
            // `a::B` re-exports `B`; `B as C` re-exports `C`.
            let item = item.trim();
            let item = item.rsplit("::").next().unwrap_or(item);
            let name = item.rsplit(" as ").next().unwrap_or(item).trim();
            if !name.is_empty() {
                names.insert(name.to_string(), module.to_string());
            }
        }
    }
    names
}

/// The types a file defines (`struct`, `enum`, `trait`, `type`, at any visibility).
fn defined_types(code: &str) -> Vec<String> {
    let mut types = Vec::new();
    for line in code.lines() {
        let mut words = line.split_whitespace().skip_while(|w| w.starts_with("pub"));
        if let (Some("struct" | "enum" | "trait" | "type"), Some(name)) =
            (words.next(), words.next())
        {
            types.push(ident(name).to_string());
        }
    }
    types
}

/// The methods a file adds in inherent `impl Type` blocks to types it does not define, each
/// with its type: callers reach them without naming the file.
fn foreign_methods(code: &str) -> Vec<(String, String)> {
    let own = defined_types(code);
    let mut methods = Vec::new();
    let mut current: Option<String> = None;
    let mut depth = 0;
    for line in code.lines() {
        let t = line.trim();
        if depth == 0
            && let Some(rest) = t.strip_prefix("impl ")
            && !rest.contains(" for ")
            && !rest.starts_with('<')
        {
            let ty = ident(rest).to_string();
            current = (!own.contains(&ty)).then_some(ty);
        }
        if depth == 1
            && let Some(ty) = &current
        {
            let mut words = t
                .split_whitespace()
                .skip_while(|w| w.starts_with("pub") || ["const", "async"].contains(w));
            if let (Some("fn"), Some(name)) = (words.next(), words.next()) {
                methods.push((ident(name).to_string(), ty.clone()));
            }
        }
        depth += brace_delta(line);
        if depth == 0 {
            current = None;
        }
    }
    methods
}

/// One edge of the graph: the module used and what in the user shows it.
struct Use {
    module: String,
    why: String,
}

/// The module graph of the crate in `dir`: each module (file stem, `lib` aside) with the
/// modules it uses.
fn module_graph(dir: &Path) -> BTreeMap<String, Vec<Use>> {
    let mut sources = BTreeMap::new();
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "rs") {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            sources.insert(stem, parts(&fs::read_to_string(&path).unwrap()));
        }
    }
    let lib = fs::read_to_string(dir.join("lib.rs")).unwrap();
    let reexports = root_reexports(&lib);
    sources.remove("lib");
    let methods: Vec<(String, String, String)> = sources
        .iter()
        .flat_map(|(m, p)| {
            foreign_methods(&p.code)
                .into_iter()
                .map(move |(f, ty)| (m.clone(), f, ty))
        })
        .collect();
    let mut graph = BTreeMap::new();
    for (m, p) in &sources {
        let mut uses: Vec<Use> = Vec::new();
        let mut add = |module: &str, why: String| {
            if module != m
                && sources.contains_key(module)
                && !uses.iter().any(|u| u.module == module)
            {
                uses.push(Use {
                    module: module.to_string(),
                    why,
                });
            }
        };
        for (text, place) in [(&p.code, "code"), (&p.docs, "docs")] {
            for path in path_heads(text) {
                let head = path.split_once("::").map_or("", |(_, h)| h);
                let why = format!("its {place} name `{path}`");
                add(reexports.get(head).map_or(head, String::as_str), why);
            }
        }
        for (owner, f, ty) in &methods {
            if p.code.contains(&format!(".{f}(")) || p.code.contains(&format!("::{f}(")) {
                add(owner, format!("it calls `{ty}::{f}`, defined there"));
            }
        }
        graph.insert(m.clone(), uses);
    }
    graph
}

/// The shortest cycle through each module of `graph` that lies on one, each cycle once, as
/// the path of modules that closes it.
fn find_cycles(graph: &BTreeMap<String, Vec<Use>>) -> Vec<Vec<String>> {
    let mut cycles: Vec<Vec<String>> = Vec::new();
    for start in graph.keys() {
        // Breadth-first from `start`; the first path back to it is the shortest through it.
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.as_str()]);
        while let Some(m) = queue.pop_front() {
            let Some(uses) = graph.get(m) else { continue };
            if let Some(u) = uses.iter().find(|u| u.module == *start) {
                let mut cycle = vec![u.module.clone(), m.to_string()];
                let mut at = m;
                while let Some(&prev) = came_from.get(at) {
                    cycle.push(prev.to_string());
                    at = prev;
                }
                cycle.reverse();
                let mut members = cycle[1..].to_vec();
                members.sort();
                let seen = cycles.iter().any(|c| {
                    let mut other = c[1..].to_vec();
                    other.sort();
                    other == members
                });
                if !seen {
                    cycles.push(cycle);
                }
                break;
            }
            for u in uses {
                if u.module != *start && !came_from.contains_key(u.module.as_str()) {
                    came_from.insert(&u.module, m);
                    queue.push_back(&u.module);
                }
            }
        }
    }
    cycles
}

/// A cycle written out edge by edge, each with what shows it.
fn describe(cycle: &[String], graph: &BTreeMap<String, Vec<Use>>) -> String {
    let mut out = String::new();
    for pair in cycle.windows(2) {
        let why = graph[&pair[0]]
            .iter()
            .find(|u| u.module == pair[1])
            .map_or("", |u| u.why.as_str());
        out.push_str(&format!("\n  {}.rs -> {}.rs: {why}", pair[0], pair[1]));
    }
    out
}

/// The layer of each module: 0 for a module that uses none, else one more than the highest
/// layer it uses. Only defined for a graph without cycles.
fn layers(graph: &BTreeMap<String, Vec<Use>>) -> BTreeMap<String, usize> {
    fn layer(
        m: &str,
        graph: &BTreeMap<String, Vec<Use>>,
        memo: &mut BTreeMap<String, usize>,
    ) -> usize {
        if let Some(&l) = memo.get(m) {
            return l;
        }
        let l = graph[m]
            .iter()
            .map(|u| layer(&u.module, graph, memo) + 1)
            .max()
            .unwrap_or(0);
        memo.insert(m.to_string(), l);
        l
    }
    let mut memo = BTreeMap::new();
    for m in graph.keys() {
        layer(m, graph, &mut memo);
    }
    memo
}

/// The modules named, in order, in the crate docs' paragraph that begins with `Modules,`.
fn documented_order(lib: &str) -> Vec<String> {
    let docs = parts(lib).docs;
    let Some(start) = docs.find("Modules,") else {
        return Vec::new();
    };
    let paragraph = docs[start..].split("\n\n").next().unwrap_or("");
    paragraph
        .split("[`")
        .skip(1)
        .map(|s| ident(s).to_string())
        .collect()
}

#[test]
fn oracle_module_graph_is_acyclic() {
    let graph = module_graph(&oracle_src());
    assert!(graph.len() > 8, "found only {} modules", graph.len());
    let cycles = find_cycles(&graph);
    let report: Vec<String> = cycles
        .iter()
        .map(|c| format!("{}:{}", c.join(" -> "), describe(c, &graph)))
        .collect();
    assert!(
        cycles.is_empty(),
        "moe-oracle's files refer to each other in a circle:\n{}",
        report.join("\n")
    );
    let layers = layers(&graph);
    let mut by_layer: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for (m, l) in &layers {
        by_layer.entry(*l).or_default().push(m);
    }
    for (l, ms) in by_layer {
        println!("layer {l}: {}", ms.join(", "));
    }
}

#[test]
fn oracle_docs_list_the_modules_bottom_up() {
    let dir = oracle_src();
    let graph = module_graph(&dir);
    let order = documented_order(&fs::read_to_string(dir.join("lib.rs")).unwrap());
    let mut problems = Vec::new();
    for m in graph.keys() {
        if !order.contains(m) {
            problems.push(format!("`{m}` is missing from the list"));
        }
    }
    for (i, m) in order.iter().enumerate() {
        for u in graph.get(m).into_iter().flatten() {
            if !order[..i].contains(&u.module) {
                problems.push(format!(
                    "`{m}` is listed before `{}`, which it uses ({})",
                    u.module, u.why
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "lib.rs lists moe-oracle's modules out of layer order:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_graph_rules_catch_what_they_should() {
    let p = parts(
        "//! Uses [`crate::a`].\nuse crate::{\n    b::B,\n    c::{C, D},\n};\n\
         // crate::z in a plain comment\nfn f() { crate::e::g(); super::h::i(); x.crate_y(); }\n\
         #[cfg(test)]\nmod tests {\n    use crate::t;\n    fn f() { if x { y } }\n}\n\
         #[cfg(test)]\n#[allow(unused)]\nuse crate::u;\nuse crate::w;\n",
    );
    assert_eq!(path_heads(&p.docs), ["crate::a"]);
    assert_eq!(
        path_heads(&p.code),
        ["crate::b", "crate::c", "crate::e", "crate::w", "super::h"]
    );
    let r = root_reexports("pub mod a;\npub use a::{A, B as C,\n    inner::D};\npub use e::E;\n");
    assert_eq!(r.get("C").map(String::as_str), Some("a"));
    assert_eq!(r.get("D").map(String::as_str), Some("a"));
    assert_eq!(r.get("E").map(String::as_str), Some("e"));
    assert_eq!(r.get("B"), None);
    assert_eq!(
        foreign_methods(
            "pub struct Own;\nimpl Own {\n    fn own() {}\n}\n\
             impl Other {\n    pub fn hook(self) {\n        if x {}\n    }\n    fn two() {}\n}\n\
             impl fmt::Display for Other {\n    fn fmt() {}\n}\n"
        ),
        [
            ("hook".to_string(), "Other".to_string()),
            ("two".to_string(), "Other".to_string())
        ]
    );
    let graph = |pairs: &[(&str, &[&str])]| -> BTreeMap<String, Vec<Use>> {
        pairs
            .iter()
            .map(|(m, v)| {
                let uses = v
                    .iter()
                    .map(|u| Use {
                        module: u.to_string(),
                        why: String::new(),
                    })
                    .collect();
                (m.to_string(), uses)
            })
            .collect()
    };
    let cyclic = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"])]);
    let abc = ["a", "b", "c", "a"].map(String::from).to_vec();
    assert_eq!(find_cycles(&cyclic), [abc]);
    let two = graph(&[
        ("a", &["b", "c"]),
        ("b", &["a"]),
        ("c", &["d"]),
        ("d", &["c"]),
    ]);
    assert_eq!(find_cycles(&two).len(), 2);
    let layered = graph(&[("a", &["b", "c"]), ("b", &["c"]), ("c", &[])]);
    assert!(find_cycles(&layered).is_empty());
    assert_eq!(layers(&layered)["a"], 2);
    assert_eq!(
        documented_order(
            "//! Intro [`x`].\n//!\n//! Modules, bottom-up: [`c`], [`b`] (two),\n\
             //! [`a`].\n//!\n//! After [`z`].\n"
        ),
        ["c", "b", "a"]
    );
}
