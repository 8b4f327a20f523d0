//! `cargo xtask test-x86-ladder`: the moe-kernels test binaries once per x86 ISA cap.
//!
//! QEMU cannot emulate AVX-512 on x86, so the slower x86 rungs are tested natively by capping the
//! dispatcher with `MOE_KERNELS_MAX_ISA`. The uncapped (best-ISA) run is `cargo test --workspace`
//! itself. Each capped run also sets `MOE_EXPECT_ISA`, so moe-kernels' guard test fails when the
//! cap did not select the rung it names. Rungs the host CPU lacks are skipped with a note.

use std::time::{Duration, Instant};

use crate::flags::TestX86Ladder;
use crate::test_binaries::{self, TestCounts};
use crate::util::{Cmd, Result, banner, fmt_duration};

/// The capped rungs, from the fastest down.
const CAPS: [&str; 4] = ["avx512-vnni", "avx-vnni", "avx2", "scalar"];

/// The package whose tests run under every cap.
const KERNELS_PACKAGE: &str = "moe-kernels";

/// Upper bound for one test binary, so a hang cannot stall CI.
const TIME_LIMIT: Duration = Duration::from_secs(20 * 60);

/// Runs the moe-kernels test binaries under each cap the host supports.
///
/// The binaries come from `cargo test --workspace --no-run`: the same build as the README's
/// `cargo test --workspace`, so in CI nothing is compiled again (a `-p moe-kernels` build would
/// resolve features differently and rebuild part of the dependency tree).
pub fn run(opts: &TestX86Ladder) -> Result<()> {
    banner("x86 ladder: building the workspace tests");
    let binaries: Vec<_> = test_binaries::build(Cmd::cargo(["test", "--workspace", "--no-run"]))?
        .into_iter()
        .filter(|b| {
            b.package_dir
                .file_name()
                .is_some_and(|d| d == KERNELS_PACKAGE)
        })
        .collect();
    if binaries.is_empty() {
        return Err(format!("no test binary of {KERNELS_PACKAGE} was built").into());
    }
    let mut rows = Vec::new();
    for cap in CAPS {
        banner(&format!("x86 ladder: MOE_KERNELS_MAX_ISA={cap}"));
        if !host_has(cap) {
            println!("skipped: this CPU does not report {cap}");
            rows.push(format!("{cap:<12} skipped (not reported by this CPU)"));
            continue;
        }
        let start = Instant::now();
        let prefix = format!("[{cap}] ");
        let mut totals = TestCounts::default();
        let mut problems = Vec::new();
        for binary in &binaries {
            let (outcome, text) = Cmd::new(&binary.exe)
                .args(&opts.test_args)
                .env("MOE_KERNELS_MAX_ISA", cap)
                .env("MOE_EXPECT_ISA", cap)
                .cwd(&binary.package_dir)
                .timeout(TIME_LIMIT)
                .run_tee(&prefix)?;
            let counts = TestCounts::parse(&text);
            totals.passed += counts.passed;
            totals.failed += counts.failed;
            totals.ignored += counts.ignored;
            if !outcome.success() {
                problems.push(format!("{}: {}", binary.label, outcome.describe()));
            }
        }
        let result = if problems.is_empty() { "ok" } else { "FAILED" };
        rows.push(format!(
            "{cap:<12} {result:<6} {} passed, {} failed, {} ignored in {}",
            totals.passed,
            totals.failed,
            totals.ignored,
            fmt_duration(start.elapsed())
        ));
        if !problems.is_empty() {
            print_summary(&rows);
            return Err(format!(
                "moe-kernels tests failed with MOE_KERNELS_MAX_ISA={cap}: {}",
                problems.join("; ")
            )
            .into());
        }
    }
    print_summary(&rows);
    Ok(())
}

fn print_summary(rows: &[String]) {
    banner("x86 ladder summary");
    for row in rows {
        println!("{row}");
    }
}

/// Whether the host can run the `isa` rung (std's detection, which agrees with the CPUID bits
/// moe-kernels reads for these rungs).
#[cfg(target_arch = "x86_64")]
fn host_has(isa: &str) -> bool {
    use std::arch::is_x86_feature_detected as has;
    match isa {
        "avx512-vnni" => has!("avx512f") && has!("avx512bw") && has!("avx512vnni"),
        "avx-vnni" => has!("avx2") && has!("avxvnni"),
        "avx2" => has!("avx2") && has!("fma"),
        "scalar" => true,
        _ => false,
    }
}

/// Off x86-64 only the scalar rung exists among these caps.
#[cfg(not(target_arch = "x86_64"))]
fn host_has(isa: &str) -> bool {
    isa == "scalar"
}
