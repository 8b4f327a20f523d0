//! `cargo xtask bench-peers`: our `moe bench` against three peers' CPU MoE kernels on the same
//! shapes, batch sizes and thread count, in one run, with one table of medians at the end:
//!
//! - vLLM's CPU build (`<shared>/peers/bench_vllm_cpu.py`, venv from `setup_venv.sh`), paths
//!   named as that script names them (`int4_amx_g32`, `int8_w8a8`, ...);
//! - KTransformers' KT-Kernel (`<shared>/peers/bench_kt_kernel.py`, venv from
//!   `setup_venv_kt.sh`), paths `kt:<its path>` (`kt:amx_int4`, `kt:amx_int8`, ...);
//! - llama.cpp's MUL_MAT_ID (our `xtask/peers/llama_mul_mat_id.c` against a ggml built from the
//!   llama-cpp-python sdist, see [`llama`]), paths `llama:<ggml type>` (`llama:q4_0`).
//!
//! The machine is shared and noisy, so the sides alternate per shape (ours, each peer path,
//! ours, ... for `--rounds` rounds) and the table quotes the median over rounds of each round's
//! median; the load average is printed before and after. Each peer path runs in its own
//! process, so a path that dies (vLLM's AMX kernels raise SIGILL on CPUs without AMX, or when the
//! process never asked Linux for tile state) is reported as `failed: <reason>` instead of taking
//! the other paths down with it, and a peer that does not install gives `not installed:
//! <reason>` rows instead of ending the run. The Python peers' own correctness check (relative
//! error against a float32 reference) is carried into the report, so a path that falls back to
//! something wrong is visible too.
//!
//! All sides are compared on the experts stage: `moe bench` times the road a runtime takes,
//! `MoeLayer`, and its `experts` rows (`apply_with_topk`, routing drawn in advance) are the ones
//! compared (its `block` rows, routing included, stay in the raw report; reports of the fused
//! pipeline alone, `fused` rows, are read too); the vLLM script times routing plus experts and also reports the routing alone,
//! which is subtracted; KT-Kernel's operator and the llama.cpp graph take routing ids and
//! weights drawn in advance, so their times are the experts stage as measured.

mod llama;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use moe_plot::{Colour, Line, Panel, Stroke};

use crate::flags::BenchPeers;
use crate::json::{self, Value};
use crate::project_root;
use crate::util::{Cmd, Result, banner, fmt_duration};

/// The W4A8 targets for our pipeline, ms per call at M = 1, 16, 256, 1024 (2 threads, W4A8
/// group 32, uniform routing, weights cycled beyond the caches).
const TARGETS_MS: [(&str, [(usize, f64); 4]); 3] = [
    (
        "qwen3-30b-a3b",
        [(1, 0.89), (16, 9.1), (256, 14.2), (1024, 23.6)],
    ),
    (
        "mixtral-8x7b",
        [(1, 8.3), (16, 32.7), (256, 33.0), (1024, 125.0)],
    ),
    (
        "deepseek-v2-lite",
        [(1, 1.2), (16, 10.3), (256, 13.0), (1024, 21.6)],
    ),
];

/// A peer result whose relative error against the float32 reference exceeds this is reported as
/// wrong (the paths that work land at 1-2.5 %, see vllm_cpu_probe.md).
const WRONG_REL_ERR: f64 = 0.1;

/// Both cores' DRAM read bandwidth (../shared/limits.md), the figure `moe bench` also uses.
const DRAM_BYTES_PER_S: f64 = 28.8e9;

/// Upper bound for one `moe bench` or one peer process, so a hang cannot stall the run.
const RUN_LIMIT: Duration = Duration::from_secs(40 * 60);

/// The peer script's `--combo-budget` (seconds per shape, path and M). Its default of 22 s
/// makes a call slower than a third of it (Mixtral at M = 1024 without AMX) end the whole
/// process with `StatisticsError: no median for empty data`, because such a combination gets
/// no timed repetitions; 60 s keeps calls up to 20 s measured and skips slower ones.
const PEER_COMBO_BUDGET_S: u32 = 60;

/// Upper bound for the peer venv installation.
const SETUP_LIMIT: Duration = Duration::from_secs(45 * 60);

/// The llama.cpp program's time budget per M (seconds of timed calls; at least 3 calls).
const LLAMA_BUDGET_S: u32 = 20;

/// The peer paths of a full run: KT-Kernel's bf16 path is left out as it is not a quantized
/// comparison, and its group-32 RAWINT4 path because it is wrong for Mixtral (kt_kernel.md).
const DEFAULT_PATHS: [&str; 7] = [
    "int4_amx_g32",
    "int4_amx_g128",
    "int8_w8a8",
    "kt:amx_int4",
    "kt:amx_int8",
    "llama:q4_0",
    "llama:q8_0",
];

/// The peer paths of `--quick`: each peer's int4 path, and vLLM's int8.
const QUICK_PATHS: [&str; 4] = ["int4_amx_g32", "int8_w8a8", "kt:amx_int4", "llama:q4_0"];

/// Who runs a peer path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Peer {
    /// vLLM's CPU build, through `bench_vllm_cpu.py`.
    Vllm,
    /// KTransformers' KT-Kernel, through `bench_kt_kernel.py`.
    Kt,
    /// llama.cpp's ggml, through our `llama_mul_mat_id.c`.
    Llama,
}

impl Peer {
    /// The peer of a path and the path's name in that peer's own terms (`kt:amx_int4` is
    /// KT-Kernel's `amx_int4`; names without a known prefix are vLLM's).
    fn of_path(path: &str) -> (Peer, &str) {
        if let Some(bare) = path.strip_prefix("kt:") {
            (Peer::Kt, bare)
        } else if let Some(bare) = path.strip_prefix("llama:") {
            (Peer::Llama, bare)
        } else {
            (Peer::Vllm, path)
        }
    }

    fn name(self) -> &'static str {
        match self {
            Peer::Vllm => "vLLM",
            Peer::Kt => "KT-Kernel",
            Peer::Llama => "llama.cpp",
        }
    }

    /// The Python peers' benchmark and venv setup scripts in `<shared>/peers`.
    fn script(self) -> &'static str {
        match self {
            Peer::Kt => "bench_kt_kernel.py",
            _ => "bench_vllm_cpu.py",
        }
    }

    fn setup_script(self) -> &'static str {
        match self {
            Peer::Kt => "setup_venv_kt.sh",
            _ => "setup_venv.sh",
        }
    }
}

/// One peer path's run on one shape.
struct PeerJob<'a> {
    shape: &'a str,
    /// The path as the report names it (`kt:amx_int4`).
    path: &'a str,
    /// The path as its peer names it (`amx_int4`).
    bare: &'a str,
    batch_sizes: &'a [usize],
}

/// What one peer path gave for one (shape, M) in one round.
#[derive(Debug, Clone)]
enum PeerCell {
    /// It ran: experts-stage ms (routing subtracted), as measured ms, the fastest call (as
    /// measured), relative error.
    Ran {
        experts_ms: f64,
        total_ms: f64,
        best_ms: f64,
        rel_err: Option<f64>,
    },
    /// It did not produce a time, for this reason.
    Failed(String),
}

/// vLLM's int4 path with groups of 128, which runs GPTQ/AWQ-style weight-only checkpoints:
/// when it runs, ours is also timed in that weight format, once with float activations
/// (`moe bench --format w4a16 --group-size 128`) and once with dynamic int8 activations
/// (`--wna16-activations int8`). vLLM's path quantizes its activations to int8 per token inside
/// the kernel (W4A8 arithmetic behind the weight-only label), so its peer/ours compares it with
/// the int8 run, the same arithmetic.
const W4A16_PEER_PATH: &str = "int4_amx_g128";

/// vLLM's bf16 path on its portable `vec` kernels (`cpu_fused_moe`), the one MoE kernel of its
/// build for CPUs without AVX-512. The shared script has no such path, so our
/// `xtask/peers/bench_vllm_vec.py` adds it to that script's machinery. When it runs, ours is
/// also timed unquantized (`moe bench --format bf16`), and its peer/ours compares the two like
/// for like.
const VEC_PEER_PATH: &str = "bf16_vec";

/// vLLM's int8 path (int8 weights with one scale per channel, int8 activations per token):
/// when it runs, ours is also timed in that format (`moe bench --format w8a8`), and its
/// peer/ours compares the two like for like.
const W8A8_PEER_PATH: &str = "int8_w8a8";

/// Which of our layers `moe bench` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ours {
    /// W4A8, int4 groups of 32 (the table's main column and the targets' format).
    W4a8G32,
    /// Weight-only int4 (WNA16) groups of 128, float activations.
    W4a16G128,
    /// The same weights with dynamic per-token int8 activations on the W4A8 kernels.
    W4a16G128Int8,
    /// W8A8: int8 weights, channelwise scales, dynamic per-token int8 activations.
    W8a8,
    /// Unquantized bf16 weights, float activations.
    Bf16,
}

impl Ours {
    /// Every layer `moe bench` may time.
    const ALL: [Self; 5] = [
        Self::W4a8G32,
        Self::W4a16G128,
        Self::W4a16G128Int8,
        Self::W8a8,
        Self::Bf16,
    ];
}

