//! `cargo xtask test-arm`: the aarch64 test ladder under qemu-user.
//!
//! The cross build does not depend on rustup's aarch64 target (a download rustup cannot always
//! make); it uses Debian's `rustc-web` compiler (which ships an aarch64 standard library)
//! through rustup's cargo, in a target directory of its own. Every binary is linked statically, because qemu-aarch64 7.2 hangs
//! on dynamically linked binaries that start threads. The tests are built once and each test
//! binary is then run directly under qemu-aarch64 once per CPU rung, with `MOE_EXPECT_ISA` naming
//! the kernel rung that moe-kernels must select there. Before a rung's tests, a tiny probe program
//! prints what `is_aarch64_feature_detected!` sees, and the rung fails when the emulated CPU does
//! not expose the features the rung is meant to test (a silent fallback must not pass).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::flags::TestArm;
use crate::project_root;
use crate::test_binaries::{self, TestBinary, TestCounts};
use crate::util::{Cmd, Result, banner, fmt_duration};

/// The cross target.
pub(crate) const TARGET: &str = "aarch64-unknown-linux-gnu";

/// Debian's `rustc-web` compiler, which has the aarch64 standard library. rustup's rustc stays
/// first on PATH, so it is named by its full path.
pub(crate) const DEBIAN_RUSTC: &str = "/usr/bin/rustc";

/// The cross linker from `gcc-aarch64-linux-gnu`.
const LINKER: &str = "aarch64-linux-gnu-gcc";

/// The user-mode emulator from `qemu-user`.
const QEMU: &str = "qemu-aarch64";

/// Flags for every aarch64 artifact: static linking keeps threaded binaries from hanging.
const TARGET_RUSTFLAGS: &str = "-C target-feature=+crt-static";

/// Debian packages the cross build and the emulator need (the list from docs/cross-arm.md).
const PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev:arm64",
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "qemu-user",
];

/// Workspace members left out of the aarch64 build: they hold no aarch64-specific code and their
/// dependencies (clap, cbindgen, plotters) would dominate the build time. moe-capi's test also
/// compiles and runs a host C program, which a static cross build cannot do.
const EXCLUDED_PACKAGES: &[&str] = &["moe-cli", "moe-capi", "moe-plot", "xtask"];

/// The name of an optional test that prints the CPU features a crate detects; when a test binary
/// has it, it is run with `--nocapture` at the start of each rung.
const FEATURE_REPORT_TEST: &str = "report_detected_cpu_features";

/// One step of the ladder: a QEMU CPU model and the kernel ISA it must select.
#[derive(Clone, Copy, Debug)]
pub struct Rung {
    /// The `QEMU_CPU` model.
    pub cpu: &'static str,
    /// The best aarch64 ISA rung that model offers (the value of `MOE_EXPECT_ISA`).
    pub isa: &'static str,
}

/// The ladder, from the baseline up.
pub const RUNGS: [Rung; 3] = [
    Rung {
        cpu: "cortex-a53",
        isa: "neon",
    },
    Rung {
        cpu: "neoverse-n1",
        isa: "dotprod",
    },
    Rung {
        cpu: "max",
        isa: "i8mm",
    },
];

/// A test executable of the cross build, with the optional feature-report test it holds.
#[derive(Debug)]
struct ArmBinary {
    binary: TestBinary,
    /// The full name of the feature-report test, when the binary has one.
    feature_report: Option<String>,
}

/// What one rung produced, for the summary table.
#[derive(Debug)]
struct RungReport {
    rung: Rung,
    features: String,
    passed: u64,
    failed: u64,
    ignored: u64,
    problems: Vec<String>,
    elapsed: Duration,
}

