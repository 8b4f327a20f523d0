//! Command-line parsing for xtask: a hand-written parser over the few flags we have, so xtask
//! needs no dependency.

use std::path::PathBuf;
use std::time::Duration;

/// The text `cargo xtask help` prints.
pub const HELP: &str = "\
cargo xtask <command> [options]

Commands:
  test-arm [--rung <cpu>]... [--no-install] [--timeout-minutes <n>] [-- <test args>]
      Build the library crates' tests for aarch64-unknown-linux-gnu (static, with Debian's
      rustc-web) and run every test binary under qemu-aarch64 once per CPU rung:
      cortex-a53 (neon), neoverse-n1 (dotprod), max (i8mm). Installs the Debian packages it
      needs when they are missing (needs root or passwordless sudo).
        --rung <cpu>            run only this rung (repeatable)
        --no-install            fail instead of installing missing packages
        --timeout-minutes <n>   limit for each QEMU run (default 20)
  test-x86-ladder [-- <test args>]
      Run the moe-kernels tests natively with MOE_KERNELS_MAX_ISA capped to avx512-vnni,
      avx-vnni, avx2 and scalar (rungs the host lacks are skipped).
  codegen [--check]
      Regenerate the committed generated files (the C header crates/moe-capi/include/moe.h,
      with cbindgen). --check only reports stale files, as the test does.
  fuzz [--seconds <n>] [--target <name>]...
      Replay the committed fuzz seeds and regressions (fuzz/), then run each cargo-fuzz
      target on nightly for n seconds (default 60): checkpoint_loader, config_parser,
      packers, marlin. Installs cargo-fuzz when missing.
  miri
      Run the scalar kernels', packers' and quantizers' tests under Miri on nightly
      (MOE_KERNELS_MAX_ISA=scalar). Installs the miri component when missing.
  bench-peers [--quick] [--venv <dir>] [--kt-venv <dir>] [--llama-dir <dir>]
              [--shared <dir>] [--shape <name,...>] [--batch-sizes <m,...>] [--threads <n>]
              [--rounds <n>] [--iters <n>] [--paths <path,...>] [--out <file.json>]
              [--render <file.json>] [--plot <file.svg>]
      Time `moe bench` (our W4A8 group-32 layer; its `experts` rows, routing precomputed) and
      three peers back to back on the same
      shapes, batch sizes and thread count, alternating ours and the peers round by round, and
      print one table of medians: ours, the DRAM bound, the W4A8 target, each peer path and
      peer/ours. The peers: vLLM's CPU MoE kernels (<shared>/peers/bench_vllm_cpu.py in a venv
      from <shared>/peers/setup_venv.sh), KTransformers' KT-Kernel
      (<shared>/peers/bench_kt_kernel.py in a venv from <shared>/peers/setup_venv_kt.sh) and
      llama.cpp's MUL_MAT_ID (xtask/peers/llama_mul_mat_id.c against a ggml built from the
      llama-cpp-python sdist). Each is installed when missing (~5 min and ~7 GB per venv, ~5
      min for ggml); a peer that does not install or run is a row saying why. Slow, and not
      part of `ci`.
        --quick                 qwen3-30b-a3b only, M = 1,16, fewer peer paths
        --venv <dir>            the vLLM venv (default /opt/peers/venv)
        --kt-venv <dir>         the KT-Kernel venv (default /opt/peers/venv-kt)
        --llama-dir <dir>       llama.cpp's sdist and ggml build (default /opt/peers/llama)
        --shared <dir>          the shared folder (default $MOE_SHARED, else ../shared)
        --shape <names>         moe bench shapes (default: all three standard shapes)
        --batch-sizes <list>    tokens per call (default 1,16,256,1024)
        --threads <n>           threads for both sides (default 2)
        --rounds <n>            alternations of ours and the peer per shape (default 2)
        --iters <n>             timed calls per moe bench row (default 20)
        --paths <list>          peer paths: vLLM's by name (int4_amx_g32, int4_amx_g128,
                                int4_amx_ch, int8_w8a8, bf16_vec), kt:<path> (amx_int4,
                                amx_int8, amx_bf16, rawint4_g32), llama:<type> (q4_0, q8_0);
                                default all but int4_amx_ch, bf16_vec, kt:amx_bf16 and
                                kt:rawint4_g32 (--quick: int4_amx_g32, int8_w8a8,
                                kt:amx_int4, llama:q4_0), plus bf16_vec on x86 without
                                AVX-512, where vLLM's build has no other MoE kernel
        --out <file.json>       also write every raw report and the table as JSON
        --render <file.json>    print the table of an earlier run's --out file and exit
        --plot <file.svg>       also draw the table: ms per call against M on log axes, one
                                panel per shape, one line per side, the DRAM bound dashed
  arm-cost [--kleidiai <dir>] [--mca <llvm-mca>]... [--cpus <cpu,...>] [--asm <file.s>]
           [--no-install] [--write-doc]
      Compile our aarch64 tile bodies to assembly (Debian's rustc-web, as test-arm) and
      KleidiAI's matching W4A8/W8A8 micro-kernels with aarch64-linux-gnu-gcc, find each
      tile's inner loop by its backward branch, and print llvm-mca's cycles and MACs per
      cycle per core model, ours beside KleidiAI's. Static and the same on any host; no Arm
      machine or emulator runs anything.
        --kleidiai <dir>        root of a KleidiAI source checkout (default $KLEIDIAI_DIR;
                                without one only our loops are modelled). It is not part of
                                this repository: clone ARM-software/kleidiai from GitHub.
        --mca <llvm-mca>        the llvm-mca to run, repeatable (default llvm-mca-14, Debian's
                                llvm-14; llvm-mca-16 from llvm-16 has a Neoverse N2 model)
        --cpus <list>           core models (default neoverse-n1,neoverse-n2,neoverse-v1)
        --asm <file.s>          model this moe-kernels assembly (an earlier build's
                                target/arm-cost/.../moe_kernels-*.s) instead of building one
        --no-install            fail instead of installing missing cross-build packages
        --write-doc             also write the table into docs/performance.md (aarch64)
  ci
      Run the CI sequence (what .ci/run runs), stopping at the first failure: fmt check,
      clippy, cargo doc (-D warnings), moe-kernels and moe-layer without default features,
      cargo package --list of the library crates, cargo test --workspace, test-x86-ladder,
      test-arm, cargo test --workspace again with RAYON_NUM_THREADS=1, fuzz --seconds 20
      (miri is run by hand).
  help
      Print this text.";

/// A parsed xtask invocation.
#[derive(Debug)]
pub enum Command {
    /// Print the help text.
    Help,
    /// Run the aarch64 ladder under QEMU.
    TestArm(TestArm),
    /// Run the moe-kernels tests under each x86 ISA cap.
    TestX86Ladder(TestX86Ladder),
    /// Regenerate (or with `true`, only check) the generated files.
    Codegen {
        /// Compare instead of writing.
        check: bool,
    },
    /// Replay and run the fuzz targets.
    Fuzz(Fuzz),
    /// Run the selected tests under Miri.
    Miri,
    /// Run the whole CI sequence.
    Ci,
    /// Compare `moe bench` with the vLLM, KT-Kernel and llama.cpp peers.
    BenchPeers(BenchPeers),
    /// Model the aarch64 tile loops with llvm-mca, ours beside KleidiAI's.
    ArmCost(ArmCost),
}

/// Options of `arm-cost`.
#[derive(Debug)]
pub struct ArmCost {
    /// The root of a KleidiAI checkout; `None` means `$KLEIDIAI_DIR`, else ours only.
    pub kleidiai: Option<PathBuf>,
    /// The llvm-mca binaries to run.
    pub mca: Vec<String>,
    /// The core models (`-mcpu`).
    pub cpus: Vec<String>,
    /// Model this moe-kernels assembly instead of building it.
    pub asm: Option<PathBuf>,
    /// Refuse to install missing Debian packages.
    pub no_install: bool,
    /// Write the table into docs/performance.md.
    pub write_doc: bool,
}

impl Default for ArmCost {
    fn default() -> Self {
        Self {
            kleidiai: None,
            mca: vec!["llvm-mca-14".into()],
            cpus: ["neoverse-n1", "neoverse-n2", "neoverse-v1"]
                .map(String::from)
                .to_vec(),
            asm: None,
            no_install: false,
            write_doc: false,
        }
    }
}

/// Options of `bench-peers`.
#[derive(Debug, Clone)]
pub struct BenchPeers {
    /// The short selection: one shape, two batch sizes.
    pub quick: bool,
    /// vLLM's virtual environment.
    pub venv: PathBuf,
    /// KT-Kernel's virtual environment.
    pub kt_venv: PathBuf,
    /// Where llama.cpp's source is fetched and ggml is built.
    pub llama_dir: PathBuf,
    /// The shared folder holding `peers/`; `None` means `$MOE_SHARED`, else `../shared`.
    pub shared: Option<PathBuf>,
    /// Shapes by name; empty means the default for the mode.
    pub shapes: Vec<String>,
    /// Tokens per call; empty means the default for the mode.
    pub batch_sizes: Vec<usize>,
    /// Threads for both sides.
    pub threads: usize,
    /// How many times ours and the peer alternate per shape.
    pub rounds: usize,
    /// Timed calls per `moe bench` row.
    pub iters: usize,
    /// Peer paths: `bench_vllm_cpu.py --paths` names, `kt:` + `bench_kt_kernel.py --paths`
    /// names, `llama:` + a ggml type; empty means the default for the mode.
    pub paths: Vec<String>,
    /// Where to write the merged JSON report.
    pub out: Option<PathBuf>,
    /// Print the table of this earlier `--out` report instead of measuring.
    pub render: Option<PathBuf>,
    /// Also draw the table as an SVG chart into this file.
    pub plot: Option<PathBuf>,
}

impl Default for BenchPeers {
    fn default() -> Self {
        Self {
            quick: false,
            venv: PathBuf::from("/opt/peers/venv"),
            kt_venv: PathBuf::from("/opt/peers/venv-kt"),
            llama_dir: PathBuf::from("/opt/peers/llama"),
            shared: None,
            shapes: Vec::new(),
            batch_sizes: Vec::new(),
            threads: 2,
            rounds: 2,
            iters: 20,
            paths: Vec::new(),
            out: None,
            render: None,
            plot: None,
        }
    }
}

/// Options of `fuzz`.
#[derive(Debug)]
pub struct Fuzz {
    /// Seconds of fuzzing per target.
    pub seconds: u64,
    /// Targets to run; empty means all of them.
    pub targets: Vec<String>,
}

impl Default for Fuzz {
    fn default() -> Self {
        Self {
            seconds: 60,
            targets: Vec::new(),
        }
    }
}

/// Options of `test-arm`.
#[derive(Debug)]
pub struct TestArm {
    /// QEMU CPU models to run; empty means every rung of the ladder.
    pub rungs: Vec<String>,
    /// Refuse to install missing Debian packages (report what is missing instead).
    pub no_install: bool,
    /// Upper bound for one test binary under QEMU, so a hang cannot stall CI.
    pub timeout: Duration,
    /// Extra arguments for every test binary (a filter, `--nocapture`, ...).
    pub test_args: Vec<String>,
}

impl Default for TestArm {
    fn default() -> Self {
        Self {
            rungs: Vec::new(),
            no_install: false,
            timeout: Duration::from_secs(20 * 60),
            test_args: Vec::new(),
        }
    }
}

/// Options of `test-x86-ladder`.
#[derive(Debug, Default)]
pub struct TestX86Ladder {
    /// Extra arguments for the test binaries (after cargo's `--`).
    pub test_args: Vec<String>,
}

/// Parses the arguments that follow `cargo xtask`.
pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Command, String> {
    let Some(command) = args.next() else {
        return Ok(Command::Help);
    };
    match command.as_str() {
        "help" | "--help" | "-h" => no_more_args(args, Command::Help),
        "ci" => no_more_args(args, Command::Ci),
        "codegen" => match args.next().as_deref() {
            None => Ok(Command::Codegen { check: false }),
            Some("--check") => no_more_args(args, Command::Codegen { check: true }),
            Some(other) => Err(format!("codegen: unknown option {other:?}")),
        },
        "miri" => no_more_args(args, Command::Miri),
        "fuzz" => parse_fuzz(args).map(Command::Fuzz),
        "bench-peers" => parse_bench_peers(args).map(Command::BenchPeers),
        "test-arm" => parse_test_arm(args).map(Command::TestArm),
        "arm-cost" => parse_arm_cost(args).map(Command::ArmCost),
        "test-x86-ladder" => {
            let test_args = after_double_dash(&mut args, "test-x86-ladder")?;
            Ok(Command::TestX86Ladder(TestX86Ladder { test_args }))
        }
        other => Err(format!("unknown command {other:?}")),
    }
}

fn parse_fuzz(mut args: impl Iterator<Item = String>) -> Result<Fuzz, String> {
    let mut opts = Fuzz::default();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                let raw = value_of(&mut args, "--seconds")?;
                opts.seconds = raw
                    .parse()
                    .map_err(|_| format!("--seconds wants a whole number, got {raw:?}"))?;
            }
            "--target" => opts.targets.push(value_of(&mut args, "--target")?),
            other => return Err(format!("fuzz: unknown option {other:?}")),
        }
    }
    Ok(opts)
}