impl Ours {
    fn format_args(self) -> &'static [&'static str] {
        match self {
            Self::W4a8G32 => &["--format", "w4a8", "--group-size", "32"],
            Self::W4a16G128 => &["--format", "w4a16", "--group-size", "128"],
            Self::W4a16G128Int8 => &[
                "--format",
                "w4a16",
                "--group-size",
                "128",
                "--wna16-activations",
                "int8",
            ],
            Self::W8a8 => &["--format", "w8a8"],
            Self::Bf16 => &["--format", "bf16"],
        }
    }

    /// The `side` of its raw reports.
    fn side(self) -> &'static str {
        match self {
            Self::W4a8G32 => "ours",
            Self::W4a16G128 => "ours-w4a16-g128",
            Self::W4a16G128Int8 => "ours-w4a16-g128-int8",
            Self::W8a8 => "ours-w8a8",
            Self::Bf16 => "ours-bf16",
        }
    }
}

/// Everything measured, keyed by shape then M (ours) or by shape, path, M (peer).
#[derive(Default)]
struct Measurements {
    /// Per peer path: what its report says about how it ran (ISA variant, weight layout).
    notes: BTreeMap<String, String>,
    /// Per (shape, M): the `moe bench` rows of every round.
    ours: BTreeMap<(String, usize), Vec<Value>>,
    /// Per (shape, M): the `moe bench --format w4a16 --group-size 128` rows of every round,
    /// when vLLM's int4 g128 path runs (the same weight format, float activations).
    ours_w4a16: BTreeMap<(String, usize), Vec<Value>>,
    /// The same with `--wna16-activations int8`, the arithmetic vLLM's int4 g128 path runs,
    /// which it is compared with.
    ours_w4a16_int8: BTreeMap<(String, usize), Vec<Value>>,
    /// Per (shape, M): the `moe bench --format w8a8` rows of every round, when vLLM's int8
    /// path runs.
    ours_w8a8: BTreeMap<(String, usize), Vec<Value>>,
    /// Per (shape, M): the `moe bench --format bf16` rows of every round, when vLLM's bf16
    /// `vec` path runs.
    ours_bf16: BTreeMap<(String, usize), Vec<Value>>,
    /// Per shape: why `moe bench` failed, if it did.
    ours_failed: BTreeMap<String, String>,
    /// Per (shape, path, M): one cell per round.
    peer: BTreeMap<(String, String, usize), Vec<PeerCell>>,
    /// Every raw report, for `--out`.
    raw: Vec<Value>,
}

impl Measurements {
    fn ours_of(&mut self, ours: Ours) -> &mut BTreeMap<(String, usize), Vec<Value>> {
        match ours {
            Ours::W4a8G32 => &mut self.ours,
            Ours::W4a16G128 => &mut self.ours_w4a16,
            Ours::W4a16G128Int8 => &mut self.ours_w4a16_int8,
            Ours::W8a8 => &mut self.ours_w8a8,
            Ours::Bf16 => &mut self.ours_bf16,
        }
    }
}

