//! `cargo xtask test-x86-ladder`: the moe-kernels tests once per x86 ISA cap.
//!
//! QEMU cannot emulate AVX-512 on x86, so the slower x86 rungs are tested natively by capping the
//! dispatcher with `MOE_KERNELS_MAX_ISA`. The uncapped (best-ISA) run is `cargo test --workspace`
//! itself. Each capped run also sets `MOE_EXPECT_ISA`, so moe-kernels' guard test fails when the
//! cap did not select the rung it names. Rungs the host CPU lacks are skipped with a note.

use std::time::Instant;

use crate::flags::TestX86Ladder;
use crate::util::{Cmd, Result, banner, fmt_duration};

/// The capped rungs, from the fastest down.
const CAPS: [&str; 4] = ["avx512-vnni", "avx-vnni", "avx2", "scalar"];

/// Runs `cargo test -p moe-kernels` under each cap the host supports.
pub fn run(opts: &TestX86Ladder) -> Result<()> {
    let mut rows = Vec::new();
    for cap in CAPS {
        banner(&format!("x86 ladder: MOE_KERNELS_MAX_ISA={cap}"));
        if !host_has(cap) {
            println!("skipped: this CPU lacks {cap}");
            rows.push((cap, "skipped".to_string()));
            continue;
        }
        let start = Instant::now();
        let mut cmd = Cmd::cargo(["test", "-p", "moe-kernels"])
            .env("MOE_KERNELS_MAX_ISA", cap)
            .env("MOE_EXPECT_ISA", cap);
        if !opts.test_args.is_empty() {
            cmd = cmd.arg("--").args(&opts.test_args);
        }
        let outcome = cmd.run_outcome()?;
        let result = if outcome.success() { "ok" } else { "FAILED" };
        rows.push((
            cap,
            format!("{result} in {}", fmt_duration(start.elapsed())),
        ));
        if !outcome.success() {
            print_summary(&rows);
            return Err(format!("moe-kernels tests failed with MOE_KERNELS_MAX_ISA={cap}").into());
        }
    }
    print_summary(&rows);
    Ok(())
}

fn print_summary(rows: &[(&str, String)]) {
    banner("x86 ladder summary");
    for (cap, result) in rows {
        println!("{cap:<12} {result}");
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
