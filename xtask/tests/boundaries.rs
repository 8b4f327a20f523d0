//! Where the sharp tools may be used: the architecture invariants about `unsafe` code, CPU
//! feature detection, the oracle's distance from the kernels and the C boundary, checked on
//! the source tree.
//!
//! - Every crate root says how much `unsafe` it admits: `#![forbid(unsafe_code)]`, except
//!   moe-kernels and moe-capi (which need it), and moe-layer and moe-cli, which say
//!   `#![deny(unsafe_code)]` and allow it at one place each: the memory map of a shard, and
//!   the `moe` command's restoring of SIGPIPE's default action.
//! - Only moe-kernels detects CPU features; every other crate asks it.
//! - moe-oracle names only moe-kernels' ISA vocabulary (the rungs and which of them the CPU
//!   has), never a kernel.
//! - Every function moe-capi exports runs its body through the boundary's `guard`, which
//!   catches panics, except the accessors that only return a static or thread-local string.
//!
//! Each rule is a plain function over source text, with a test that feeds it what it forbids,
//! so a rule that stops matching fails here rather than passing the tree silently.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace root")
        .to_path_buf()
}

/// The `.rs` files under `dir`, sorted, skipping build output and hidden folders.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The crates of the workspace: `(name, root file)`.
fn crates() -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = fs::read_dir(root().join("crates"))
        .expect("crates/ exists")
        .flatten()
        .filter_map(|e| {
            let src = e.path().join("src");
            let root = ["lib.rs", "main.rs"]
                .iter()
                .map(|f| src.join(f))
                .find(|p| p.is_file())?;
            Some((e.file_name().to_string_lossy().into_owned(), root))
        })
        .collect();
    out.sort();
    out
}

/// The code of a line: what comes before a `//` comment.
fn code_of(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

/// How much `unsafe` a crate admits.
#[derive(Debug, PartialEq, Eq)]
enum UnsafePolicy {
    /// `#![forbid(unsafe_code)]`.
    Forbid,
    /// `#![deny(unsafe_code)]`, with local allowances.
    Deny,
    /// No crate-wide lint: the crate's `unsafe` is fenced by its own rules.
    Open,
}

/// The policy a crate root's text declares.
fn declared_policy(root_text: &str) -> UnsafePolicy {
    let attr = |a: &str| root_text.lines().any(|l| code_of(l).trim() == a);
    if attr("#![forbid(unsafe_code)]") {
        UnsafePolicy::Forbid
    } else if attr("#![deny(unsafe_code)]") {
        UnsafePolicy::Deny
    } else {
        UnsafePolicy::Open
    }
}

/// The policy each crate must declare.
fn required_policy(krate: &str) -> UnsafePolicy {
    match krate {
        "moe-kernels" | "moe-capi" => UnsafePolicy::Open,
        "moe-layer" | "moe-cli" => UnsafePolicy::Deny,
        _ => UnsafePolicy::Forbid,
    }
}

/// The lines of `text` (1-based) that allow `unsafe_code` locally.
fn unsafe_allowances(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| code_of(l).contains("allow(unsafe_code)"))
        .map(|(i, _)| i + 1)
        .collect()
}