fn parse_bench_peers(mut args: impl Iterator<Item = String>) -> Result<BenchPeers, String> {
    let mut opts = BenchPeers::default();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => opts.quick = true,
            "--venv" => opts.venv = value_of(&mut args, "--venv")?.into(),
            "--kt-venv" => opts.kt_venv = value_of(&mut args, "--kt-venv")?.into(),
            "--llama-dir" => opts.llama_dir = value_of(&mut args, "--llama-dir")?.into(),
            "--shared" => opts.shared = Some(value_of(&mut args, "--shared")?.into()),
            "--shape" | "--shapes" => opts.shapes = list_of(&value_of(&mut args, &arg)?),
            "--batch-sizes" => {
                opts.batch_sizes = list_of(&value_of(&mut args, "--batch-sizes")?)
                    .iter()
                    .map(|m| positive(m, "--batch-sizes"))
                    .collect::<Result<_, _>>()?;
            }
            "--threads" => {
                opts.threads = positive(&value_of(&mut args, "--threads")?, "--threads")?
            }
            "--rounds" => opts.rounds = positive(&value_of(&mut args, "--rounds")?, "--rounds")?,
            "--iters" => opts.iters = positive(&value_of(&mut args, "--iters")?, "--iters")?,
            "--paths" => opts.paths = list_of(&value_of(&mut args, "--paths")?),
            "--out" => opts.out = Some(value_of(&mut args, "--out")?.into()),
            "--render" => opts.render = Some(value_of(&mut args, "--render")?.into()),
            "--plot" => opts.plot = Some(value_of(&mut args, "--plot")?.into()),
            other => return Err(format!("bench-peers: unknown option {other:?}")),
        }
    }
    Ok(opts)
}