/// Runs `cargo xtask bench-peers`.
pub fn run(opts: &BenchPeers) -> Result<()> {
    if let Some(file) = &opts.render {
        return render_file(file, opts.plot.as_deref());
    }
    let start = Instant::now();
    let shapes = if !opts.shapes.is_empty() {
        opts.shapes.clone()
    } else if opts.quick {
        vec!["qwen3-30b-a3b".to_string()]
    } else {
        TARGETS_MS.iter().map(|(s, _)| s.to_string()).collect()
    };
    let batch_sizes = if !opts.batch_sizes.is_empty() {
        opts.batch_sizes.clone()
    } else if opts.quick {
        vec![1, 16]
    } else {
        vec![1, 16, 256, 1024]
    };
    let command = std::iter::once("cargo xtask".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let machine = machine_line();
    let load_start = load_line();
    banner("bench-peers");
    println!("command: {command}");
    println!("machine: {machine}");
    println!("load at start: {load_start}");

    let paths = if !opts.paths.is_empty() {
        opts.paths.clone()
    } else {
        let mut paths = if opts.quick {
            QUICK_PATHS.map(String::from).to_vec()
        } else {
            DEFAULT_PATHS.map(String::from).to_vec()
        };
        if vllm_runs_avx2_build() {
            println!(
                "no AVX-512: vLLM runs its AVX2 build, whose only MoE kernel is bf16 \
                 `cpu_fused_moe` on `vec`; adding {VEC_PEER_PATH}"
            );
            paths.push(VEC_PEER_PATH.to_string());
        }
        paths
    };
    let shared = shared_dir(opts);
    println!("shared: {}", shared.display());
    let scratch = target_dir().join("bench-peers");
    std::fs::create_dir_all(&scratch)?;
    // Each peer that a path needs, installed (or found) once: its program, or why not.
    let mut ready: BTreeMap<Peer, Result<PathBuf, String>> = BTreeMap::new();
    for path in &paths {
        let (peer, _) = Peer::of_path(path);
        if ready.contains_key(&peer) {
            continue;
        }
        let prepared = match peer {
            Peer::Vllm => prepare_venv(&opts.venv, &shared, peer),
            Peer::Kt => prepare_venv(&opts.kt_venv, &shared, peer),
            Peer::Llama => llama::prepare(&opts.llama_dir, &scratch),
        };
        if let Err(reason) = &prepared {
            println!("{} not installed: {reason}", peer.name());
        }
        ready.insert(peer, prepared);
    }

    banner("building moe (release)");
    Cmd::cargo(["build", "--release", "-p", "moe-cli", "--bin", "moe"]).run()?;
    let moe = target_dir().join("release").join("moe");

    let mut m = Measurements::default();
    for shape in &shapes {
        for round in 1..=opts.rounds {
            banner(&format!("{shape}: round {round}/{}: ours", opts.rounds));
            run_ours(opts, &moe, shape, &batch_sizes, Ours::W4a8G32, &mut m);
            if paths.iter().any(|p| p == W4A16_PEER_PATH) {
                banner(&format!(
                    "{shape}: round {round}/{}: ours, w4a16 g128",
                    opts.rounds
                ));
                run_ours(opts, &moe, shape, &batch_sizes, Ours::W4a16G128, &mut m);
                banner(&format!(
                    "{shape}: round {round}/{}: ours, w4a16 g128, int8 activations",
                    opts.rounds
                ));
                run_ours(opts, &moe, shape, &batch_sizes, Ours::W4a16G128Int8, &mut m);
            }
            if paths.iter().any(|p| p == W8A8_PEER_PATH) {
                banner(&format!(
                    "{shape}: round {round}/{}: ours, w8a8",
                    opts.rounds
                ));
                run_ours(opts, &moe, shape, &batch_sizes, Ours::W8a8, &mut m);
            }
            if paths.iter().any(|p| p == VEC_PEER_PATH) {
                banner(&format!(
                    "{shape}: round {round}/{}: ours, bf16",
                    opts.rounds
                ));
                run_ours(opts, &moe, shape, &batch_sizes, Ours::Bf16, &mut m);
            }
            for path in &paths {
                banner(&format!(
                    "{shape}: round {round}/{}: peer {path}",
                    opts.rounds
                ));
                let (peer, bare) = Peer::of_path(path);
                let job = PeerJob {
                    shape,
                    path,
                    bare,
                    batch_sizes: &batch_sizes,
                };
                let cells = match (&ready[&peer], peer) {
                    (Ok(program), Peer::Llama) => run_llama(opts, program, &scratch, &job, &mut m),
                    (Ok(python), _) => {
                        let peers = shared.join("peers");
                        let script: Vec<std::ffi::OsString> = if path == VEC_PEER_PATH {
                            vec![
                                project_root().join("xtask/peers/bench_vllm_vec.py").into(),
                                "--peers-dir".into(),
                                peers.into(),
                            ]
                        } else {
                            vec![peers.join(peer.script()).into()]
                        };
                        run_peer(opts, python, &script, &scratch, &job, &mut m)
                    }
                    (Err(reason), _) => batch_sizes
                        .iter()
                        .map(|&b| (b, PeerCell::Failed(format!("not installed: {reason}"))))
                        .collect(),
                };
                for (b, cell) in cells {
                    m.peer
                        .entry((shape.clone(), path.clone(), b))
                        .or_default()
                        .push(cell);
                }
            }
        }
    }
    let load_end = load_line();

    let run = Value::obj([
        ("command", Value::str(&command)),
        ("machine", Value::str(&machine)),
        ("load_start", Value::str(&load_start)),
        ("load_end", Value::str(&load_end)),
        ("threads", Value::Num(opts.threads as f64)),
        ("rounds", Value::Num(opts.rounds as f64)),
        ("iters", Value::Num(opts.iters as f64)),
        ("wall_s", Value::Num(start.elapsed().as_secs_f64().round())),
        (
            "shapes",
            Value::Arr(shapes.iter().map(Value::str).collect()),
        ),
        (
            "batch_sizes",
            Value::Arr(batch_sizes.iter().map(|&b| Value::Num(b as f64)).collect()),
        ),
        ("paths", Value::Arr(paths.iter().map(Value::str).collect())),
    ]);
    let table = render_table(&paths, opts.iters, &shapes, &batch_sizes, &m);
    print_result(&run, &table);
    if let Some(svg) = &opts.plot {
        plot_table(svg, &run, &table.rows)?;
    }

    if let Some(out) = &opts.out {
        let Value::Obj(mut members) = run else {
            unreachable!("run is built as an object above");
        };
        members.push(("table".into(), Value::Arr(table.rows)));
        members.push(("raw".into(), Value::Arr(std::mem::take(&mut m.raw))));
        std::fs::write(out, format!("{}\n", Value::Obj(members)))
            .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
        println!("\nJSON written to {}", out.display());
    }
    Ok(())
}

/// Prints the closing block: how the run was made, then the table.
fn print_result(run: &Value, table: &Table) {
    let text = |key: &str| {
        run.get(key)
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    let num = |key: &str| run.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN);
    banner("bench-peers: result");
    println!("command: {}", text("command"));
    println!("machine: {}", text("machine"));
    println!(
        "threads: {}; rounds: {} (ours and the peers alternate per shape); wall {}",
        num("threads"),
        num("rounds"),
        fmt_duration(Duration::from_secs_f64(num("wall_s").max(0.0)))
    );
    println!("load at start: {}", text("load_start"));
    println!("load at end:   {}", text("load_end"));
    println!();
    print!("{}", table.text);
}

/// `--render FILE`: prints the table of an earlier run from its `--out` JSON (and draws it,
/// with `--plot`).
fn render_file(file: &Path, svg: Option<&Path>) -> Result<()> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let run = json::parse(&text)?;
    let strings = |key: &str| -> Vec<String> {
        run.get(key)
            .map(Value::items)
            .unwrap_or_default()
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect()
    };
    let mut m = Measurements::default();
    let (mut shapes, mut paths, mut batches) = (strings("shapes"), strings("paths"), Vec::new());
    if let Some(list) = run.get("batch_sizes") {
        batches = list
            .items()
            .iter()
            .filter_map(Value::as_f64)
            .map(|b| b as usize)
            .collect();
    }
    for entry in run.get("raw").map(Value::items).unwrap_or_default() {
        let field = |key: &str| {
            entry
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let shape = field("shape");
        if !shapes.contains(&shape) {
            shapes.push(shape.clone());
        }
        let failed = entry
            .get("failed")
            .and_then(Value::as_str)
            .map(String::from);
        let side = field("side");
        let ours_side = Ours::ALL.into_iter().find(|o| o.side() == side);
        if let Some(ours) = ours_side {
            if let Some(reason) = failed {
                if ours == Ours::W4a8G32 {
                    m.ours_failed.insert(shape, reason);
                }
                continue;
            }
            for row in entry
                .get("report")
                .and_then(|r| r.get("rows"))
                .map(Value::items)
                .unwrap_or_default()
                .iter()
                .filter(|row| compared(row))
            {
                let b = row.get("batch").and_then(Value::as_f64).unwrap_or(0.0) as usize;
                if !batches.contains(&b) {
                    batches.push(b);
                }
                m.ours_of(ours)
                    .entry((shape.clone(), b))
                    .or_default()
                    .push(row.clone());
            }
            continue;
        }
        let path = field("path");
        if !paths.contains(&path) {
            paths.push(path.clone());
        }
        let (_, bare) = Peer::of_path(&path);
        if let Some(note) = entry.get("report").and_then(peer_note) {
            m.notes.insert(path.clone(), note);
        }
        // A llama.cpp run that died keeps its report of the Ms before, and the reason.
        let died = entry.get("died").and_then(Value::as_str);
        for &b in &batches {
            let cell = match (&failed, entry.get("report")) {
                (Some(reason), _) => PeerCell::Failed(reason.clone()),
                (None, Some(report)) => match (peer_cell(report, bare, b), died) {
                    (PeerCell::Failed(_), Some(reason)) => PeerCell::Failed(reason.into()),
                    (cell, _) => cell,
                },
                (None, None) => PeerCell::Failed("no report".into()),
            };
            m.peer
                .entry((shape.clone(), path.clone(), b))
                .or_default()
                .push(cell);
        }
    }
    let iters = run
        .get("iters")
        .and_then(Value::as_f64)
        .map_or(20, |v| v as usize);
    let table = render_table(&paths, iters, &shapes, &batches, &m);
    print_result(&run, &table);
    println!("\n(rendered from {})", file.display());
    if let Some(svg) = svg {
        plot_table(svg, &run, &table.rows)?;
    }
    Ok(())
}

/// Whether a `moe bench` row is the one compared with the peers: the layer's experts stage
/// (routing precomputed, as the peers are timed), or a fused-pipeline row (reports of the
/// fused pipeline alone, and those from before the layer road, which name no stage).
fn compared(row: &Value) -> bool {
    matches!(
        row.get("stage").and_then(Value::as_str),
        None | Some("experts" | "fused")
    )
}

/// The table's rows as one panel per shape: ours, each peer path, and the DRAM bound.
fn table_panels(rows: &[Value]) -> Vec<Panel> {
    let mut panels: Vec<Panel> = Vec::new();
    for row in rows {
        let (Some(shape), Some(m)) = (
            row.get("shape").and_then(Value::as_str),
            row.get("M").and_then(Value::as_f64),
        ) else {
            continue;
        };
        let at = match panels.iter().position(|p| p.title == shape) {
            Some(at) => at,
            None => {
                panels.push(Panel {
                    title: shape.to_string(),
                    lines: Vec::new(),
                });
                panels.len() - 1
            }
        };
        let lines = &mut panels[at].lines;
        let mut add = |name: String, ms: Option<f64>, bound: bool| {
            let Some(ms) = ms else { return };
            match lines.iter_mut().find(|l| l.name == name) {
                Some(line) => line.points.push((m, ms)),
                // A measured line's colour is set below, from its place in the panel.
                None => lines.push(Line {
                    name,
                    points: vec![(m, ms)],
                    colour: Colour::Black,
                    stroke: if bound {
                        Stroke::Dashed
                    } else {
                        Stroke::Measured
                    },
                }),
            }
        };
        for (name, field) in [
            ("ours", "ours_ms"),
            ("ours w4a16-int8", "ours_w4a16_g128_int8_ms"),
            ("ours w8a8", "ours_w8a8_ms"),
            ("ours bf16", "ours_bf16_ms"),
        ] {
            add(name.into(), row.get(field).and_then(Value::as_f64), false);
        }
        for peer in row.get("peer").map(Value::items).unwrap_or_default() {
            if let Some(path) = peer.get("path").and_then(Value::as_str) {
                let ms = peer.get("experts_ms").and_then(Value::as_f64);
                add(path_label(path), ms, false);
            }
        }
        add(
            "DRAM bound".into(),
            row.get("dram_bound_ms").and_then(Value::as_f64),
            true,
        );
    }
    // Bounds last, so that the measured lines keep one colour per side in every panel.
    for panel in &mut panels {
        panel.lines.sort_by_key(|l| l.stroke != Stroke::Measured);
        for (i, line) in panel.lines.iter_mut().enumerate() {
            if line.stroke == Stroke::Measured {
                line.colour = Colour::Palette(i);
            }
        }
    }
    panels
}

/// `--plot FILE`: draws the table into the SVG file.
fn plot_table(svg: &Path, run: &Value, rows: &[Value]) -> Result<()> {
    let threads = run.get("threads").and_then(Value::as_f64).unwrap_or(0.0);
    let title = format!(
        "bench-peers: experts stage, median ms per call, {threads} threads; {}",
        run.get("machine").and_then(Value::as_str).unwrap_or("?")
    );
    let text = moe_plot::render_grid(&title, &table_panels(rows))?;
    std::fs::write(svg, text).map_err(|e| format!("cannot write {}: {e}", svg.display()))?;
    println!("plot written to {}", svg.display());
    Ok(())
}

/// `--shared`, else `$MOE_SHARED`, else `../shared` next to the workspace.
fn shared_dir(opts: &BenchPeers) -> PathBuf {
    if let Some(dir) = &opts.shared {
        return dir.clone();
    }
    if let Some(dir) = std::env::var_os("MOE_SHARED") {
        return dir.into();
    }
    project_root().join("..").join("shared")
}

/// Cargo's target directory (`$CARGO_TARGET_DIR`, else `target/` in the workspace).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| project_root().join("target"))
}

/// Checks a Python peer's script and venv, installing the venv with the peer's setup script
/// when it is missing. Returns the venv's python, or why the peer cannot run.
fn prepare_venv(venv: &Path, shared: &Path, peer: Peer) -> Result<PathBuf, String> {
    let script = shared.join("peers").join(peer.script());
    if !script.is_file() {
        return Err(format!(
            "{} not found (set --shared or MOE_SHARED)",
            script.display()
        ));
    }
    let python = venv.join("bin").join("python");
    if python.is_file() {
        return Ok(python);
    }
    let setup = shared.join("peers").join(peer.setup_script());
    banner(&format!("installing the {} venv", peer.name()));
    println!(
        "{} is missing: installing {} there with {} (takes ~5 min on 2 cores and ~7 GB)",
        venv.display(),
        peer.name(),
        setup.display()
    );
    let started = Instant::now();
    let outcome = Cmd::new("bash")
        .arg(&setup)
        .arg(venv)
        .timeout(SETUP_LIMIT)
        .run_outcome()
        .map_err(|e| e.to_string())?;
    println!("venv setup took {}", fmt_duration(started.elapsed()));
    if !outcome.success() {
        return Err(format!(
            "{} failed: {}",
            peer.setup_script(),
            outcome.describe()
        ));
    }
    if python.is_file() {
        Ok(python)
    } else {
        Err(format!(
            "{} left no {}",
            peer.setup_script(),
            python.display()
        ))
    }
}

