//! Test support shared by the moe-rs crates: the golden-vector harness, a seeded generator and
//! the case-count knob for property tests.
//!
//! Golden vectors are safetensors files produced by vLLM and PyTorch, one case per file, in
//! `<goldens>/<area>/`. The goldens directory is `$MOE_GOLDENS` when set, otherwise
//! `../shared/goldens` relative to the workspace root. Nothing here is part of a public API: it
//! panics freely, because a failing test should.

#![forbid(unsafe_code)]

mod golden;
pub mod gpt_oss;
mod rng;

pub use golden::{GoldenCase, fixtures_dir, for_each_golden_case, goldens_dir, workspace_root};
pub use rng::SplitMix64;

/// Number of randomized cases a property test should run.
///
/// Reads `MOE_PROPTEST_CASES` so CI can raise it; defaults to `default`, divided by 8 (at least 1)
/// under Miri or when `MOE_QEMU` is set (emulated aarch64), where every case is slow.
pub fn proptest_cases(default: u32) -> u32 {
    if let Some(n) = std::env::var("MOE_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        return n.max(1);
    }
    if cfg!(miri) || std::env::var_os("MOE_QEMU").is_some() {
        (default / 8).max(1)
    } else {
        default
    }
}
