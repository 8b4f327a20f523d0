//! The `moe` command: reports the CPU (`moe cpu`), runs a demonstration MoE layer end to end
//! (`moe demo`), describes a checkpoint and the backend that would serve it (`moe inspect`),
//! measures a MoE layer in each weight format on the standard model shapes (`moe bench`: the
//! road a runtime takes through `MoeLayer`, or the fused experts alone), and converts
//! WNA16 checkpoints to vLLM's Marlin layout (`moe repack-marlin`).
//!
//! Every command takes `--json` (machine-readable output on stdout). Logs go to stderr through
//! `tracing` (`RUST_LOG=debug` shows the oracle's refusals and the kernel choice). Exit codes:
//! 0 success, 1 the command failed (message on stderr), 2 bad command-line usage. When the
//! reader of stdout goes away (`moe cpu | head -3`), the process ends quietly by SIGPIPE, as
//! other Unix tools do.

// One fenced exception: restoring SIGPIPE's default action (`default_sigpipe`).
#![deny(unsafe_code)]

mod cmd;

use clap::{Parser, Subcommand};

use cmd::{CliError, Output};

/// Run, benchmark and inspect quantized Mixture-of-Experts layers on this CPU.
#[derive(Debug, Parser)]
#[command(name = "moe", version, about)]
struct Cli {
    /// Print machine-readable JSON on stdout instead of the human report.
    #[arg(long, global = true)]
    json: bool,
    /// The command (default: `cpu`).
    #[command(subcommand)]
    command: Option<Command>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Report the CPU features, the ISA ladder and the kernels the dispatcher selects.
    Cpu(cmd::cpu::CpuArgs),
    /// Run a Qwen3-30B-A3B-shaped MoE layer (random weights, W4A8) and check it against f32.
    Demo(cmd::demo::DemoArgs),
    /// Describe a checkpoint directory and the backend that would serve it.
    Inspect(cmd::inspect::InspectArgs),
    /// Time a MoE layer (the road a runtime takes, or the fused experts alone) on standard
    /// shapes in each weight format, with weights beyond the caches.
    Bench(cmd::bench::BenchArgs),
    /// Run one MoE block (router + experts) of a checkpoint on hidden states from a file.
    Run(cmd::run::RunArgs),
    /// Convert a GPTQ or compressed-tensors WNA16 checkpoint into a Marlin-packed one.
    RepackMarlin(cmd::repack_marlin::RepackMarlinArgs),
}

fn main() {
    default_sigpipe();
    init_tracing();
    let cli = Cli::parse();
    let out = Output { json: cli.json };
    let result: Result<(), CliError> = match cli.command {
        None => cmd::cpu::run(&cmd::cpu::CpuArgs::default(), out),
        Some(Command::Cpu(args)) => cmd::cpu::run(&args, out),
        Some(Command::Demo(args)) => cmd::demo::run(&args, out),
        Some(Command::Inspect(args)) => cmd::inspect::run(&args, out),
        Some(Command::Bench(args)) => cmd::bench::run(&args, out),
        Some(Command::RepackMarlin(args)) => cmd::repack_marlin::run(&args, out),
        Some(Command::Run(mut args)) => {
            args.json = out.json;
            cmd::run::run(&args)
                .map(|_| ())
                .map_err(|e| CliError(e.to_string()))
        }
    };
    if let Err(e) = result {
        eprintln!("moe: error: {e}");
        std::process::exit(1);
    }
}

/// Restores the default action of SIGPIPE, which the Rust runtime sets to "ignore" before
/// `main`: a write to a closed pipe then ends the process instead of failing, and `println!`
/// would turn that failure into a panic with a backtrace.
#[cfg(unix)]
#[allow(unsafe_code)]
fn default_sigpipe() {
    // SAFETY: `signal` with `SIG_DFL` installs no handler (no code of ours runs in signal
    // context) and only changes the disposition of SIGPIPE; it runs first in `main`, before
    // any other thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// Elsewhere there is no SIGPIPE to restore.
#[cfg(not(unix))]
fn default_sigpipe() {}

/// Logs to stderr, filtered by `RUST_LOG` (warnings only by default).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // A second subscriber can only come from a test harness; keep the first.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