/// Runs `moe bench --json` for one shape and files its rows (or its failure).
fn run_ours(
    opts: &BenchPeers,
    moe: &Path,
    shape: &str,
    batch_sizes: &[usize],
    ours: Ours,
    m: &mut Measurements,
) {
    let cmd = Cmd::new(moe)
        .args(["--json", "bench", "--shape", shape])
        .arg("--batch-sizes")
        .arg(join(batch_sizes))
        .arg("--threads")
        .arg(opts.threads.to_string())
        .arg("--iters")
        .arg(opts.iters.to_string())
        .args(ours.format_args())
        // The table's bounds divide by the same figure as the issue's targets, not by what
        // `moe bench` would measure on this machine.
        .arg("--dram-gbs")
        .arg((DRAM_BYTES_PER_S / 1e9).to_string())
        .timeout(RUN_LIMIT);
    println!("$ {}", cmd.display());
    let parsed = cmd
        .read_stdout()
        .map_err(|e| e.to_string())
        .and_then(|text| json::parse(&text));
    let report = match parsed {
        Ok(report) => report,
        Err(e) => {
            println!("moe bench failed: {e}");
            m.raw.push(Value::obj([
                ("side", Value::str(ours.side())),
                ("shape", Value::str(shape)),
                ("failed", Value::str(&e)),
            ]));
            if ours == Ours::W4a8G32 {
                m.ours_failed.insert(shape.to_string(), e);
            }
            return;
        }
    };
    for row in report
        .get("rows")
        .map(Value::items)
        .unwrap_or_default()
        .iter()
        .filter(|row| compared(row))
    {
        let (Some(batch), Some(ms), Some(bound)) = (
            row.get("batch").and_then(Value::as_f64),
            row.get("ms_per_call").and_then(Value::as_f64),
            row.get("dram_bound_ms").and_then(Value::as_f64),
        ) else {
            continue;
        };
        println!("  ours  M={batch:<5} {ms:9.3} ms   (DRAM bound {bound:.3} ms)");
        m.ours_of(ours)
            .entry((shape.to_string(), batch as usize))
            .or_default()
            .push(row.clone());
    }
    m.raw.push(Value::obj([
        ("side", Value::str(ours.side())),
        ("shape", Value::str(shape)),
        ("load", Value::str(load_line())),
        ("report", report),
    ]));
}

/// Runs a Python peer's script (vLLM's or KT-Kernel's: both take the same options and write
/// the same report shape) for one shape and one path in its own process. `script` is the
/// script and any arguments of its own. Returns one cell per M.
fn run_peer(
    opts: &BenchPeers,
    python: &Path,
    script: &[std::ffi::OsString],
    scratch: &Path,
    job: &PeerJob,
    m: &mut Measurements,
) -> Vec<(usize, PeerCell)> {
    let PeerJob {
        shape,
        path,
        bare,
        batch_sizes,
    } = *job;
    let out = scratch.join(format!("peer-{shape}-{}.json", path.replace(':', "-")));
    let _ = std::fs::remove_file(&out);
    let mut cmd = Cmd::new(python)
        .args(script)
        .args(["--shapes", shape, "--paths", bare, "--m"])
        .arg(join(batch_sizes))
        .arg("--threads")
        .arg(opts.threads.to_string())
        .arg("--combo-budget")
        .arg(PEER_COMBO_BUDGET_S.to_string())
        .arg("--out")
        .arg(&out)
        .env("OMP_NUM_THREADS", opts.threads.to_string())
        .timeout(RUN_LIMIT);
    if opts.quick {
        cmd = cmd.arg("--quick");
    }
    let mut failed_all = |reason: String| {
        m.raw.push(Value::obj([
            ("side", Value::str("peer")),
            ("shape", Value::str(shape)),
            ("path", Value::str(path)),
            ("failed", Value::str(&reason)),
        ]));
        batch_sizes
            .iter()
            .map(|&b| (b, PeerCell::Failed(reason.clone())))
            .collect()
    };
    let (status, log) = match run_keeping_stderr(&cmd) {
        Ok(done) => done,
        Err(e) => return failed_all(e),
    };
    if let Some(reason) = status {
        let tail = log
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|t| format!(" ({})", t.trim()))
            .unwrap_or_default();
        let reason = format!("{reason}{tail}");
        println!("  peer {path}: failed: {reason}");
        // The script writes its JSON only at the end; keep what its log shows had finished.
        let cells = cells_from_log(&log, shape, bare, batch_sizes, &reason);
        m.raw.push(Value::obj([
            ("side", Value::str("peer")),
            ("shape", Value::str(shape)),
            ("path", Value::str(path)),
            ("failed", Value::str(&reason)),
            ("log", Value::Arr(log.iter().map(Value::str).collect())),
        ]));
        return cells;
    }
    let report = match std::fs::read_to_string(&out)
        .map_err(|e| format!("no report at {}: {e}", out.display()))
        .and_then(|text| json::parse(&text))
    {
        Ok(report) => report,
        Err(e) => return failed_all(e),
    };
    let amx = report
        .get("meta")
        .and_then(|meta| meta.get("amx"))
        .cloned()
        .unwrap_or(Value::Null);
    if let Some(note) = peer_note(&report) {
        m.notes.insert(path.to_string(), note);
    }
    let cells = batch_sizes
        .iter()
        .map(|&b| (b, peer_cell(&report, bare, b)))
        .collect();
    m.raw.push(Value::obj([
        ("side", Value::str("peer")),
        ("shape", Value::str(shape)),
        ("path", Value::str(path)),
        ("amx_reported", amx),
        ("report", report),
    ]));
    cells
}

/// Runs the llama.cpp timing program for one shape and one ggml type in its own process.
/// Returns one cell per M: the Ms it finished before dying keep their times.
fn run_llama(
    opts: &BenchPeers,
    program: &Path,
    scratch: &Path,
    job: &PeerJob,
    m: &mut Measurements,
) -> Vec<(usize, PeerCell)> {
    let PeerJob {
        shape,
        path,
        bare,
        batch_sizes,
    } = *job;
    let mut failed_all = |reason: String| {
        println!("  peer {path}: failed: {reason}");
        m.raw.push(Value::obj([
            ("side", Value::str("peer")),
            ("shape", Value::str(shape)),
            ("path", Value::str(path)),
            ("failed", Value::str(&reason)),
        ]));
        batch_sizes
            .iter()
            .map(|&b| (b, PeerCell::Failed(reason.clone())))
            .collect()
    };
    let Some([experts, top_k, hidden, inter]) = llama::shape_dims(shape) else {
        return failed_all(format!("no dimensions known for shape {shape:?}"));
    };
    let out = scratch.join(format!("peer-{shape}-{}.jsonl", path.replace(':', "-")));
    let _ = std::fs::remove_file(&out);
    let cmd = Cmd::new(program)
        .arg("--experts")
        .arg(experts.to_string())
        .arg("--top-k")
        .arg(top_k.to_string())
        .arg("--hidden")
        .arg(hidden.to_string())
        .arg("--inter")
        .arg(inter.to_string())
        .arg("--m")
        .arg(join(batch_sizes))
        .args(["--type", bare, "--threads"])
        .arg(opts.threads.to_string())
        .arg("--iters")
        .arg(opts.iters.to_string())
        .arg("--budget-s")
        .arg(LLAMA_BUDGET_S.to_string())
        .arg("--out")
        .arg(&out)
        .timeout(RUN_LIMIT);
    let (status, log) = match run_keeping_stderr(&cmd) {
        Ok(done) => done,
        Err(e) => return failed_all(e),
    };
    // The program writes each M's line as it finishes, so a crash keeps the earlier Ms.
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let report = llama::report_from_lines(&text, bare);
    let reason = status.map(|reason| {
        let tail = log
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|t| format!(" ({})", t.trim()))
            .unwrap_or_default();
        format!("{reason}{tail}")
    });
    let report = match (report, &reason) {
        (Ok(report), _) => report,
        (Err(_), Some(reason)) => return failed_all(reason.clone()),
        (Err(e), None) => return failed_all(e),
    };
    if let Some(note) = peer_note(&report) {
        m.notes.insert(path.to_string(), note);
    }
    let cells = batch_sizes
        .iter()
        .map(|&b| {
            let cell = match (peer_cell(&report, bare, b), &reason) {
                (PeerCell::Failed(_), Some(reason)) => PeerCell::Failed(reason.clone()),
                (cell, _) => cell,
            };
            (b, cell)
        })
        .collect();
    let mut entry = vec![
        ("side".to_string(), Value::str("peer")),
        ("shape".to_string(), Value::str(shape)),
        ("path".to_string(), Value::str(path)),
        ("report".to_string(), report),
    ];
    if let Some(reason) = reason {
        println!("  peer {path}: failed: {reason}");
        entry.push(("died".to_string(), Value::str(reason)));
    }
    m.raw.push(Value::Obj(entry));
    cells
}

