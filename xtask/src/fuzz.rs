//! `cargo xtask fuzz --seconds N`: replays the committed fuzz inputs, then runs every cargo-fuzz
//! target of `fuzz/` for `N` seconds on nightly.
//!
//! The replay (`cargo test` of the fuzz package's library on the pinned toolchain) runs each
//! input under `fuzz/seeds/<target>` and `fuzz/regressions/<target>`, so a fixed finding stays
//! fixed even where nightly is missing. The fuzzing itself needs nightly and cargo-fuzz; both
//! are checked, and cargo-fuzz is installed with `cargo install cargo-fuzz --locked` when
//! absent. New corpus entries go to `target/fuzz/corpus/<target>` and crashes to
//! `target/fuzz/artifacts/<target>/`; neither is committed (copy a crash into
//! `fuzz/regressions/<target>/` once it is fixed).

use crate::flags::Fuzz;
use crate::util::{Cmd, Result, banner};

/// The fuzz targets (`[[bin]]`s of fuzz/Cargo.toml). Adding a target is one line here.
pub const FUZZ_TARGETS: &[&str] = &["checkpoint_loader", "config_parser", "packers", "marlin"];

/// Replays the committed inputs, then fuzzes each selected target.
pub fn run(opts: &Fuzz) -> Result<()> {
    banner("fuzz: replay committed seeds and regressions");
    Cmd::cargo(["test", "--manifest-path", "fuzz/Cargo.toml", "--lib"]).run()?;
    ensure_cargo_fuzz()?;
    let targets: Vec<&str> = if opts.targets.is_empty() {
        FUZZ_TARGETS.to_vec()
    } else {
        opts.targets.iter().map(String::as_str).collect()
    };
    for target in targets {
        if !FUZZ_TARGETS.contains(&target) {
            return Err(format!("unknown fuzz target {target:?}; known: {FUZZ_TARGETS:?}").into());
        }
        banner(&format!("fuzz: {target} for {} s", opts.seconds));
        let corpus = format!("target/fuzz/corpus/{target}");
        let artifacts = format!("target/fuzz/artifacts/{target}/");
        std::fs::create_dir_all(&corpus)?;
        std::fs::create_dir_all(&artifacts)?;
        let mut args = vec![
            "+nightly".to_string(),
            "fuzz".into(),
            "run".into(),
            // Debug assertions (and so overflow checks) on, as in the test profile.
            "--debug-assertions".into(),
            "--target-dir".into(),
            "target/fuzz/build".into(),
            target.into(),
            corpus,
        ];
        for dir in ["fuzz/seeds", "fuzz/regressions"] {
            let path = format!("{dir}/{target}");
            if std::path::Path::new(&path).is_dir() {
                args.push(path);
            }
        }
        args.extend([
            "--".into(),
            format!("-max_total_time={}", opts.seconds),
            format!("-artifact_prefix={artifacts}"),
            "-rss_limit_mb=2048".into(),
            "-print_final_stats=1".into(),
        ]);
        nightly_cargo(args).run()?;
    }
    Ok(())
}

/// `cargo` through rustup with the variables the outer (pinned) cargo set removed, so that
/// `+nightly` picks the nightly toolchain.
pub fn nightly_cargo<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> Cmd {
    Cmd::new("cargo")
        .args(args)
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("RUSTC_WRAPPER")
}

/// Checks for nightly and cargo-fuzz, installing cargo-fuzz when it is missing.
fn ensure_cargo_fuzz() -> Result<()> {
    if nightly_cargo(["+nightly", "--version"])
        .read_stdout()
        .is_err()
    {
        return Err("the nightly toolchain is missing (rustup toolchain install nightly)".into());
    }
    if nightly_cargo(["+nightly", "fuzz", "--version"])
        .read_stdout()
        .is_ok()
    {
        return Ok(());
    }
    banner("fuzz: installing cargo-fuzz");
    Cmd::cargo(["install", "cargo-fuzz", "--locked"]).run()
}