/// Runs the ladder: installs what is missing, builds once, runs every rung, prints a summary, and
/// fails when any rung failed.
pub fn run(opts: &TestArm) -> Result<()> {
    let start = Instant::now();
    let rungs = selected_rungs(&opts.rungs)?;
    ensure_toolchain(opts.no_install)?;
    let target_dir = project_root().join("target").join("aarch64-qemu");

    banner("aarch64: building the tests (static, Debian rustc-web)");
    let build_start = Instant::now();
    let mut binaries = build_tests(&target_dir)?;
    let probe = build_probe(&target_dir)?;
    find_feature_reports(&mut binaries, opts.timeout)?;
    let build_time = build_start.elapsed();
    println!(
        "built {} test binaries and the CPU probe in {}",
        binaries.len(),
        fmt_duration(build_time)
    );
    for ArmBinary { binary, .. } in &binaries {
        println!("  {}: {}", binary.label, binary.exe.display());
    }

    let mut reports = Vec::new();
    for (i, rung) in rungs.iter().enumerate() {
        banner(&format!(
            "aarch64 rung {}/{}: QEMU_CPU={} (expects {})",
            i + 1,
            rungs.len(),
            rung.cpu,
            rung.isa
        ));
        reports.push(run_rung(*rung, &probe, &binaries, opts)?);
    }

    print_summary(&reports, build_time, start.elapsed());
    let failed: Vec<&str> = reports
        .iter()
        .filter(|r| !r.problems.is_empty())
        .map(|r| r.rung.cpu)
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("aarch64 rungs failed: {}", failed.join(", ")).into())
    }
}

fn selected_rungs(names: &[String]) -> Result<Vec<Rung>> {
    if names.is_empty() {
        return Ok(RUNGS.to_vec());
    }
    names
        .iter()
        .map(|name| {
            RUNGS
                .iter()
                .copied()
                .find(|r| r.cpu == name)
                .ok_or_else(|| {
                    let known: Vec<&str> = RUNGS.iter().map(|r| r.cpu).collect();
                    format!("unknown rung {name:?}; the rungs are {}", known.join(", ")).into()
                })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Toolchain: check, and install with apt when something is missing.

/// Checks that every tool of the cross build is present, installing the Debian packages when not.
pub(crate) fn ensure_toolchain(no_install: bool) -> Result<()> {
    let missing = missing_tools();
    if missing.is_empty() {
        println!("aarch64 toolchain present: {DEBIAN_RUSTC}, {LINKER}, {QEMU}");
        return Ok(());
    }
    println!("aarch64 toolchain incomplete:");
    for problem in &missing {
        println!("  - {problem}");
    }
    if no_install {
        return Err(format!(
            "missing aarch64 tools and --no-install was given; install them with:\n  \
             dpkg --add-architecture arm64 && apt-get update && apt-get install -y {}",
            PACKAGES.join(" ")
        )
        .into());
    }
    install_packages()?;
    let still_missing = missing_tools();
    if still_missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "after installing {}, still missing:\n  - {}",
            PACKAGES.join(" "),
            still_missing.join("\n  - ")
        )
        .into())
    }
}

/// Describes each missing piece (empty when the toolchain is complete).
fn missing_tools() -> Vec<String> {
    let mut missing = Vec::new();
    if Path::new(DEBIAN_RUSTC).is_file() {
        match aarch64_std_dir() {
            Some(dir) if has_std_rlib(&dir) => {}
            Some(dir) => missing.push(format!(
                "aarch64 standard library in {} (package libstd-rust-web-dev:arm64)",
                dir.display()
            )),
            None => missing.push(format!("a working {DEBIAN_RUSTC} (package rustc-web)")),
        }
    } else {
        missing.push(format!("{DEBIAN_RUSTC} (package rustc-web)"));
    }
    if find_on_path(LINKER).is_none() {
        missing.push(format!("{LINKER} (package gcc-aarch64-linux-gnu)"));
    } else if !static_libc_present() {
        missing.push("static aarch64 libc, libc.a (package libc6-dev-arm64-cross)".to_string());
    }
    if find_on_path(QEMU).is_none() {
        missing.push(format!("{QEMU} (package qemu-user)"));
    }
    missing
}

/// `<sysroot of Debian's rustc>/lib/rustlib/aarch64-unknown-linux-gnu/lib`.
fn aarch64_std_dir() -> Option<PathBuf> {
    let sysroot = Cmd::new(DEBIAN_RUSTC)
        .args(["--print", "sysroot"])
        .read_stdout()
        .ok()?;
    Some(
        Path::new(sysroot.trim())
            .join("lib/rustlib")
            .join(TARGET)
            .join("lib"),
    )
}