fn parse_arm_cost(mut args: impl Iterator<Item = String>) -> Result<ArmCost, String> {
    let mut opts = ArmCost::default();
    let mut mca = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--kleidiai" => opts.kleidiai = Some(value_of(&mut args, "--kleidiai")?.into()),
            "--mca" => mca.push(value_of(&mut args, "--mca")?),
            "--cpus" => opts.cpus = list_of(&value_of(&mut args, "--cpus")?),
            "--asm" => opts.asm = Some(value_of(&mut args, "--asm")?.into()),
            "--no-install" => opts.no_install = true,
            "--write-doc" => opts.write_doc = true,
            other => return Err(format!("arm-cost: unknown option {other:?}")),
        }
    }
    if !mca.is_empty() {
        opts.mca = mca;
    }
    if opts.cpus.is_empty() {
        return Err("arm-cost: --cpus needs at least one core model".into());
    }
    Ok(opts)
}

/// Splits a comma-separated list, dropping empty items.
fn list_of(raw: &str) -> Vec<String> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// Parses a whole number of at least 1.
fn positive(raw: &str, flag: &str) -> Result<usize, String> {
    match raw.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{flag} wants whole numbers of at least 1, got {raw:?}"
        )),
    }
}

fn parse_test_arm(mut args: impl Iterator<Item = String>) -> Result<TestArm, String> {
    let mut opts = TestArm::default();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rung" => opts.rungs.push(value_of(&mut args, "--rung")?),
            "--no-install" => opts.no_install = true,
            "--timeout-minutes" => {
                let raw = value_of(&mut args, "--timeout-minutes")?;
                let minutes: u64 = raw
                    .parse()
                    .map_err(|_| format!("--timeout-minutes wants a whole number, got {raw:?}"))?;
                opts.timeout = Duration::from_secs(minutes * 60);
            }
            "--" => {
                opts.test_args = args.collect();
                break;
            }
            other => return Err(format!("test-arm: unknown option {other:?}")),
        }
    }
    Ok(opts)
}

