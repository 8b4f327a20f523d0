//! `cargo xtask miri`: runs the scalar kernels, packers and quantizers under Miri (nightly),
//! which checks the unsafe code they reach and every arithmetic overflow for undefined
//! behaviour.
//!
//! Only the scalar rung runs (`MOE_KERNELS_MAX_ISA=scalar`; Miri does not emulate AVX-512 and
//! reports no SIMD features, so no SIMD rung is selected either). The selected tests use small
//! shapes; the shape lists of the kernel tests shrink under `cfg(miri)`. The miri component is
//! installed with `rustup +nightly component add miri rust-src` when absent.

use crate::fuzz::nightly_cargo;
use crate::util::{Result, banner};

/// `(package, test filters)` run under Miri; an empty filter list runs the package's whole
/// library test suite. Adding a test (for example the Marlin repack) is one line here.
pub const MIRI_TESTS: &[(&str, &[&str])] = &[
    ("moe-quant", &[]),
    (
        "moe-kernels",
        &[
            "packed::",
            "isa::",
            "marlin::",
            "tests::bad_gemm_arguments_are_typed_errors",
            // The rung-comparing GEMM tests reach CPU detection (inline assembly, which Miri
            // cannot run); they join this list once detection is skipped under cfg(miri).
        ],
    ),
];

/// Runs every entry of [`MIRI_TESTS`].
pub fn run() -> Result<()> {
    ensure_miri()?;
    for (package, filters) in MIRI_TESTS {
        let runs: Vec<Option<&str>> = if filters.is_empty() {
            vec![None]
        } else {
            filters.iter().copied().map(Some).collect()
        };
        for filter in runs {
            banner(&format!(
                "miri: {package} {}",
                filter.unwrap_or("(all library tests)")
            ));
            let mut args = vec![
                "+nightly",
                "miri",
                "test",
                "-p",
                package,
                "--lib",
                "--target-dir",
                "target/miri",
            ];
            if let Some(f) = filter {
                args.extend(["--", f]);
            }
            nightly_cargo(args)
                .env("MOE_KERNELS_MAX_ISA", "scalar")
                .env("MOE_PROPTEST_CASES", "4")
                .run()?;
        }
    }
    Ok(())
}

/// Checks for the miri component, adding it (with rust-src, which Miri builds std from) when it
/// is missing.
fn ensure_miri() -> Result<()> {
    if nightly_cargo(["+nightly", "miri", "--version"])
        .read_stdout()
        .is_ok()
    {
        return Ok(());
    }
    banner("miri: installing the nightly miri component");
    crate::util::Cmd::new("rustup")
        .args(["+nightly", "component", "add", "miri", "rust-src"])
        .run()
}