fn has_std_rlib(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.filter_map(|e| e.ok()).any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("libstd-") && name.ends_with(".rlib")
        })
    })
}

/// Whether the cross gcc finds a static libc (it prints a bare name when it does not).
fn static_libc_present() -> bool {
    Cmd::new(LINKER)
        .arg("-print-file-name=libc.a")
        .read_stdout()
        .is_ok_and(|path| Path::new(path.trim()).is_absolute())
}

pub(crate) fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Enables arm64 packages and installs [`PACKAGES`] with apt, non-interactively.
fn install_packages() -> Result<()> {
    banner("aarch64: installing Debian packages");
    let sudo = if is_root() {
        None
    } else if find_on_path("sudo").is_some() {
        Some("sudo")
    } else {
        return Err(
            "installing packages needs root (or sudo); rerun as root, or install \
                    them yourself (see `cargo xtask help`)"
                .into(),
        );
    };
    let privileged = |program: &str| match sudo {
        Some(sudo) => Cmd::new(sudo).args(["-n", program]),
        None => Cmd::new(program),
    };
    let apt_limit = Duration::from_secs(30 * 60);

    let foreign = Cmd::new("dpkg")
        .arg("--print-foreign-architectures")
        .read_stdout()?;
    if !foreign.lines().any(|arch| arch.trim() == "arm64") {
        privileged("dpkg")
            .args(["--add-architecture", "arm64"])
            .run()?;
    }
    let apt_get = |args: &[&str]| {
        privileged("apt-get")
            .args(["-q", "-o", "DPkg::Lock::Timeout=600"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .timeout(apt_limit)
    };
    // A failing third-party source makes `update` exit non-zero while Debian's own lists are
    // fine; the install below reports a real problem clearly, so only warn here.
    if let Err(e) = apt_get(&["update"]).run() {
        eprintln!("warning: {e}; trying the install anyway");
    }
    apt_get(&["install", "-y", "--no-install-recommends"])
        .args(PACKAGES)
        .run()
}

/// Whether the effective user is root, read from /proc (std has no geteuid).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
            .unwrap_or(false)
    })
}

// ---------------------------------------------------------------------------------------------
// Building.

/// The cargo invocation shared by the build: Debian's rustc, our own target dir, static linking,
/// and host flags that must not leak into the aarch64 build removed. Debug info is cut to line
/// tables (enough for backtraces), which makes the large static test binaries quicker to link.
fn cross_cargo(target_dir: &Path) -> Cmd {
    Cmd::cargo(["test", "--no-run", "--target", TARGET])
        .env("RUSTC", DEBIAN_RUSTC)
        .env("CARGO_PROFILE_TEST_DEBUG", "line-tables-only")
        .env("CARGO_PROFILE_DEV_DEBUG", "line-tables-only")
        .env("CARGO_TARGET_DIR", target_dir)
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", LINKER)
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            TARGET_RUSTFLAGS,
        )
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER", QEMU)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
}

/// Builds the unit and integration tests of the library crates and returns their executables.
fn build_tests(target_dir: &Path) -> Result<Vec<ArmBinary>> {
    let mut cmd = cross_cargo(target_dir).args(["--workspace", "--lib", "--tests"]);
    for package in EXCLUDED_PACKAGES {
        cmd = cmd.args(["--exclude", package]);
    }
    let binaries = test_binaries::build(cmd)?;
    Ok(binaries
        .into_iter()
        .map(|binary| ArmBinary {
            binary,
            feature_report: None,
        })
        .collect())
}