/// What a peer report says about how the peer ran: KT-Kernel's ISA variant, llama.cpp's
/// weight layout and ggml version, vLLM's AMX flag.
fn peer_note(report: &Value) -> Option<String> {
    let meta = report.get("meta")?;
    let text = |key: &str| meta.get(key).and_then(Value::as_str);
    if let Some(variant) = text("cpu_variant") {
        return Some(format!(
            "kt-kernel {} variant {variant}",
            text("kt_kernel").unwrap_or("?")
        ));
    }
    if let Some(layout) = text("layout") {
        return Some(format!(
            "ggml {}, weights {layout}",
            text("ggml_version").unwrap_or("?")
        ));
    }
    match meta.get("amx") {
        Some(Value::Bool(amx)) => Some(format!("amx {amx}")),
        _ => None,
    }
}

/// Reads the peer result of one path and M out of a peer report.
fn peer_cell(report: &Value, path: &str, batch: usize) -> PeerCell {
    let results = report.get("results").map(Value::items).unwrap_or_default();
    let same_path = |r: &&Value| r.get("path").and_then(Value::as_str) == Some(path);
    let row = results
        .iter()
        .filter(same_path)
        .find(|r| r.get("M").and_then(Value::as_f64) == Some(batch as f64) || r.get("M").is_none());
    let Some(row) = row else {
        return PeerCell::Failed("no result in the peer report".into());
    };
    let text = |key: &str| {
        row.get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    match row.get("status").and_then(Value::as_str) {
        Some("ok") => {
            let total = row
                .get("ms_median")
                .and_then(Value::as_f64)
                .unwrap_or(f64::NAN);
            let route = row
                .get("route_ms_median")
                .and_then(Value::as_f64)
                .unwrap_or(0.0);
            let rel_err = row.get("check_rel_err").and_then(Value::as_f64);
            let check_error = row.get("check_rel_err").and_then(Value::as_str);
            if let Some(err) = check_error {
                return PeerCell::Failed(format!("check raised: {err}"));
            }
            PeerCell::Ran {
                experts_ms: (total - route).max(0.0),
                total_ms: total,
                best_ms: row
                    .get("ms_min")
                    .and_then(Value::as_f64)
                    .unwrap_or(f64::NAN),
                rel_err,
            }
        }
        Some("skipped") => PeerCell::Failed(format!("skipped: {}", text("reason"))),
        Some("build_failed") => PeerCell::Failed(format!("build failed: {}", text("error"))),
        Some("failed") => PeerCell::Failed(text("reason")),
        other => PeerCell::Failed(format!("status {other:?}")),
    }
}

/// Runs `cmd`, passing its stdout and stderr through (stderr indented) and keeping the stderr
/// lines. Returns `None` on success or the reason it failed, and those lines.
fn run_keeping_stderr(cmd: &Cmd) -> Result<(Option<String>, Vec<String>), String> {
    println!("$ {}", cmd.display());
    let mut child = cmd
        .std_command()
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the peer: {e}"))?;
    let stderr = child.stderr.take().expect("stderr was piped");
    let reader = thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("  | {line}");
            lines.push(line);
        }
        lines
    });
    let limit = cmd.time_limit().unwrap_or(RUN_LIMIT);
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() >= limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(format!("waiting for the peer: {e}")),
        }
    };
    let last = reader.join().unwrap_or_default();
    let reason = match status {
        None => Some(format!("killed after the {} s limit", limit.as_secs())),
        Some(status) if status.success() => None,
        Some(status) => Some(describe_exit(status)),
    };
    Ok((reason, last))
}

