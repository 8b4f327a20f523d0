//! The tidy test: what the code and the docs say about themselves stays about the code.
//!
//! - Comments and doc comments in Rust sources name no issue or pull-request number (a
//!   qualified upstream reference such as `vllm-project/vllm#48905` is fine), no working
//!   session or development machine, no CPU product a figure was measured on (that belongs in
//!   docs/performance.md, next to the figure), and no path outside the repository.
//! - The Markdown docs name no issue number and no working session.
//! - Every crate inherits the workspace lints, and the workspace keeps `missing_docs` on, so
//!   that clippy's `-D warnings` fails on a public item without docs.
//!
//! Each rule is a plain function with its own test, so a rule that stops matching is caught
//! here rather than silently passing the tree. The layering of moe-oracle's files has a test
//! of its own, `oracle_layers.rs`, and where `unsafe` code, CPU feature detection and the C
//! boundary may be is checked by `boundaries.rs`.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace root")
        .to_path_buf()
}

/// Files under `dir` whose name ends with `ext`, skipping build output and hidden folders.
fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                files(&path, ext, out);
            }
        } else if name.ends_with(ext) {
            out.push(path);
        }
    }
}

/// Whether `text` holds `#` followed by digits that is not the tail of an `owner/repo`
/// reference.
fn bare_hash_number(text: &str) -> bool {
    let bytes = text.as_bytes();
    for (i, _) in text.match_indices('#') {
        let digits = bytes[i + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits < 2 {
            continue;
        }
        let before = &text[..i];
        let word_start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "/_.-".contains(c)))
            .map_or(0, |p| p + 1);
        if !before[word_start..].contains('/') {
            return true;
        }
    }
    false
}

/// Whether `text` says "issue N" or "issue #N" (any case).
fn issue_number(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.match_indices("issue").any(|(i, w)| {
        let rest = lower[i + w.len()..].trim_start_matches([' ', '#']);
        rest.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// Words that speak of how the code was made rather than of the code.
const WORKPLACE_WORDS: [&str; 5] = [
    "session",
    "development machine",
    "dev machine",
    "our machine",
    "my machine",
];

/// CPU products: a figure names the machine it came from in docs/performance.md, not in code.
const CPU_PRODUCTS: [&str; 8] = [
    "epyc",
    "xeon",
    "zen 4",
    "zen4",
    "sapphire rapids",
    "emerald rapids",
    "granite rapids",
    "graviton",
];

/// Absolute paths that only exist on some machine.
const OUTSIDE_PATHS: [&str; 5] = ["/work/", "/tmp/", "/home/", "/root/", "/opt/"];

/// What is wrong with one comment's text, if anything.
fn comment_problem(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    if issue_number(text) || bare_hash_number(text) {
        return Some("an issue or pull-request number".into());
    }
    if let Some(w) = WORKPLACE_WORDS.iter().find(|w| lower.contains(*w)) {
        return Some(format!("speaks of the workplace ({w:?})"));
    }
    if let Some(w) = CPU_PRODUCTS.iter().find(|w| lower.contains(*w)) {
        return Some(format!("names a CPU product ({w:?})"));
    }
    if let Some(w) = OUTSIDE_PATHS.iter().find(|w| text.contains(*w)) {
        return Some(format!("a path outside the repository ({w:?})"));
    }
    None
}

/// What is wrong with one line of Markdown, if anything.
fn doc_problem(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    if issue_number(text) {
        return Some("an issue number".into());
    }
    if lower.contains("session") {
        return Some("speaks of a working session".into());
    }
    None
}

/// The comment part of a Rust source line (after `//`), or `None` for code.
fn comment_of(line: &str) -> Option<&str> {
    let t = line.trim_start();
    t.strip_prefix("//")
}

#[test]
fn rust_comments_speak_of_the_code() {
    let root = root();
    let mut sources = Vec::new();
    for dir in ["crates", "xtask", "fuzz"] {
        files(&root.join(dir), ".rs", &mut sources);
    }
    assert!(
        sources.len() > 50,
        "found only {} Rust files",
        sources.len()
    );
    let this_file = Path::new(file!()).file_name().unwrap();
    let mut problems = Vec::new();
    for path in sources {
        if path.file_name() == Some(this_file)
            && path.parent().is_some_and(|p| p.ends_with("tests"))
        {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            if let Some(problem) = comment_of(line).and_then(comment_problem) {
                problems.push(format!(
                    "{}:{}: {problem}: {}",
                    path.strip_prefix(&root).unwrap_or(&path).display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn markdown_docs_speak_of_the_code() {
    let root = root();
    let mut docs = vec![root.join("README.md")];
    files(&root.join("docs"), ".md", &mut docs);
    for dir in ["crates", "xtask"] {
        files(&root.join(dir), ".md", &mut docs);
    }
    let mut problems = Vec::new();
    for path in docs {
        let text = fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            if let Some(problem) = doc_problem(line) {
                problems.push(format!(
                    "{}:{}: {problem}: {}",
                    path.strip_prefix(&root).unwrap_or(&path).display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn public_items_without_docs_fail_the_lints() {
    let root = root();
    let workspace = fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        workspace.contains("missing_docs = \"warn\"")
            || workspace.contains("missing_docs = \"deny\""),
        "the workspace lints must keep missing_docs on"
    );
    let mut manifests = Vec::new();
    for entry in fs::read_dir(root.join("crates")).unwrap().flatten() {
        manifests.push(entry.path().join("Cargo.toml"));
    }
    manifests.push(root.join("xtask/Cargo.toml"));
    for m in manifests {
        let text = fs::read_to_string(&m).unwrap();
        let lints = text
            .split("[lints]")
            .nth(1)
            .is_some_and(|rest| rest.trim_start().starts_with("workspace = true"));
        assert!(
            lints,
            "{}: [lints] workspace = true is missing",
            m.display()
        );
    }
}

#[test]
fn the_rules_catch_what_they_forbid() {
    for bad in [
        " see issue 17 for the targets",
        " as issue #8 asked",
        " fixes #1234",
        " measured this session",
        " the development machine has no AMX",
        " on an AMD EPYC, 4 KiB ahead",
        " an AMX Xeon, one core",
        " written to /tmp/rs by hand",
    ] {
        assert!(comment_problem(bad).is_some(), "not caught: {bad:?}");
    }
    for good in [
        " vLLM reads them as unsigned (vllm-project/vllm#48905)",
        " one issue per group; 16 lanes",
        " the oracle's view of this machine",
        " `#[target_feature]` on a safe fn",
        " 2^-9 relative, see docs/performance.md",
    ] {
        assert_eq!(comment_problem(good), None, "{good:?}");
    }
    assert!(doc_problem("What issue 19 asked for").is_some());
    assert!(doc_problem("measured in this session").is_some());
    assert_eq!(doc_problem("## Issue tracker conventions"), None);
    assert_eq!(comment_of("    /// doc"), Some("/ doc"));
    assert_eq!(comment_of("let x = 1; // trailing"), None);
}