/// The probe's source: one line of `name=yes|no` pairs.
const PROBE_SOURCE: &str = r#"//! Prints the aarch64 features std detects at run time (written by `cargo xtask test-arm`).
fn main() {
    let detected = [
        ("neon", std::arch::is_aarch64_feature_detected!("neon")),
        ("dotprod", std::arch::is_aarch64_feature_detected!("dotprod")),
        ("i8mm", std::arch::is_aarch64_feature_detected!("i8mm")),
        ("sve", std::arch::is_aarch64_feature_detected!("sve")),
    ];
    let words: Vec<String> = detected
        .iter()
        .map(|(name, on)| format!("{name}={}", if *on { "yes" } else { "no" }))
        .collect();
    println!("{}", words.join(" "));
}
"#;

/// Compiles the feature probe (only when its source changed or the binary is missing).
fn build_probe(target_dir: &Path) -> Result<PathBuf> {
    let dir = target_dir.join("cpu-probe");
    std::fs::create_dir_all(&dir)?;
    let source = dir.join("cpu_probe.rs");
    let exe = dir.join("cpu_probe");
    let fresh = exe.is_file()
        && std::fs::read_to_string(&source).is_ok_and(|existing| existing == PROBE_SOURCE);
    if fresh {
        return Ok(exe);
    }
    std::fs::write(&source, PROBE_SOURCE)?;
    Cmd::new(DEBIAN_RUSTC)
        .args(["--edition", "2021", "--target", TARGET, "-O"])
        .arg(format!("-Clinker={LINKER}"))
        .args(TARGET_RUSTFLAGS.split_whitespace())
        .arg("-o")
        .arg(&exe)
        .arg(&source)
        .run()?;
    Ok(exe)
}