/// The cells of a peer process that died: each M whose timing line (`[shape path M=16]
/// 35.412 ms ...`) made it into the log gets that median (routing not subtracted: the routing
/// time is only in the JSON), the others get `reason`.
fn cells_from_log(
    log: &[String],
    shape: &str,
    path: &str,
    batch_sizes: &[usize],
    reason: &str,
) -> Vec<(usize, PeerCell)> {
    let check_prefix = format!("[{shape} {path}] check rel_err vs fp32 reference: ");
    let rel_err = log
        .iter()
        .find_map(|l| l.strip_prefix(&check_prefix))
        .and_then(|v| v.trim().parse::<f64>().ok());
    let timed = |batch: usize| {
        let prefix = format!("[{shape} {path} M={batch}]");
        log.iter().find_map(|l| {
            let rest = l.strip_prefix(&prefix)?.trim_start();
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
    };
    batch_sizes
        .iter()
        .map(|&b| {
            let cell = match timed(b) {
                Some(ms) => PeerCell::Ran {
                    experts_ms: ms,
                    total_ms: ms,
                    best_ms: f64::NAN,
                    rel_err,
                },
                None => PeerCell::Failed(reason.to_string()),
            };
            (b, cell)
        })
        .collect()
}

/// "exit status 1", or "killed by SIGILL (signal 4)" for a signal.
fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match status.signal() {
        Some(sig) => {
            let name = match sig {
                4 => "SIGILL",
                6 => "SIGABRT",
                7 => "SIGBUS",
                9 => "SIGKILL",
                11 => "SIGSEGV",
                _ => "a signal",
            };
            format!("killed by {name} (signal {sig})")
        }
        None => format!("exit status {}", status.code().unwrap_or(-1)),
    }
}

/// The table and its rows as JSON.
struct Table {
    text: String,
    rows: Vec<Value>,
}

/// The median of `values` (upper middle for an even count is avoided: the mean of the middle two).
fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

/// A peer path's display name.
fn path_label(path: &str) -> String {
    match path {
        "int4_amx_g32" => "vLLM int4 g32".into(),
        "int4_amx_g128" => "vLLM int4 g128".into(),
        "int4_amx_ch" => "vLLM int4 ch".into(),
        "int8_w8a8" => "vLLM int8".into(),
        "bf16_vec" => "vLLM bf16 vec".into(),
        "kt:amx_int4" => "kt int4 (channelwise)".into(),
        "kt:amx_int8" => "kt int8".into(),
        "kt:amx_bf16" => "kt bf16".into(),
        "kt:rawint4_g32" => "kt int4 g32".into(),
        other => match Peer::of_path(other) {
            (Peer::Kt, bare) => format!("kt {bare}"),
            (Peer::Llama, bare) => format!("llama.cpp {}", bare.to_uppercase()),
            (Peer::Vllm, bare) => format!("vLLM {bare}"),
        },
    }
}

fn target_ms(shape: &str, batch: usize) -> Option<f64> {
    TARGETS_MS
        .iter()
        .find(|(s, _)| *s == shape)
        .and_then(|(_, t)| t.iter().find(|(m, _)| *m == batch))
        .map(|(_, ms)| *ms)
}

/// Builds the final table: one line per (shape, M); per peer path its median experts-stage time
/// and peer/ours; then one status line per peer path.
fn render_table(
    paths: &[String],
    iters: usize,
    shapes: &[String],
    batches: &[usize],
    m: &Measurements,
) -> Table {
    let mut text = String::new();
    let mut rows = Vec::new();
    let mut header = format!(
        "| {:<16} | {:>5} | {:>9} | {:>9} | {:>10} | {:>9} | {:>9} |",
        "shape", "M", "ours ms", "bound ms", "ours/bound", "packed ms", "target ms"
    );
    let mut rule = "|---|---:|---:|---:|---:|---:|---:|".to_string();
    let w4a16 = !m.ours_w4a16.is_empty() || !m.ours_w4a16_int8.is_empty();
    if w4a16 {
        write!(
            header,
            " {:>15} | {:>20} |",
            "ours w4a16 ms", "ours w4a16-int8 ms"
        )
        .expect("writing to a String");
        rule.push_str("---:|---:|");
    }
    let w8a8 = !m.ours_w8a8.is_empty();
    if w8a8 {
        write!(header, " {:>13} |", "ours w8a8 ms").expect("writing to a String");
        rule.push_str("---:|");
    }
    let bf16 = !m.ours_bf16.is_empty();
    if bf16 {
        write!(header, " {:>13} |", "ours bf16 ms").expect("writing to a String");
        rule.push_str("---:|");
    }
    for path in paths {
        write!(
            header,
            " {:>22} |",
            format!("{} ms (peer/ours)", path_label(path))
        )
        .expect("writing to a String");
        rule.push_str("---:|");
    }
    // The targets compare W4A8 with whichever peer path is fastest, whatever its format.
    let fastest_column = paths.len() > 1;
    if fastest_column {
        write!(header, " {:>34} |", "fastest peer ms (path, peer/ours)")
            .expect("writing to a String");
        rule.push_str("---:|");
    }
    writeln!(text, "{header}\n{rule}").expect("writing to a String");
    // Per path: (rounds that ran, worst rel_err, distinct failure reasons).
    let mut status: BTreeMap<&str, (usize, Option<f64>, Vec<String>)> = BTreeMap::new();
    for shape in shapes {
        for &b in batches {
            let key = (shape.clone(), b);
            let ours_rows = m.ours.get(&key).map(Vec::as_slice).unwrap_or_default();
            let field = |name: &str| {
                median(
                    ours_rows
                        .iter()
                        .filter_map(|r| r.get(name).and_then(Value::as_f64))
                        .collect(),
                )
            };
            let ours = field("ms_per_call");
            let packed = field("dram_bound_ms");
            let bound = median(ours_rows.iter().filter_map(nominal_bound_ms).collect());
            let target = target_ms(shape, b);
            let fmt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), fmt_ms);
            let ours_cell = match (ours, m.ours_failed.get(shape)) {
                (None, Some(_)) => "failed".to_string(),
                (v, _) => fmt(v),
            };
            let ratio = ours.zip(bound).map(|(o, d)| o / d);
            let ms_of = |rows: &BTreeMap<(String, usize), Vec<Value>>| {
                median(
                    rows.get(&key)
                        .map(Vec::as_slice)
                        .unwrap_or_default()
                        .iter()
                        .filter_map(|r| r.get("ms_per_call").and_then(Value::as_f64))
                        .collect(),
                )
            };
            let ours_w4a16 = ms_of(&m.ours_w4a16);
            let ours_w4a16_int8 = ms_of(&m.ours_w4a16_int8);
            let ours_w8a8 = ms_of(&m.ours_w8a8);
            let ours_bf16 = ms_of(&m.ours_bf16);
            let mut line = format!(
                "| {:<16} | {:>5} | {:>9} | {:>9} | {:>10} | {:>9} | {:>9} |",
                shape,
                b,
                ours_cell,
                fmt(bound),
                ratio.map_or("-".into(), |r| format!("{r:.2}")),
                fmt(packed),
                fmt(target),
            );
            if w4a16 {
                write!(
                    line,
                    " {:>15} | {:>20} |",
                    fmt(ours_w4a16),
                    fmt(ours_w4a16_int8)
                )
                .expect("writing to a String");
            }
            if w8a8 {
                write!(line, " {:>13} |", fmt(ours_w8a8)).expect("writing to a String");
            }
            if bf16 {
                write!(line, " {:>13} |", fmt(ours_bf16)).expect("writing to a String");
            }
            let mut peer_json = Vec::new();
            let mut fastest: Option<(f64, &str)> = None;
            for path in paths {
                let cells = m
                    .peer
                    .get(&(shape.clone(), path.clone(), b))
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                let entry = status.entry(path.as_str()).or_default();
                let mut ran = Vec::new();
                let mut totals = Vec::new();
                let mut best: Option<f64> = None;
                for cell in cells {
                    match cell {
                        PeerCell::Ran {
                            experts_ms,
                            total_ms,
                            best_ms,
                            rel_err,
                        } => {
                            ran.push(*experts_ms);
                            totals.push(*total_ms);
                            best = Some(best.map_or(*best_ms, |b| b.min(*best_ms)));
                            entry.0 += 1;
                            if let Some(e) = rel_err {
                                entry.1 = Some(entry.1.map_or(*e, |w: f64| w.max(*e)));
                            }
                        }
                        PeerCell::Failed(reason) => {
                            if !entry.2.contains(reason) {
                                entry.2.push(reason.clone());
                            }
                        }
                    }
                }
                let peer = median(ran);
                if let Some(p) = peer
                    && fastest.is_none_or(|(f, _)| p < f)
                {
                    fastest = Some((p, path));
                }
                // vLLM's int4 g128, int8 and bf16 `vec` paths are compared with ours in their
                // own weight format and arithmetic (int8 activations for the first two) when
                // that ran.
                let ours = match (ours_w4a16_int8, ours_w8a8, ours_bf16) {
                    (Some(o), _, _) if path == W4A16_PEER_PATH => Some(o),
                    (_, Some(o), _) if path == W8A8_PEER_PATH => Some(o),
                    (_, _, Some(o)) if path == VEC_PEER_PATH => Some(o),
                    _ => ours,
                };
                let cell = match (peer, ours) {
                    (Some(p), Some(o)) => format!("{} ({:.2}x)", fmt_ms(p), p / o),
                    (Some(p), None) => fmt_ms(p),
                    (None, _) if cells.is_empty() => "-".into(),
                    (None, _)
                        if cells.iter().all(
                            |c| matches!(c, PeerCell::Failed(r) if r.starts_with("not installed")),
                        ) =>
                    {
                        "not installed".into()
                    }
                    (None, _)
                        if cells.iter().all(
                            |c| matches!(c, PeerCell::Failed(r) if r.starts_with("skipped")),
                        ) =>
                    {
                        "skipped".into()
                    }
                    (None, _) => "failed".into(),
                };
                write!(line, " {cell:>22} |").expect("writing to a String");
                peer_json.push(Value::obj([
                    ("path", Value::str(path)),
                    ("experts_ms", Value::num_or_null(peer)),
                    (
                        "measured_ms_incl_routing",
                        Value::num_or_null(median(totals)),
                    ),
                    ("fastest_call_ms_incl_routing", Value::num_or_null(best)),
                    (
                        "peer_over_ours",
                        Value::num_or_null(peer.zip(ours).map(|(p, o)| p / o)),
                    ),
                ]));
            }
            let fastest_over_ours = fastest.zip(ours).map(|((p, _), o)| p / o);
            if fastest_column {
                let cell = match (fastest, fastest_over_ours) {
                    (Some((p, path)), Some(r)) => format!("{} ({path}, {r:.2}x)", fmt_ms(p)),
                    (Some((p, path)), None) => format!("{} ({path})", fmt_ms(p)),
                    (None, _) => "-".into(),
                };
                write!(line, " {cell:>34} |").expect("writing to a String");
            }
            writeln!(text, "{line}").expect("writing to a String");
            rows.push(Value::obj([
                ("shape", Value::str(shape)),
                ("M", Value::Num(b as f64)),
                ("ours_ms", Value::num_or_null(ours)),
                ("dram_bound_ms", Value::num_or_null(bound)),
                ("packed_dram_bound_ms", Value::num_or_null(packed)),
                ("ours_over_bound", Value::num_or_null(ratio)),
                ("ours_w4a16_g128_ms", Value::num_or_null(ours_w4a16)),
                (
                    "ours_w4a16_g128_int8_ms",
                    Value::num_or_null(ours_w4a16_int8),
                ),
                ("ours_w8a8_ms", Value::num_or_null(ours_w8a8)),
                ("ours_bf16_ms", Value::num_or_null(ours_bf16)),
                ("target_ms", Value::num_or_null(target)),
                ("peer", Value::Arr(peer_json)),
                (
                    "fastest_peer",
                    match fastest {
                        Some((p, path)) => Value::obj([
                            ("path", Value::str(path)),
                            ("experts_ms", Value::Num(p)),
                            ("peer_over_ours", Value::num_or_null(fastest_over_ours)),
                        ]),
                        None => Value::Null,
                    },
                ),
            ]));
        }
    }
    writeln!(
        text,
        "\nours = `moe bench` (W4A8, int4 groups of 32, bf16 scales; the layer's experts stage, or the fused pipeline in older reports; weights cycled beyond the caches), \
         median over rounds of the median of {iters} calls.\nbound = the touched experts' int4 weights \
         and bf16 group scales (0.5625 B per weight) / 28.8 GB/s; packed = the same for the bytes our \
         packed layout reads, moe bench's own bound (0.5625 B per weight from commit 2c99c28 on; \
         0.75 B before, with an f32 scale and an i32 code sum per 32 weights); target = the W4A8 target.\n\
         peer = experts stage, median over rounds; peer/ours > 1 means ours is faster:"
    )
    .expect("writing to a String");
    if w4a16 {
        writeln!(
            text,
            "  ours w4a16 = `moe bench --format w4a16 --group-size 128` (weight-only int4, groups \
             of 128, float activations), the same stage; ours w4a16-int8 = the same with \
             `--wna16-activations int8` (dynamic per-token int8 activations on the W4A8 kernels), \
             the arithmetic of vLLM's {W4A16_PEER_PATH} path, whose peer/ours is against it."
        )
        .expect("writing to a String");
    }
    if w8a8 {
        writeln!(
            text,
            "  ours w8a8 = `moe bench --format w8a8` (int8 weights, one scale per channel, \
             dynamic per-token int8 activations), the same stage and the arithmetic of vLLM's \
             {W8A8_PEER_PATH} path, whose peer/ours is against it."
        )
        .expect("writing to a String");
    }
    if bf16 {
        writeln!(
            text,
            "  ours bf16 = `moe bench --format bf16` (unquantized bf16 weights, float \
             activations), the same stage and the weight format of vLLM's {VEC_PEER_PATH} path \
             (`cpu_fused_moe` on its portable kernels), whose peer/ours is against it."
        )
        .expect("writing to a String");
    }
    if w4a16 || w8a8 || bf16 {
        writeln!(text, "  every other path's peer/ours is against W4A8.")
            .expect("writing to a String");
    }
    if fastest_column {
        writeln!(
            text,
            "  fastest peer = the fastest peer path of the row, whatever its weight format, and its \
             time over ours (W4A8 g32): the comparison the targets make."
        )
        .expect("writing to a String");
    }
    let has = |peer: Peer| paths.iter().any(|p| Peer::of_path(p).0 == peer);
    if has(Peer::Vllm) {
        writeln!(
            text,
            "  vLLM = bench_vllm_cpu.py ({VEC_PEER_PATH}: xtask/peers/bench_vllm_vec.py on that \
             script's machinery), routing + experts with its routing median subtracted."
        )
        .expect("writing to a String");
    }
    if has(Peer::Kt) {
        writeln!(
            text,
            "  kt = bench_kt_kernel.py, KT-Kernel's forward_task (routing drawn in advance; \
             activation and weighted sum inside); bf16 weights quantized by KT per output row."
        )
        .expect("writing to a String");
    }
    if has(Peer::Llama) {
        writeln!(
            text,
            "  llama.cpp = xtask/peers/llama_mul_mat_id.c, ggml's graph after routing: MUL_MAT_ID \
             gate/up, SwiGLU, MUL_MAT_ID down, routing weights and the top-k sum; weights in \
             ggml's Q4_0/Q8_0 blocks of 32 (one f16 scale each), cycled beyond the caches."
        )
        .expect("writing to a String");
    }
    writeln!(text, "\npeer paths:").expect("writing to a String");
    for path in paths {
        let (ran, rel_err, reasons) = status.get(path.as_str()).cloned().unwrap_or_default();
        let note = m
            .notes
            .get(path.as_str())
            .map_or(String::new(), |n| format!(" [{n}]"));
        let mut line = if ran > 0 {
            let check = rel_err.map_or(String::new(), |e| {
                let verdict = if e > WRONG_REL_ERR {
                    ", WRONG output"
                } else {
                    ""
                };
                format!(", rel_err vs f32 reference {e:.4}{verdict}")
            });
            format!("  {path}: ran ({ran} measurements{check}){note}")
        } else {
            format!("  {path}: did not run{note}")
        };
        for reason in &reasons {
            if reason.starts_with("not installed") || reason.starts_with("skipped") {
                write!(line, "; {reason}").expect("writing to a String");
            } else {
                write!(line, "; failed: {reason}").expect("writing to a String");
            }
        }
        writeln!(text, "{line}").expect("writing to a String");
    }
    Table { text, rows }
}

