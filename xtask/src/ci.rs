//! `cargo xtask ci`: the CI sequence, which is all `.ci/run` does.
//!
//! The steps run in a fixed order, cheapest first where that does not change the meaning, and stop
//! at the first failure. Each step prints a banner and its time, and a table of step times closes
//! the run, so a CI log shows at a glance what ran and where the time went.

use std::time::{Duration, Instant};

use crate::flags::{Fuzz, TestArm, TestX86Ladder};
use crate::util::{Cmd, Result, banner, fmt_duration};
use crate::{fuzz, test_arm, test_x86};

/// One CI step.
enum Step {
    /// A cargo command with extra environment variables.
    Cargo {
        args: &'static [&'static str],
        env: &'static [(&'static str, &'static str)],
    },
    /// The x86 ISA ladder, run in this process.
    X86Ladder,
    /// The aarch64 QEMU ladder, run in this process.
    Arm,
    /// A short run of every fuzz target (seconds per target), after the committed inputs.
    Fuzz(u64),
}

impl Step {
    fn title(&self) -> String {
        match self {
            Step::Cargo { args, env } => {
                let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
                format!("{}cargo {}", env.concat(), args.join(" "))
            }
            Step::X86Ladder => "cargo xtask test-x86-ladder".to_string(),
            Step::Arm => "cargo xtask test-arm".to_string(),
            Step::Fuzz(seconds) => format!("cargo xtask fuzz --seconds {seconds}"),
        }
    }

    fn run(&self) -> Result<()> {
        match self {
            Step::Cargo { args, env } => {
                let mut cmd = Cmd::cargo(*args);
                for (key, value) in *env {
                    cmd = cmd.env(key, value);
                }
                cmd.run()
            }
            Step::X86Ladder => test_x86::run(&TestX86Ladder::default()),
            Step::Arm => test_arm::run(&TestArm::default()),
            Step::Fuzz(seconds) => fuzz::run(&Fuzz {
                seconds: *seconds,
                targets: Vec::new(),
            }),
        }
    }
}

/// The library crates users depend on one at a time (docs/embedding.md); each must document
/// and package on its own.
const PACKAGE_ARGS: &[&str] = &[
    "package",
    "--list",
    "--allow-dirty",
    "-p",
    "moe-quant",
    "-p",
    "moe-kernels",
    "-p",
    "moe-router",
    "-p",
    "moe-oracle",
    "-p",
    "moe-layer",
    "-p",
    "moe-capi",
];

/// Tells the tests that skip without a tool or input (a C compiler, the shared fixtures) to
/// fail instead: in CI a skipped check would pass silently.
const REQUIRE_TOOLS: (&str, &str) = ("MOE_REQUIRE_TEST_TOOLS", "1");

/// The CI sequence. `cargo test --workspace` is the test command the README gives.
const STEPS: [Step; 10] = [
    Step::Cargo {
        args: &["fmt", "--all", "--", "--check"],
        env: &[],
    },
    Step::Cargo {
        args: &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        env: &[],
    },
    // Every public item documented and every intra-doc link resolved.
    Step::Cargo {
        args: &["doc", "--workspace", "--no-deps", "--exclude", "xtask"],
        env: &[("RUSTDOCFLAGS", "-D warnings")],
    },
    // The optional heavy dependencies stay optional: rayon in moe-kernels, rayon and the
    // checkpoint reader (safetensors, memmap2) in moe-layer.
    // (clippy rather than check with RUSTFLAGS, so the dependencies' artifacts are shared
    // with the clippy step above instead of rebuilt.)
    Step::Cargo {
        args: &[
            "clippy",
            "-p",
            "moe-kernels",
            "-p",
            "moe-layer",
            "--no-default-features",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        env: &[],
    },
    // The published crates' file lists resolve (path dependencies carry versions).
    Step::Cargo {
        args: PACKAGE_ARGS,
        env: &[],
    },
    Step::Cargo {
        args: &["test", "--workspace"],
        env: &[(REQUIRE_TOOLS.0, REQUIRE_TOOLS.1)],
    },
    Step::X86Ladder,
    Step::Arm,
    // Reductions must not depend on the thread count (style item 11).
    Step::Cargo {
        args: &["test", "--workspace"],
        env: &[
            ("RAYON_NUM_THREADS", "1"),
            (REQUIRE_TOOLS.0, REQUIRE_TOOLS.1),
        ],
    },
    // Hostile inputs (docs/reliability.md): a short fuzz of every target. Miri (`cargo xtask
    // miri`, 15-20 minutes on a cold machine) is run by hand: with it the sequence would come
    // too close to CI's 90 minutes.
    Step::Fuzz(20),
];

/// Runs every step in order and stops at the first failure.
pub fn run() -> Result<()> {
    let start = Instant::now();
    let mut times: Vec<(String, Duration, &str)> = Vec::new();
    for (i, step) in STEPS.iter().enumerate() {
        let title = step.title();
        banner(&format!("CI step {}/{}: {title}", i + 1, STEPS.len()));
        let step_start = Instant::now();
        let outcome = step.run();
        let result = if outcome.is_ok() { "ok" } else { "FAILED" };
        times.push((title, step_start.elapsed(), result));
        if outcome.is_err() {
            print_times(&times, start.elapsed());
            return outcome.map_err(|e| format!("CI step {} failed: {e}", i + 1).into());
        }
    }
    print_times(&times, start.elapsed());
    Ok(())
}

fn print_times(times: &[(String, Duration, &str)], total: Duration) {
    banner("CI summary");
    for (title, elapsed, result) in times {
        println!("{:>8}  {result:<6}  {title}", fmt_duration(*elapsed));
    }
    println!("{:>8}  total", fmt_duration(total));
}
