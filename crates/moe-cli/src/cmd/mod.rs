//! The subcommands of `moe`, one module each, plus what they share: the error type, the
//! `--json` output switch, progress bars, number parsing and the thread pool.
//!
//! - [`cpu`], [`demo`], [`inspect`], [`bench`](mod@bench), [`run`], [`repack_marlin`]: the commands.
//! - [`backend`]: the oracle's view of this machine and its answer for a layer.
//! - [`plot`]: benchmark rows drawn as an SVG chart (`moe bench --plot`).
//! - [`synth`]: seeded random weights, quantized and packed into a [`moe_kernels::FusedMoe`].
//! - [`reference`](mod@reference): the f32 MoE on dequantized weights that the demo checks against.

pub mod backend;
pub mod bench;
mod bench_layer;
pub mod cpu;
pub mod demo;
pub mod inspect;
pub mod plot;
pub mod reference;
pub mod repack_marlin;
pub mod run;
pub mod synth;

use std::fmt;
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A command's failure, as one message for stderr.
#[derive(Debug)]
pub struct CliError(pub String);

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl CliError {
    /// A failure with context: `"{what}: {err}"`.
    pub fn context(what: impl fmt::Display, err: impl fmt::Display) -> Self {
        Self(format!("{what}: {err}"))
    }
}

/// Where and how a command prints.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// JSON on stdout instead of the human report (and no progress bars).
    pub json: bool,
}

impl Output {
    /// Prints `value` as pretty JSON on stdout.
    pub fn print_json<T: serde::Serialize>(&self, value: &T) -> Result<(), CliError> {
        let text = serde_json::to_string_pretty(value)
            .map_err(|e| CliError::context("serializing the report", e))?;
        println!("{text}");
        Ok(())
    }

    /// A progress bar of `len` steps on stderr, hidden with `--json` or when stderr is not a
    /// terminal (so logs and pipes stay clean).
    pub fn progress(&self, len: u64, message: &str) -> ProgressBar {
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        if self.json || !std::io::stderr().is_terminal() {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        if let Ok(style) =
            ProgressStyle::with_template("{msg:<28} [{bar:30}] {pos}/{len} {elapsed_precise}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(message.to_string());
        bar
    }
}

/// The default thread count: the machine's available parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// A rayon pool of `threads` threads (0 = available parallelism); never the global pool.
pub fn thread_pool(threads: usize) -> Result<rayon::ThreadPool, CliError> {
    let n = if threads == 0 {
        default_threads()
    } else {
        threads
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("moe-{i}"))
        .build()
        .map_err(|e| CliError::context("building the thread pool", e))
}

/// Parses a byte count with an optional binary suffix: `1024`, `256M`, `2G`, `512KiB`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count (e.g. 256M, 2G)"))?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => return Err(format!("unknown size suffix {other:?} (use K, M or G)")),
    };
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} overflows"))
}

/// Parses `--wna16-activations`: `float` (the checkpoint's numerics) or `int8` (dynamic
/// per-token int8 activations on the W4A8 kernels).
pub fn parse_wna16_activations(text: &str) -> Result<moe_layer::Wna16Activations, String> {
    match text {
        "float" => Ok(moe_layer::Wna16Activations::Float),
        "int8" => Ok(moe_layer::Wna16Activations::DynamicInt8),
        other => Err(format!("expected `float` or `int8`, not {other:?}")),
    }
}

/// Parses `--w4a8-prefill`: `int8`, `bf16` or `int8-channel` ([`moe_layer::W4A8Prefill`]).
pub fn parse_w4a8_prefill(text: &str) -> Result<moe_layer::W4A8Prefill, String> {
    moe_layer::W4A8Prefill::from_name(text)
        .ok_or_else(|| format!("unknown W4A8 prefill {text:?}: use int8, bf16 or int8-channel"))
}

/// The median of a set of durations, in milliseconds (0 for an empty set).
pub fn median_ms(samples: &mut [Duration]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_unstable();
    let mid = samples.len() / 2;
    let d = if samples.len() % 2 == 1 {
        samples[mid]
    } else {
        (samples[mid - 1] + samples[mid]) / 2
    };
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse_with_binary_suffixes() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("256M"), Ok(256 << 20));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("").is_err());
    }

    #[test]
    fn median_of_even_and_odd_sets() {
        let ms = Duration::from_millis;
        assert_eq!(median_ms(&mut [ms(3), ms(1), ms(2)]), 2.0);
        assert_eq!(median_ms(&mut [ms(4), ms(1), ms(2), ms(3)]), 2.5);
        assert_eq!(median_ms(&mut []), 0.0);
    }
}