/// Lists each binary's tests once (the list does not depend on the CPU) to find the optional
/// feature-report test.
fn find_feature_reports(binaries: &mut [ArmBinary], limit: Duration) -> Result<()> {
    for ArmBinary {
        binary,
        feature_report,
    } in binaries
    {
        let listing = Cmd::new(QEMU)
            .arg(&binary.exe)
            .args(["--list", "--format", "terse"])
            .env("QEMU_CPU", RUNGS[0].cpu)
            .cwd(&binary.package_dir)
            .timeout(limit)
            .read_stdout()?;
        *feature_report = listing
            .lines()
            .filter_map(|line| line.strip_suffix(": test"))
            .find(|name| name.rsplit("::").next() == Some(FEATURE_REPORT_TEST))
            .map(str::to_owned);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Running.

/// Runs the probe and then every test binary under one CPU model.
fn run_rung(
    rung: Rung,
    probe: &Path,
    binaries: &[ArmBinary],
    opts: &TestArm,
) -> Result<RungReport> {
    let start = Instant::now();
    let mut report = RungReport {
        rung,
        features: String::from("?"),
        passed: 0,
        failed: 0,
        ignored: 0,
        problems: Vec::new(),
        elapsed: Duration::ZERO,
    };
    let prefix = format!("[{}] ", rung.cpu);
    let qemu = |exe: &Path| {
        Cmd::new(QEMU)
            .arg(exe)
            .env("QEMU_CPU", rung.cpu)
            .env("MOE_QEMU", "1")
            .env("MOE_EXPECT_ISA", rung.isa)
            .timeout(opts.timeout)
    };

    let (outcome, text) = qemu(probe).run_tee(&format!("{prefix}probe: "))?;
    match (outcome.success(), Features::parse(&text)) {
        (true, Some(features)) => {
            report.features = features.to_string();
            let best = features.best_isa();
            if best != rung.isa {
                report.problems.push(format!(
                    "QEMU_CPU={} offers {best}, but the rung is meant to test {}",
                    rung.cpu, rung.isa
                ));
            }
        }
        _ => report
            .problems
            .push(format!("CPU probe failed: {}", outcome.describe())),
    }

    for ArmBinary {
        binary,
        feature_report,
    } in binaries
    {
        if let Some(test) = feature_report {
            let cmd = qemu(&binary.exe)
                .args([test.as_str(), "--exact", "--nocapture"])
                .cwd(&binary.package_dir);
            let (outcome, _) = cmd.run_tee(&prefix)?;
            if !outcome.success() {
                report
                    .problems
                    .push(format!("{} {test}: {}", binary.label, outcome.describe()));
            }
        }
    }

    for ArmBinary { binary, .. } in binaries {
        println!("{prefix}--- {}", binary.label);
        let cmd = qemu(&binary.exe)
            .args(&opts.test_args)
            .cwd(&binary.package_dir);
        let (outcome, text) = cmd.run_tee(&prefix)?;
        let counts = TestCounts::parse(&text);
        report.passed += counts.passed;
        report.failed += counts.failed;
        report.ignored += counts.ignored;
        if !outcome.success() {
            report
                .problems
                .push(format!("{}: {}", binary.label, outcome.describe()));
        } else if !counts.seen {
            report.problems.push(format!(
                "{}: no libtest summary in its output",
                binary.label
            ));
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

/// The probe's answer.
#[derive(Debug, Default, PartialEq)]
struct Features {
    neon: bool,
    dotprod: bool,
    i8mm: bool,
    sve: bool,
}

impl Features {
    /// Parses `neon=yes dotprod=no i8mm=no sve=no`.
    fn parse(text: &str) -> Option<Self> {
        let mut features = Features::default();
        let mut seen = 0;
        for word in text.split_whitespace() {
            let (name, value) = word.split_once('=')?;
            let on = match value {
                "yes" => true,
                "no" => false,
                _ => return None,
            };
            match name {
                "neon" => features.neon = on,
                "dotprod" => features.dotprod = on,
                "i8mm" => features.i8mm = on,
                "sve" => features.sve = on,
                _ => continue,
            }
            seen += 1;
        }
        (seen == 4).then_some(features)
    }

    /// The highest rung of our ISA ladder these features allow.
    fn best_isa(&self) -> &'static str {
        match (self.neon, self.dotprod, self.i8mm) {
            (true, true, true) => "i8mm",
            (true, true, false) => "dotprod",
            (true, false, _) => "neon",
            (false, ..) => "none",
        }
    }
}

impl std::fmt::Display for Features {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sign = |on: bool| if on { '+' } else { '-' };
        write!(
            f,
            "{}neon {}dotprod {}i8mm {}sve",
            sign(self.neon),
            sign(self.dotprod),
            sign(self.i8mm),
            sign(self.sve)
        )
    }
}

fn print_summary(reports: &[RungReport], build_time: Duration, total: Duration) {
    banner("aarch64 summary");
    println!(
        "{:<12} {:<8} {:<38} {:>6} {:>6} {:>7} {:>8}  result",
        "QEMU_CPU",
        "expects",
        "features (is_aarch64_feature_detected)",
        "passed",
        "failed",
        "ignored",
        "time"
    );
    for r in reports {
        let result = if r.problems.is_empty() {
            "ok"
        } else {
            "FAILED"
        };
        println!(
            "{:<12} {:<8} {:<38} {:>6} {:>6} {:>7} {:>8}  {result}",
            r.rung.cpu,
            r.rung.isa,
            r.features,
            r.passed,
            r.failed,
            r.ignored,
            fmt_duration(r.elapsed)
        );
    }
    for r in reports {
        for problem in &r.problems {
            println!("  {}: {problem}", r.rung.cpu);
        }
    }
    println!(
        "build {}, total {}",
        fmt_duration(build_time),
        fmt_duration(total)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_output_maps_to_the_ladder() {
        let a53 = Features::parse("neon=yes dotprod=no i8mm=no sve=no\n").unwrap();
        assert_eq!(a53.best_isa(), "neon");
        let max = Features::parse("neon=yes dotprod=yes i8mm=yes sve=yes").unwrap();
        assert_eq!(max.best_isa(), "i8mm");
        assert_eq!(max.to_string(), "+neon +dotprod +i8mm +sve");
        assert_eq!(Features::parse("neon=yes"), None);
    }

    #[test]
    fn rung_names_are_checked() {
        assert_eq!(selected_rungs(&[]).unwrap().len(), 3);
        assert_eq!(selected_rungs(&["max".into()]).unwrap()[0].isa, "i8mm");
        assert!(selected_rungs(&["cortex-a72".into()]).is_err());
    }
}