/// The DRAM time of the bytes a `moe bench` row's call touches in the checkpoint's own format:
/// int4 weights plus one bf16 scale per group of 32 (what the W4A8 targets are measured against).
fn nominal_bound_ms(row: &Value) -> Option<f64> {
    let shape = row.get("shape")?;
    let dim = |key: &str| shape.get(key).and_then(Value::as_f64);
    let touched = row.get("experts_touched").and_then(Value::as_f64)?;
    let weights = 3.0 * dim("hidden")? * dim("intermediate")?;
    Some(touched * weights * (0.5 + 2.0 / 32.0) / DRAM_BYTES_PER_S * 1e3)
}

/// Milliseconds with three significant digits or more.
fn fmt_ms(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.3}")
    } else if ms < 100.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.1}")
    }
}

fn join(values: &[usize]) -> String {
    values
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// CPU model and the ISA facts that matter for the comparison.
fn machine_line() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let flags = field("flags");
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let cpus = info.lines().filter(|l| l.starts_with("processor")).count();
    format!(
        "{} ({cpus} CPUs; avx512_vnni: {}, amx_int8: {})",
        field("model name"),
        if has("avx512_vnni") { "yes" } else { "no" },
        if has("amx_int8") { "yes" } else { "no" }
    )
}

/// Whether vLLM's CPU build loads its AVX2 extension here (an x86 CPU without AVX-512
/// foundation), which has none of the `fused_experts_cpu` kernels.
fn vllm_runs_avx2_build() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        !std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `uptime`'s load averages, read from /proc/loadavg.
fn load_line() -> String {
    let raw = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let parts: Vec<&str> = raw.split_whitespace().take(3).collect();
    format!("load average {} (1, 5, 15 min)", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(results: &str) -> Value {
        json::parse(&format!(
            r#"{{"meta": {{"amx": false}}, "results": [{results}]}}"#
        ))
        .expect("test report parses")
    }

    #[test]
    fn peer_rows_become_cells() {
        let r = report(
            r#"{"path": "int8_w8a8", "M": 1, "status": "ok", "ms_median": 2.0,
                "route_ms_median": 0.25, "check_rel_err": 0.016},
               {"path": "int8_w8a8", "M": 16, "status": "skipped", "reason": "estimated 9s/call"},
               {"path": "int4_amx_g32", "status": "build_failed", "error": "RuntimeError: no AMX"}"#,
        );
        match peer_cell(&r, "int8_w8a8", 1) {
            PeerCell::Ran {
                experts_ms,
                rel_err,
                ..
            } => assert_eq!((experts_ms, rel_err), (1.75, Some(0.016))),
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            matches!(peer_cell(&r, "int8_w8a8", 16), PeerCell::Failed(s) if s.starts_with("skipped"))
        );
        assert!(
            matches!(peer_cell(&r, "int4_amx_g32", 256), PeerCell::Failed(s) if s.contains("no AMX"))
        );
        assert!(matches!(peer_cell(&r, "bf16_amx", 1), PeerCell::Failed(_)));
    }

    #[test]
    fn medians_and_targets() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
        assert_eq!(target_ms("mixtral-8x7b", 1024), Some(125.0));
        assert_eq!(target_ms("custom", 1), None);
    }

    #[test]
    fn nominal_bound_counts_int4_and_bf16_scales() {
        let row = json::parse(
            r#"{"shape": {"hidden": 2048, "intermediate": 768}, "experts_touched": 8}"#,
        )
        .expect("row parses");
        // 8 experts x 3·2048·768 weights x 0.5625 B = 21.2 MB, / 28.8 GB/s.
        let ms = nominal_bound_ms(&row).expect("bound");
        assert!((ms - 0.7373).abs() < 1e-3, "{ms}");
    }

    #[test]
    fn a_dead_peer_keeps_the_rows_its_log_shows() {
        let log: Vec<String> = [
            "[mixtral-8x7b int4_amx_g32] setup 9.1s",
            "[mixtral-8x7b int4_amx_g32] check rel_err vs fp32 reference: 0.0234",
            "[mixtral-8x7b int4_amx_g32 M=1]    84.000 ms       11.9 tok/s     2.42 GB/s",
            "statistics.StatisticsError: no median for empty data",
        ]
        .map(String::from)
        .to_vec();
        let cells = cells_from_log(&log, "mixtral-8x7b", "int4_amx_g32", &[1, 1024], "exit 1");
        assert!(matches!(
            cells[0].1,
            PeerCell::Ran { experts_ms, rel_err: Some(e), .. } if experts_ms == 84.0 && e == 0.0234
        ));
        assert!(matches!(&cells[1].1, PeerCell::Failed(r) if r == "exit 1"));
    }

    #[test]
    fn peers_that_do_not_install_or_run_are_rows_saying_why() {
        let paths = ["kt:amx_int4", "llama:q4_0"].map(String::from).to_vec();
        let mut m = Measurements::default();
        let key = |p: &str| ("qwen3-30b-a3b".to_string(), p.to_string(), 1);
        m.peer.insert(
            key("kt:amx_int4"),
            vec![PeerCell::Failed("not installed: no venv".into())],
        );
        m.peer.insert(
            key("llama:q4_0"),
            vec![PeerCell::Failed("killed by SIGSEGV (signal 11)".into())],
        );
        let table = render_table(&paths, 20, &["qwen3-30b-a3b".into()], &[1], &m);
        assert!(table.text.contains("not installed |"), "{}", table.text);
        assert!(
            table
                .text
                .contains("  kt:amx_int4: did not run; not installed: no venv")
        );
        assert!(
            table
                .text
                .contains("  llama:q4_0: did not run; failed: killed by SIGSEGV")
        );
        assert!(table.text.contains("kt int4 (channelwise) ms"));
        assert!(table.text.contains("llama.cpp Q4_0 ms"));
    }

    /// A `moe bench` experts row of `ms` per call at `batch` tokens.
    fn experts_row(batch: usize, ms: f64) -> Value {
        json::parse(&format!(
            r#"{{"stage": "experts", "batch": {batch}, "ms_per_call": {ms}}}"#
        ))
        .expect("row parses")
    }

    /// A peer cell that ran in `ms` per call.
    fn ran(ms: f64) -> PeerCell {
        PeerCell::Ran {
            experts_ms: ms,
            total_ms: ms,
            best_ms: ms,
            rel_err: None,
        }
    }

    /// The table of one shape and batch size where every path ran in `peer_ms`, and each
    /// path's peer/ours.
    fn one_row_table(m: &mut Measurements, paths: &[String], peer_ms: f64) -> (Table, Vec<f64>) {
        let (shape, b) = m.ours.keys().next().cloned().expect("an ours row");
        for path in paths {
            m.peer
                .insert((shape.clone(), path.clone(), b), vec![ran(peer_ms)]);
        }
        let table = render_table(paths, 5, std::slice::from_ref(&shape), &[b], m);
        let ratios = table.rows[0]
            .get("peer")
            .map(Value::items)
            .unwrap_or_default()
            .iter()
            .map(|p| {
                p.get("peer_over_ours")
                    .and_then(Value::as_f64)
                    .unwrap_or(f64::NAN)
            })
            .collect();
        (table, ratios)
    }

    /// The fastest peer path of a row is picked whatever its format and set against W4A8;
    /// a path that did not run is not a candidate.
    #[test]
    fn the_fastest_peer_path_of_a_row_is_set_against_w4a8() {
        let mut m = Measurements::default();
        let key = ("deepseek-v2-lite".to_string(), 256);
        m.ours.insert(key.clone(), vec![experts_row(256, 100.0)]);
        let paths = ["int4_amx_g32", W4A16_PEER_PATH, W8A8_PEER_PATH].map(String::from);
        for (path, ms) in paths.iter().zip([150.0, 60.0, 70.0]) {
            m.peer
                .insert((key.0.clone(), path.clone(), key.1), vec![ran(ms)]);
        }
        m.peer.insert(
            (key.0.clone(), "int4_amx_ch".into(), key.1),
            vec![PeerCell::Failed("failed: killed".into())],
        );
        let mut with_failed = paths.to_vec();
        with_failed.push("int4_amx_ch".into());
        let table = render_table(&with_failed, 5, std::slice::from_ref(&key.0), &[256], &m);
        let fastest = table.rows[0].get("fastest_peer").expect("a fastest peer");
        assert_eq!(
            fastest.get("path").and_then(Value::as_str),
            Some(W4A16_PEER_PATH)
        );
        assert_eq!(
            fastest.get("peer_over_ours").and_then(Value::as_f64),
            Some(0.6)
        );
        assert!(
            table.text.contains("60.00 (int4_amx_g128, 0.60x)"),
            "{}",
            table.text
        );
    }

    /// vLLM's int4 g128 path (int8 activations inside) is set beside our w4a16 g128 layer in
    /// both arithmetics and compared with the int8 one; the other paths stay compared with
    /// W4A8.
    #[test]
    fn int4_g128_is_compared_with_our_w4a16_g128_on_int8_activations() {
        let mut m = Measurements::default();
        let key = ("qwen3-30b-a3b".to_string(), 1);
        m.ours.insert(key.clone(), vec![experts_row(1, 1.0)]);
        m.ours_w4a16.insert(key.clone(), vec![experts_row(1, 2.0)]);
        m.ours_w4a16_int8
            .insert(key.clone(), vec![experts_row(1, 1.2)]);
        let paths = ["int4_amx_g32".to_string(), W4A16_PEER_PATH.to_string()];
        let (table, ratios) = one_row_table(&mut m, &paths, 3.0);
        let r = &table.rows[0];
        let ms = |name: &str| r.get(name).and_then(Value::as_f64);
        assert_eq!(ms("ours_w4a16_g128_ms"), Some(2.0));
        assert_eq!(ms("ours_w4a16_g128_int8_ms"), Some(1.2));
        assert_eq!(ratios, [3.0, 2.5]);
        assert!(table.text.contains("ours w4a16 ms"), "{}", table.text);
        assert!(table.text.contains("ours w4a16-int8 ms"), "{}", table.text);
    }

    /// vLLM's int8 path is set beside our W8A8 layer and compared with it; the other paths
    /// stay compared with W4A8, and the plot draws both of ours.
    #[test]
    fn int8_is_compared_with_our_w8a8() {
        let mut m = Measurements::default();
        let key = ("mixtral-8x7b".to_string(), 16);
        m.ours.insert(key.clone(), vec![experts_row(16, 1.0)]);
        let w8a8 = [4.0, 6.0, 5.0].map(|ms| experts_row(16, ms));
        m.ours_w8a8.insert(key.clone(), w8a8.to_vec());
        let paths = ["int4_amx_g32".to_string(), W8A8_PEER_PATH.to_string()];
        let (table, ratios) = one_row_table(&mut m, &paths, 10.0);
        let r = &table.rows[0];
        assert_eq!(r.get("ours_w8a8_ms").and_then(Value::as_f64), Some(5.0));
        assert_eq!(ratios, [10.0, 2.0]);
        let fastest = r.get("fastest_peer").expect("a fastest peer");
        assert_eq!(
            fastest.get("peer_over_ours").and_then(Value::as_f64),
            Some(10.0)
        );
        assert!(table.text.contains("ours w8a8 ms"), "{}", table.text);
        assert!(!table.text.contains("ours w4a16 ms"), "{}", table.text);
        let panels = table_panels(&table.rows);
        let names: Vec<&str> = panels[0].lines.iter().map(|l| l.name.as_str()).collect();
        assert!(names.contains(&"ours w8a8"), "{names:?}");
        assert!(!names.contains(&"ours w4a16-int8"), "{names:?}");
    }

    /// vLLM's bf16 `vec` path is set beside our bf16 layer and compared with it; the fastest
    /// peer column still compares with W4A8.
    #[test]
    fn bf16_vec_is_compared_with_our_bf16() {
        let mut m = Measurements::default();
        let key = ("qwen3-30b-a3b".to_string(), 16);
        m.ours.insert(key.clone(), vec![experts_row(16, 2.0)]);
        m.ours_bf16.insert(key.clone(), vec![experts_row(16, 8.0)]);
        let paths = ["int4_amx_g32".to_string(), VEC_PEER_PATH.to_string()];
        let (table, ratios) = one_row_table(&mut m, &paths, 12.0);
        let r = &table.rows[0];
        assert_eq!(r.get("ours_bf16_ms").and_then(Value::as_f64), Some(8.0));
        assert_eq!(ratios, [6.0, 1.5]);
        let fastest = r.get("fastest_peer").expect("a fastest peer");
        assert_eq!(
            fastest.get("peer_over_ours").and_then(Value::as_f64),
            Some(6.0)
        );
        assert!(table.text.contains("ours bf16 ms"), "{}", table.text);
        assert!(table.text.contains("vLLM bf16 vec"), "{}", table.text);
        let panels = table_panels(&table.rows);
        let names: Vec<&str> = panels[0].lines.iter().map(|l| l.name.as_str()).collect();
        assert!(names.contains(&"ours bf16"), "{names:?}");
    }

    #[test]
    fn ours_is_compared_on_the_experts_stage_of_the_layer() {
        let rows = json::parse(
            r#"[{"stage": "block", "batch": 1, "ms_per_call": 9.0},
                {"stage": "experts", "batch": 1, "ms_per_call": 1.0},
                {"stage": "fused", "batch": 1, "ms_per_call": 1.1},
                {"batch": 1, "ms_per_call": 1.2}]"#,
        )
        .expect("rows parse");
        let kept: Vec<f64> = rows
            .items()
            .iter()
            .filter(|r| compared(r))
            .filter_map(|r| r.get("ms_per_call").and_then(Value::as_f64))
            .collect();
        assert_eq!(kept, [1.0, 1.1, 1.2]);
    }

    #[test]
    fn a_plot_of_two_table_rows_has_every_side_and_its_axes() {
        let rows = json::parse(
            r#"[{"shape": "qwen3-30b-a3b", "M": 1, "ours_ms": 0.73, "dram_bound_ms": 0.74,
                 "peer": [{"path": "int4_amx_g32", "experts_ms": 1.27},
                          {"path": "llama:q4_0", "experts_ms": null}]},
                {"shape": "qwen3-30b-a3b", "M": 16, "ours_ms": 10.3, "dram_bound_ms": 7.46,
                 "peer": [{"path": "int4_amx_g32", "experts_ms": 60.6},
                          {"path": "llama:q4_0", "experts_ms": 136.0}]}]"#,
        )
        .expect("rows parse");
        let panels = table_panels(rows.items());
        assert_eq!(panels.len(), 1);
        let names: Vec<&str> = panels[0].lines.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            ["ours", "vLLM int4 g32", "llama.cpp Q4_0", "DRAM bound"]
        );
        assert_eq!(panels[0].lines[2].points, [(16.0, 136.0)]);
        assert_eq!(panels[0].lines[2].colour, Colour::Palette(2));
        assert_eq!(panels[0].lines[3].stroke, Stroke::Dashed);
        let svg = moe_plot::render_grid("two rows", &panels).expect("drawn");
        assert!(svg.trim_start().starts_with("<svg"), "{svg}");
        let labels = [
            moe_plot::X_LABEL,
            moe_plot::Y_LABEL,
            "qwen3-30b-a3b",
            "two rows",
        ];
        for needle in names.iter().copied().chain(labels) {
            assert!(svg.contains(needle), "{needle:?} missing from\n{svg}");
        }
    }

    #[test]
    fn paths_name_their_peer() {
        assert_eq!(Peer::of_path("kt:amx_int8"), (Peer::Kt, "amx_int8"));
        assert_eq!(Peer::of_path("llama:q8_0"), (Peer::Llama, "q8_0"));
        assert_eq!(Peer::of_path("int8_w8a8"), (Peer::Vllm, "int8_w8a8"));
    }

    #[test]
    fn signals_are_named() {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(
            describe_exit(ExitStatus::from_raw(4)),
            "killed by SIGILL (signal 4)"
        );
        assert_eq!(describe_exit(ExitStatus::from_raw(1 << 8)), "exit status 1");
    }
}