/// Collects the arguments after a leading `--`; anything else is an error.
fn after_double_dash(
    args: &mut impl Iterator<Item = String>,
    command: &str,
) -> Result<Vec<String>, String> {
    match args.next() {
        None => Ok(Vec::new()),
        Some(dash) if dash == "--" => Ok(args.collect()),
        Some(other) => Err(format!("{command}: unknown option {other:?}")),
    }
}

fn value_of(args: &mut impl Iterator<Item = String>, flag: &str) -> Result<String, String> {
    args.next().ok_or_else(|| format!("{flag} needs a value"))
}

fn no_more_args(
    mut args: impl Iterator<Item = String>,
    command: Command,
) -> Result<Command, String> {
    match args.next() {
        None => Ok(command),
        Some(extra) => Err(format!("unexpected argument {extra:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<Command, String> {
        parse(line.split_whitespace().map(String::from))
    }

    #[test]
    fn test_arm_flags_are_read() {
        let Ok(Command::TestArm(opts)) =
            parse_str("test-arm --rung max --no-install --timeout-minutes 3 -- golden --nocapture")
        else {
            panic!("test-arm did not parse");
        };
        assert_eq!(opts.rungs, ["max"]);
        assert!(opts.no_install);
        assert_eq!(opts.timeout, Duration::from_secs(180));
        assert_eq!(opts.test_args, ["golden", "--nocapture"]);
    }

    #[test]
    fn fuzz_flags_are_read() {
        let Ok(Command::Fuzz(opts)) = parse_str("fuzz --seconds 10 --target packers") else {
            panic!("fuzz did not parse");
        };
        assert_eq!(
            (opts.seconds, opts.targets),
            (10, vec!["packers".to_string()])
        );
        assert!(parse_str("fuzz --seconds ten").is_err());
        assert!(matches!(parse_str("miri"), Ok(Command::Miri)));
    }

    #[test]
    fn bench_peers_flags_are_read() {
        let Ok(Command::BenchPeers(opts)) = parse_str(
            "bench-peers --quick --venv /v --kt-venv /k --llama-dir /l --batch-sizes 1,16 --shape qwen3-30b-a3b --threads 1 --out o.json",
        ) else {
            panic!("bench-peers did not parse");
        };
        assert!(opts.quick);
        assert_eq!(opts.venv, PathBuf::from("/v"));
        assert_eq!(opts.kt_venv, PathBuf::from("/k"));
        assert_eq!(opts.llama_dir, PathBuf::from("/l"));
        assert_eq!(opts.batch_sizes, [1, 16]);
        assert_eq!(opts.shapes, ["qwen3-30b-a3b"]);
        assert_eq!((opts.threads, opts.rounds), (1, 2));
        assert_eq!(opts.out, Some(PathBuf::from("o.json")));
        let Ok(Command::BenchPeers(opts)) = parse_str("bench-peers --render o.json --plot p.svg")
        else {
            panic!("bench-peers --render did not parse");
        };
        assert_eq!(opts.render, Some(PathBuf::from("o.json")));
        assert_eq!(opts.plot, Some(PathBuf::from("p.svg")));
        assert!(parse_str("bench-peers --batch-sizes 0").is_err());
        assert!(parse_str("bench-peers --threads").is_err());
    }

    #[test]
    fn arm_cost_flags_are_read() {
        let Ok(Command::ArmCost(opts)) = parse_str(
            "arm-cost --kleidiai /k --mca llvm-mca-14 --mca llvm-mca-16 --cpus neoverse-n2 --write-doc",
        ) else {
            panic!("arm-cost did not parse");
        };
        assert_eq!(opts.kleidiai, Some(PathBuf::from("/k")));
        assert_eq!(opts.mca, ["llvm-mca-14", "llvm-mca-16"]);
        assert_eq!(opts.cpus, ["neoverse-n2"]);
        assert!(opts.write_doc && !opts.no_install);
        let Ok(Command::ArmCost(opts)) = parse_str("arm-cost") else {
            panic!("bare arm-cost did not parse");
        };
        assert_eq!(opts.mca, ["llvm-mca-14"]);
        assert_eq!(opts.cpus.len(), 3);
        assert!(parse_str("arm-cost --cpus ,").is_err());
    }

    #[test]
    fn unknown_input_is_an_error() {
        assert!(parse_str("frobnicate").is_err());
        assert!(parse_str("ci --fast").is_err());
        assert!(parse_str("test-arm --rung").is_err());
        assert!(parse_str("test-x86-ladder --fast").is_err());
    }

    #[test]
    fn no_command_means_help() {
        assert!(matches!(parse_str(""), Ok(Command::Help)));
    }
}