#[test]
fn every_crate_declares_how_much_unsafe_it_admits() {
    let mut problems = Vec::new();
    for (krate, root_file) in crates() {
        let text = fs::read_to_string(&root_file).unwrap();
        let (declared, required) = (declared_policy(&text), required_policy(&krate));
        if declared != required {
            problems.push(format!(
                "{krate}: declares {declared:?}, must declare {required:?}"
            ));
        }
    }
    // The one allowance of each crate that denies unsafe code: moe-layer's memory map of a
    // shard, and moe-cli's restoring of SIGPIPE's default action.
    for (krate, only) in [
        ("moe-layer", "checkpoint/shards.rs:"),
        ("moe-cli", "main.rs:"),
    ] {
        let src = root().join("crates").join(krate).join("src");
        let mut allowed = Vec::new();
        for file in rust_files(&src) {
            let text = fs::read_to_string(&file).unwrap();
            for line in unsafe_allowances(&text) {
                let rel = file.strip_prefix(&src).unwrap().display().to_string();
                allowed.push(format!("{rel}:{line}"));
            }
        }
        if allowed.len() != 1 || !allowed[0].starts_with(only) {
            problems.push(format!(
                "{krate} allows unsafe_code at {allowed:?}; only one place in {only} may"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The ways a crate could detect CPU features itself.
const DETECTION: [&str; 6] = [
    "is_x86_feature_detected",
    "is_aarch64_feature_detected",
    "__cpuid",
    "getauxval",
    "/proc/cpuinfo",
    "sysctlbyname",
];

/// The first detection in `text`, as `(line, what)`.
fn detects_features(text: &str) -> Option<(usize, &'static str)> {
    text.lines().enumerate().find_map(|(i, l)| {
        let code = code_of(l);
        DETECTION
            .iter()
            .find(|d| code.contains(*d))
            .map(|d| (i + 1, *d))
    })
}

#[test]
fn only_moe_kernels_detects_cpu_features() {
    let mut problems = Vec::new();
    for (krate, root_file) in crates() {
        if krate == "moe-kernels" {
            continue;
        }
        let dir = root_file.parent().unwrap().parent().unwrap().to_path_buf();
        for file in rust_files(&dir) {
            let text = fs::read_to_string(&file).unwrap();
            if let Some((line, what)) = detects_features(&text) {
                problems.push(format!("{}:{line}: {what}", file.display()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "CPU features detected outside moe-kernels (ask moe_kernels::available_isas or \
         KernelSet instead):\n{}",
        problems.join("\n")
    );
}

/// What moe-oracle may name from moe-kernels: the ISA vocabulary and what the CPU has.
const ORACLE_MAY_NAME: [&str; 4] = ["Isa", "IsaArch", "isa_cap", "available_isas"];

/// The items of moe-kernels that `text` names outside that vocabulary, as `(line, item)`:
/// paths `moe_kernels::item…` and the first segment of each entry of a `use moe_kernels::{…}`
/// list, over several lines too.
fn kernel_items_named(text: &str) -> Vec<(usize, String)> {
    let code: String = text.lines().map(|l| format!("{}\n", code_of(l))).collect();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (at, _) in code.match_indices("moe_kernels") {
        let rest = &code[at + "moe_kernels".len()..];
        let names: Vec<String> = if let Some(list) = rest.strip_prefix("::{") {
            // The list up to its closing brace; entries split at top-level commas.
            let (mut depth, mut entries, mut entry) = (0usize, Vec::new(), String::new());
            for c in list.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        entries.push(std::mem::take(&mut entry));
                        continue;
                    }
                    _ => {}
                }
                entry.push(c);
            }
            entries.push(entry);
            entries.iter().map(|e| ident(e.trim())).collect()
        } else if let Some(path) = rest.strip_prefix("::") {
            vec![ident(path)]
        } else {
            // The crate itself named (`use moe_kernels;`, `moe_kernels as k`).
            vec![String::from("moe_kernels")]
        };
        for name in names.into_iter().filter(|n| !n.is_empty()) {
            if !ORACLE_MAY_NAME.contains(&name.as_str()) {
                out.push((line_of(at), name));
            }
        }
    }
    out
}

#[test]
fn the_oracle_names_no_kernel() {
    let src = root().join("crates/moe-oracle/src");
    let mut problems = Vec::new();
    for file in rust_files(&src) {
        let text = fs::read_to_string(&file).unwrap();
        for (line, item) in kernel_items_named(&text) {
            problems.push(format!("{}:{line}: moe_kernels::{item}", file.display()));
        }
    }
    assert!(
        problems.is_empty(),
        "moe-oracle may name only {ORACLE_MAY_NAME:?} of moe-kernels:\n{}",
        problems.join("\n")
    );
}

/// Exported functions that need no guard: they return a static or thread-local string, or
/// write a default value, and call nothing that can panic.
const UNGUARDED: [&str; 4] = [
    "moe_last_error_message",
    "moe_status_name",
    "moe_version",
    "moe_layer_options_default",
];

/// Whether `code` calls an exported function (`moe_…(`) other than `name`.
fn calls_another_export(code: &str, name: &str) -> bool {
    code.match_indices("moe_").any(|(at, _)| {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            return false;
        }
        let ident: String = code[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        ident != name && code[at + ident.len()..].trim_start().starts_with('(')
    })
}

/// The functions `text` exports (`extern "C" fn`) whose body neither calls `guard(` nor
/// hands its arguments to another exported function (whose own body this rule checks), as
/// `(line, name)`. A body runs from the signature to the first line that closes it at the
/// signature's indentation.
fn unguarded_exports(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = code_of(line);
        let Some(at) = code.find("extern \"C\" fn ") else {
            continue;
        };
        let name: String = code[at + "extern \"C\" fn ".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let indent = line.len() - line.trim_start().len();
        let close = format!("{}}}", " ".repeat(indent));
        let body_end = lines[i + 1..]
            .iter()
            .position(|l| l.starts_with(&close) && l.trim() == "}")
            .map_or(lines.len(), |p| i + 1 + p);
        let guarded = lines[i + 1..body_end].iter().any(|l| {
            let code = code_of(l);
            code.contains("guard(") || calls_another_export(code, &name)
        });
        if !guarded && !UNGUARDED.contains(&name.as_str()) {
            out.push((i + 1, name));
        }
    }
    out
}

#[test]
fn every_c_entry_point_runs_through_the_boundary() {
    let src = root().join("crates/moe-capi/src");
    let mut problems = Vec::new();
    let mut exports = 0;
    for file in rust_files(&src) {
        let text = fs::read_to_string(&file).unwrap();
        exports += text.matches("extern \"C\" fn ").count();
        for (line, name) in unguarded_exports(&text) {
            problems.push(format!("{}:{line}: {name}", file.display()));
        }
    }
    assert!(exports > 10, "found only {exports} exported functions");
    assert!(
        problems.is_empty(),
        "exported functions whose body does not run through boundary::guard:\n{}",
        problems.join("\n")
    );
}

/// Each rule catches what it forbids and passes what it allows.
#[test]
fn the_rules_catch_what_they_forbid() {
    assert_eq!(
        declared_policy("//! docs\n#![forbid(unsafe_code)]\n"),
        UnsafePolicy::Forbid
    );
    assert_eq!(
        declared_policy("#![deny(unsafe_code)]\n"),
        UnsafePolicy::Deny
    );
    assert_eq!(
        declared_policy("// #![forbid(unsafe_code)]\n"),
        UnsafePolicy::Open
    );
    assert_eq!(required_policy("moe-new-crate"), UnsafePolicy::Forbid);
    assert_eq!(
        unsafe_allowances("fn a() {}\n#[allow(unsafe_code)]\nfn b() {}\n// allow(unsafe_code)\n"),
        vec![2]
    );

    assert_eq!(
        detects_features("let x = 1;\nif is_x86_feature_detected!(\"avx2\") {}\n"),
        Some((2, "is_x86_feature_detected"))
    );
    assert_eq!(detects_features("// is_x86_feature_detected\n"), None);

    assert_eq!(
        kernel_items_named("use moe_kernels::{Isa, KernelSet};\nlet p = moe_kernels::w4a8_gemm;\n"),
        vec![(1, "KernelSet".to_string()), (2, "w4a8_gemm".to_string())]
    );
    assert_eq!(
        kernel_items_named("pub use moe_kernels::Isa;\nmoe_kernels::available_isas()\n"),
        vec![]
    );
    assert_eq!(
        kernel_items_named("use moe_kernels::{\n    Isa,\n    packed::{PackedW4A8, PANEL},\n};\n"),
        vec![(1, "packed".to_string())]
    );

    let exports = "\
#[unsafe(no_mangle)]
pub extern \"C\" fn moe_a(x: u32) -> MoeStatus {
    guard(|| {
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern \"C\" fn moe_b() -> MoeStatus {
    work();
    MoeStatus::Ok
}

pub extern \"C\" fn moe_version() -> *const c_char {
    boundary::version().as_ptr()
}

pub unsafe extern \"C\" fn moe_c(out: *mut u32) -> MoeStatus {
    // SAFETY: delegated.
    unsafe { moe_c_with(out, std::ptr::null()) }
}

pub unsafe extern \"C\" fn moe_d(out: *mut u32) -> MoeStatus {
    unsafe { out.write(fake_moe_e(1)) };
    MoeStatus::Ok
}
";
    assert_eq!(
        unguarded_exports(exports),
        vec![(9, "moe_b".to_string()), (23, "moe_d".to_string())]
    );
}
