//! Test executables as cargo reports them, and libtest's verdicts.
//!
//! xtask builds tests once with `cargo test --no-run` and then runs the executables itself: under
//! qemu-aarch64 once per CPU rung, or natively once per ISA cap. Running them directly avoids a
//! cargo freshness check per run and lets each run carry its own environment and time limit.

use std::path::{Path, PathBuf};

use crate::util::{Cmd, Result};

/// A test executable produced by a `cargo test --no-run` build.
#[derive(Debug)]
pub struct TestBinary {
    /// For humans: `crate (kind)`.
    pub label: String,
    /// The executable.
    pub exe: PathBuf,
    /// The package directory; cargo runs tests from there, so xtask does too.
    pub package_dir: PathBuf,
}

/// Runs `build` (a `cargo test --no-run ...` command) with JSON messages on stdout and returns
/// the test executables it reports. Compiler diagnostics are still rendered to stderr.
pub fn build(build: Cmd) -> Result<Vec<TestBinary>> {
    let build = build.arg("--message-format=json-render-diagnostics");
    println!("$ {}", build.display());
    let messages = build.read_stdout()?;
    let binaries: Vec<TestBinary> = messages.lines().filter_map(test_binary_from_json).collect();
    if binaries.is_empty() {
        return Err("the build produced no test executable".into());
    }
    Ok(binaries)
}

/// Reads one line of cargo's JSON output; `Some` for a test executable.
///
/// The format is stable; a full JSON parser would be a dependency for four fields.
fn test_binary_from_json(line: &str) -> Option<TestBinary> {
    if json_string(line, "reason")? != "compiler-artifact" {
        return None;
    }
    let profile = &line[line.find("\"profile\":{")?..];
    let profile = &profile[..profile.find('}')?];
    if !profile.contains("\"test\":true") {
        return None;
    }
    let exe = json_string(line, "executable")?;
    let manifest = json_string(line, "manifest_path")?;
    let target = &line[line.find("\"target\":{")?..];
    let name = json_string(target, "name")?;
    let kind = json_string_list_head(target, "kind").unwrap_or_else(|| "test".to_string());
    Some(TestBinary {
        label: format!("{name} ({kind})"),
        exe: PathBuf::from(exe),
        package_dir: Path::new(&manifest).parent()?.to_path_buf(),
    })
}

/// The first string value of `"key":"..."` in `text`, unescaped.
fn json_string(text: &str, key: &str) -> Option<String> {
    let pattern = format!("\"{key}\":\"");
    let start = text.find(&pattern)? + pattern.len();
    read_json_string(&text[start..])
}

/// The first element of `"key":["...", ...]` in `text`.
fn json_string_list_head(text: &str, key: &str) -> Option<String> {
    let pattern = format!("\"{key}\":[\"");
    let start = text.find(&pattern)? + pattern.len();
    read_json_string(&text[start..])
}

/// Reads a JSON string body up to its closing quote (the opening quote already consumed).
fn read_json_string(body: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                }
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// Totals from libtest's `test result:` lines.
#[derive(Debug, Default, PartialEq)]
pub struct TestCounts {
    /// Tests that passed.
    pub passed: u64,
    /// Tests that failed.
    pub failed: u64,
    /// Tests that were ignored.
    pub ignored: u64,
    /// Whether any summary line was found.
    pub seen: bool,
}

impl TestCounts {
    /// Sums every `test result: ok. 3 passed; 0 failed; 1 ignored; ...` line of `text`.
    pub fn parse(text: &str) -> Self {
        let mut counts = TestCounts::default();
        for line in text.lines().filter(|l| l.starts_with("test result:")) {
            counts.seen = true;
            for part in line.split(';') {
                let words: Vec<&str> = part.split_whitespace().collect();
                let [.., number, what] = words[..] else {
                    continue;
                };
                let Ok(n) = number.parse::<u64>() else {
                    continue;
                };
                match what {
                    "passed" => counts.passed += n,
                    "failed" => counts.failed += n,
                    "ignored" => counts.ignored += n,
                    _ => {}
                }
            }
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_summaries_are_summed() {
        let text = "running 3 tests\n\
            test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s\n\
            test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.5s\n";
        let counts = TestCounts::parse(text);
        assert_eq!((counts.passed, counts.failed, counts.ignored), (5, 1, 1));
        assert!(counts.seen);
        assert!(!TestCounts::parse("Segmentation fault").seen);
    }

    #[test]
    fn cargo_json_yields_test_executables() {
        let line = r#"{"reason":"compiler-artifact","package_id":"path+file:///r/crates/moe-testutil#0.1.0","manifest_path":"/r/crates/moe-testutil/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"name":"moe_testutil","src_path":"/r/crates/moe-testutil/src/lib.rs","edition":"2024","doctest":true,"test":true},"profile":{"opt_level":"2","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/r/t/deps/moe_testutil-abc"],"executable":"/r/t/deps/moe_testutil-abc","fresh":true}"#;
        let binary = test_binary_from_json(line).expect("a test executable");
        assert_eq!(binary.label, "moe_testutil (lib)");
        assert_eq!(binary.exe, Path::new("/r/t/deps/moe_testutil-abc"));
        assert_eq!(binary.package_dir, Path::new("/r/crates/moe-testutil"));

        let library = line
            .replace(
                r#""executable":"/r/t/deps/moe_testutil-abc""#,
                r#""executable":null"#,
            )
            .replace(
                r#""overflow_checks":true,"test":true"#,
                r#""overflow_checks":true,"test":false"#,
            );
        assert!(test_binary_from_json(&library).is_none());
    }
}
