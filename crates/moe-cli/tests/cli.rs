//! End-to-end tests of the `moe` binary: every command's JSON output at tiny shapes, the
//! fixtures through `inspect`, and bad input failing with a message instead of a panic.

mod support;

use std::collections::BTreeMap;

use serde_json::Value;
use support::{
    SafetensorsFile, ScratchDir, assert_clean_failure, bench_rows, bytes_per_expert, copy_files,
    f32_bytes, fixture, max_abs_diff, moe, moe_json, moe_run_args, moe_with_env, path_arg,
    read_json, write_json, write_safetensors,
};

/// When the reader of its output goes away first (`moe cpu | head -3`), `moe` ends quietly,
/// by SIGPIPE or, if its output fitted the pipe before the reader left, with success; never
/// with a panic on the failed write.
#[cfg(unix)]
#[test]
fn output_into_a_closed_pipe_ends_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    const SIGPIPE: i32 = 13;
    for args in [&["cpu"][..], &["cpu", "--json"][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_moe"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("moe starts");
        // Closes the only reader, before `moe` is past its start.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("moe ends");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            out.status.success() || out.status.signal() == Some(SIGPIPE),
            "{args:?}: {:?}, {stderr}",
            out.status
        );
    }
}

#[test]
fn cpu_json_names_the_selected_rung() {
    let v = moe_json(&["cpu", "--json"]);
    let isa = v["selected_isa"].as_str().expect("selected_isa");
    assert!(
        v["ladder"]
            .as_array()
            .expect("ladder")
            .iter()
            .any(|r| r["isa"] == isa && r["available"] == true),
        "{v}"
    );
}

/// The integer body of int4 weight-only GEMMs (15-bit integer activations) is reported where
/// it runs, and `MOE_KERNELS_WNA16_I15=0` or `MOE_KERNELS_BF16_DOT=0` takes it out of every
/// x86 rung (f32 products), while `MOE_KERNELS_WNA16_I15=1` puts it on every x86 SIMD rung,
/// ahead of any bf16 body, and on the aarch64 dot-product rungs. The AVX2 and AVX-VNNI rungs
/// run it by default, for int8 codes too.
#[test]
fn cpu_reports_the_integer_wna16_body_and_its_switches() {
    let wna16_lines = |env: &[(&str, &str)]| -> Vec<(String, String)> {
        let v = moe_with_env(&["cpu", "--json"], env).json();
        v["ladder"]
            .as_array()
            .expect("ladder")
            .iter()
            .filter(|r| r["available"] == true)
            .map(|r| {
                let line = r["ops"]
                    .as_array()
                    .expect("ops")
                    .iter()
                    .filter_map(Value::as_str)
                    .find(|l| l.starts_with("wna16_gemm"))
                    .unwrap_or_default()
                    .to_string();
                (r["isa"].as_str().unwrap_or_default().to_string(), line)
            })
            .collect()
    };
    const INTEGER: &str = "15-bit integer activations";
    for off in [
        ("MOE_KERNELS_WNA16_I15", "0"),
        ("MOE_KERNELS_BF16_DOT", "0"),
    ] {
        for (isa, line) in wna16_lines(&[off]) {
            // The aarch64 rungs have no bf16 path to turn off.
            let aarch64_dot =
                off.0 == "MOE_KERNELS_BF16_DOT" && matches!(isa.as_str(), "dotprod" | "i8mm");
            assert_eq!(
                line.contains(INTEGER),
                aarch64_dot,
                "{off:?}, rung {isa}: {line}"
            );
        }
    }
    let simd = |isa: &str| {
        matches!(
            isa,
            "avx2" | "avx-vnni" | "avx512-vnni" | "amx" | "dotprod" | "i8mm"
        )
    };
    for (isa, line) in wna16_lines(&[("MOE_KERNELS_WNA16_I15", "1")]) {
        assert_eq!(line.contains(INTEGER), simd(&isa), "rung {isa}: {line}");
    }
    // The 256-bit rungs have no bf16 path, so their integer body runs by default, and it
    // takes int8 codes there (FP8 codes stay on the f32 body).
    for (isa, line) in wna16_lines(&[]) {
        if matches!(isa.as_str(), "avx2" | "avx-vnni") {
            assert!(line.contains(INTEGER), "rung {isa}: {line}");
            let (int8, fp8) = line
                .split_once("; int8 codes: ")
                .and_then(|(_, rest)| rest.split_once("; fp8 codes: "))
                .unwrap_or_default();
            assert!(int8.contains(INTEGER), "rung {isa}: {line}");
            assert!(
                !fp8.is_empty() && !fp8.contains(INTEGER),
                "rung {isa}: {line}"
            );
        }
    }
}

/// `--measure` times every unit the CPU has, on the threads asked for, and the memory read;
/// the report's lines match the probes the CPU offers, and without the flag nothing is measured.
#[test]
fn cpu_measure_reports_each_unit_and_the_memory_read() {
    let plain = moe_json(&["cpu", "--json"]);
    assert!(plain.get("measured").is_none(), "{plain}");
    let v = moe_json(&[
        "cpu",
        "--json",
        "--measure",
        "--threads",
        "2",
        "--probe-ms",
        "20",
    ]);
    let m = &v["measured"];
    assert_eq!(m["threads"], 2, "{v}");
    assert!(m["dram_read_gb_s"].as_f64().expect("dram") > 0.0, "{v}");
    let units = m["units"].as_array().expect("units");
    let names: Vec<&str> = units.iter().map(|u| u["unit"].as_str().unwrap()).collect();
    let want: Vec<&str> = moe_kernels::probe::unit_probes()
        .iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(names, want, "{v}");
    for u in units {
        let rate = u["g_ops_per_s"].as_f64().expect("rate");
        assert!(rate.is_finite() && rate > 0.0, "{u}");
    }
}

#[test]
fn demo_at_a_tiny_shape_reports_the_kernel_and_a_small_error() {
    let v = moe_json(&[
        "demo",
        "--json",
        "--experts",
        "8",
        "--top-k",
        "2",
        "--hidden",
        "128",
        "--intermediate",
        "64",
        "--batch-sizes",
        "1,3",
        "--threads",
        "2",
    ]);
    assert!(
        v["kernel"]
            .as_str()
            .expect("kernel")
            .starts_with("cpu-int4-w4a8/"),
        "{v}"
    );
    assert_eq!(v["ok"], true);
    let rows = v["results"].as_array().expect("results");
    assert_eq!(rows.len(), 2);
    for row in rows {
        let rel = row["rel_l2_error"].as_f64().expect("rel_l2_error");
        assert!(rel < 0.05, "relative error {rel} in {row}");
        assert!(row["ms_per_call"].as_f64().expect("ms") > 0.0);
    }
    assert_eq!(rows[1]["ref_tokens"], 3);
    assert_eq!(v["road"], "layer");
}

/// The demo's layer (built by create, load, process and applied from logits) computes what
/// the fused pipeline alone computes on the same routing: the same weights, the same kernels.
#[test]
fn demo_on_both_roads_gives_the_same_error() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "demo",
            "--json",
            "--experts",
            "8",
            "--top-k",
            "2",
            "--hidden",
            "128",
            "--intermediate",
            "64",
            "--batch-sizes",
            "1,5",
            "--reps",
            "1",
        ];
        args.extend_from_slice(extra);
        moe_json(&args)
    };
    let (layer, fused) = (run(&[]), run(&["--experts-only"]));
    assert_eq!(
        (&layer["road"], &fused["road"]),
        (&"layer".into(), &"experts-only".into())
    );
    for (a, b) in layer["results"]
        .as_array()
        .expect("results")
        .iter()
        .zip(fused["results"].as_array().expect("results"))
    {
        assert_eq!(a["rel_l2_error"], b["rel_l2_error"], "{a} vs {b}");
        assert_eq!(a["max_abs_error"], b["max_abs_error"], "{a} vs {b}");
    }
    assert_eq!(layer["packed_bytes"], fused["packed_bytes"]);
}

#[test]
fn demo_results_do_not_depend_on_the_thread_count() {
    let run = |threads: &str| {
        moe_json(&[
            "demo",
            "--json",
            "--experts",
            "8",
            "--top-k",
            "2",
            "--hidden",
            "64",
            "--intermediate",
            "32",
            "--batch-sizes",
            "4",
            "--threads",
            threads,
            "--reps",
            "1",
        ])["results"][0]["rel_l2_error"]
            .as_f64()
            .expect("rel_l2_error")
    };
    assert_eq!(run("1"), run("2"));
}

#[test]
fn inspect_w4a8_fixture_selects_the_int4_kernel() {
    let dir = fixture("qwen3moe-w4a8-g32");
    let v = moe_json(&[
        "inspect",
        "--json",
        "--model",
        path_arg(&dir),
        "--layer",
        "0",
    ]);
    assert_eq!(v["family"], "Qwen3Moe");
    assert_eq!(v["experts"], 8);
    assert_eq!(v["top_k"], 2);
    assert_eq!(v["quant_scheme"], "compressed-tensors/int-quantized");
    assert!(v["tensor_count"].as_u64().unwrap() > 0);
    let kernel = v["backend"]["kernel"].as_str().expect("a backend");
    assert!(kernel.starts_with("cpu-int4-w4a8/"), "{v}");
    assert_eq!(v["layer"]["experts"], 8);
}

#[test]
fn inspect_wna16_fixture_reports_what_the_oracle_says() {
    let dir = fixture("qwen3moe-w4a16-g32");
    let v = moe_json(&["inspect", "--json", "--model", path_arg(&dir)]);
    assert_eq!(v["quant_scheme"], "compressed-tensors/pack-quantized");
    // Either a backend, or a refusal with every candidate's reason: never silence.
    let decided = v["backend"]["kernel"].is_string()
        || !v["no_backend"]["refusals"]
            .as_array()
            .expect("refusals")
            .is_empty();
    assert!(decided, "{v}");
}

#[test]
fn inspect_lists_every_refusal_when_the_kernel_is_disabled() {
    let dir = fixture("qwen3moe-w4a8-g32");
    let v = moe_with_env(
        &["inspect", "--json", "--model", path_arg(&dir)],
        &[("MOE_DISABLED_KERNELS", "cpu-int4-w4a8")],
    )
    .json();
    assert!(v["backend"].is_null(), "{v}");
    let refusals = v["no_backend"]["refusals"].as_array().expect("refusals");
    assert!(
        refusals
            .iter()
            .any(|r| r.as_str().unwrap().contains("MOE_DISABLED_KERNELS")),
        "{v}"
    );
}

#[test]
fn run_obeys_the_deny_list_like_inspect() {
    let dir = fixture("qwen3moe-w4a16-g32");
    let input = dir.join("expected.safetensors");
    let tmp = ScratchDir::new("deny");
    let out_file = tmp.join("out.safetensors");
    let run = |disabled: &str| {
        let v = moe_with_env(
            &moe_run_args(&dir, &input, &out_file),
            &[("MOE_DISABLED_KERNELS", disabled)],
        )
        .json();
        v["kernel"].as_str().expect("kernel").to_string()
    };
    let native = run("");
    assert!(native.starts_with("cpu-wna16"), "{native}");
    // With the native kernel denied, the Marlin executor serves the layer instead; it is
    // portable code, so its label claims no ISA rung.
    assert_eq!(run("cpu-wna16"), "cpu-marlin");
}

/// `moe inspect` and `moe run` decide by the same function: a checkpoint with an activation
/// the layer implements runs on the kernel inspect names, one it does not is refused by both
/// with the same reason.
#[test]
fn inspect_and_run_agree_on_the_activation() {
    let src = fixture("qwen3moe-w4a16-g32");
    let input = src.join("expected.safetensors");
    for (act, runs) in [("gelu", true), ("relu", false)] {
        let tmp = ScratchDir::new(&format!("act-{act}"));
        let dir = tmp.path();
        copy_files(&src, dir);
        let config = dir.join("config.json");
        let mut v = read_json(&config);
        v["hidden_act"] = Value::from(act);
        write_json(&config, &v);
        let inspect = moe_json(&["inspect", "--json", "--model", path_arg(dir)]);
        let run = moe(&moe_run_args(dir, &input, &dir.join("out.safetensors")));
        if runs {
            let ran = run.json();
            assert_eq!(ran["kernel"], inspect["backend"]["kernel"], "{act}");
        } else {
            run.assert_failure();
            assert!(inspect["backend"].is_null(), "{act}: {inspect}");
            let reason = inspect["no_backend"]["message"].as_str().unwrap();
            assert!(reason.contains("hidden_act"), "{act}: {reason}");
            let stderr = run.stderr();
            assert!(stderr.contains("hidden_act"), "{act}: {stderr}");
        }
    }
}

/// The layer asks the oracle with its expert-parallel rank, and `moe inspect` asks for the
/// same rank as `moe run`: an accepted rank runs on the kernel inspect names, and a rank the
/// oracle refuses (more ranks than the fixture's 8 experts) is refused by both for the oracle's
/// reason.
#[test]
fn inspect_and_run_agree_under_expert_parallelism() {
    let dir = fixture("qwen3moe-w4a16-g32");
    let input = dir.join("expected.safetensors");
    let tmp = ScratchDir::new("ep");
    let out_file = tmp.join("out.safetensors");
    for (size, rank, runs) in [("2", "1", true), ("9", "0", false)] {
        let ep = ["--ep-size", size, "--ep-rank", rank];
        let mut args = vec!["inspect", "--json", "--model", path_arg(&dir)];
        args.extend(ep);
        let inspect = moe_json(&args);
        let mut args = moe_run_args(&dir, &input, &out_file);
        args.extend(ep);
        let run = moe(&args);
        if runs {
            let ran = run.json();
            assert_eq!(ran["kernel"], inspect["backend"]["kernel"], "ep {size}");
        } else {
            run.assert_failure();
            assert!(inspect["backend"].is_null(), "ep {size}: {inspect}");
            let reason = inspect["no_backend"]["message"].as_str().unwrap();
            assert!(
                reason.contains("9 EP ranks for 8 experts"),
                "ep {size}: {reason}"
            );
            let stderr = run.stderr();
            assert!(stderr.contains(reason), "ep {size}: {stderr}");
        }
    }
}

#[test]
fn inspect_human_report_names_the_backend() {
    let dir = fixture("qwen3moe-w4a8-g32");
    let out = moe(&["inspect", "--model", path_arg(&dir)]);
    let text = out.assert_success().stdout();
    assert!(
        text.contains("backend:") && text.contains("Qwen3Moe"),
        "{text}"
    );
}

#[test]
fn bench_at_a_tiny_shape_reports_every_batch_size() {
    let v = moe_json(&[
        "bench",
        "--json",
        "--experts-only",
        "--shape",
        "e8-k2-h128-i64",
        "--batch-sizes",
        "1,4",
        "--min-bytes",
        "1M",
        "--iters",
        "3",
    ]);
    assert_eq!(v["road"], "experts-only");
    let rows = bench_rows(&v);
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert_eq!(row["stage"], "fused", "{row}");
        assert!(row["copies"].as_u64().unwrap() >= 2, "{row}");
        assert!(row["distinct_bytes"].as_u64().unwrap() >= 1 << 20);
        assert!(row["ms_per_call"].as_f64().unwrap() > 0.0);
        assert!(row["gmac_per_s"].as_f64().unwrap() > 0.0);
        assert!(row["dram_ratio"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn bench_w8a8_reads_about_twice_the_bytes_of_w4a8() {
    let run = |format: &str| {
        moe_json(&[
            "bench",
            "--json",
            "--format",
            format,
            "--shape",
            "e8-k2-h128-i64",
            "--batch-sizes",
            "1",
            "--min-bytes",
            "1M",
            "--iters",
            "3",
        ])
    };
    let (w4, w8) = (run("w4a8"), run("w8a8"));
    assert_eq!(w4["format"], "w4a8");
    assert_eq!(w8["format"], "w8a8");
    // Per expert and weight: W4A8 group 32 is 0.5625 B, W8A8 1 B plus 8 B per channel.
    let per_expert = |v: &Value| bytes_per_expert(&v["rows"][0]);
    let weights = (3 * 128 * 64) as f64;
    assert_eq!(per_expert(&w4), weights * 0.5625);
    assert_eq!(per_expert(&w8), weights + 8.0 * (2 * 64 + 128) as f64);
    assert!(w8["rows"][0]["ms_per_call"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_w4a16_reads_its_own_bytes() {
    let v = moe_json(&[
        "bench",
        "--json",
        "--format",
        "w4a16",
        "--group-size",
        "64",
        "--shape",
        "e8-k2-h128-i64",
        "--batch-sizes",
        "1,3",
        "--min-bytes",
        "1M",
        "--iters",
        "3",
    ]);
    assert_eq!(v["format"], "w4a16");
    // Per expert and weight: half a byte of code plus a 2-byte scale per 64 weights.
    let weights = (3 * 128 * 64) as f64;
    for row in bench_rows(&v) {
        let per_expert = bytes_per_expert(row);
        assert_eq!(per_expert, weights * (0.5 + 2.0 / 64.0), "{row}");
        assert!(row["ms_per_call"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn bench_layer_times_the_block_and_its_experts_through_moe_layer() {
    // The layer road is the default; `--layer` still names it.
    let v = moe_json(&[
        "bench",
        "--json",
        "--layer",
        "--shape",
        "e8-k2-h128-i64",
        "--batch-sizes",
        "1,5",
        "--min-bytes",
        "1M",
        "--iters",
        "3",
        "--warmup-ms",
        "0",
    ]);
    assert_eq!(v["road"], "layer");
    let rows = bench_rows(&v);
    let stages: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| (r["stage"].as_str().unwrap(), r["batch"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        stages,
        [("block", 1), ("experts", 1), ("block", 5), ("experts", 5)]
    );
    for row in rows {
        assert!(row["copies"].as_u64().unwrap() >= 2, "{row}");
        assert!(row["ms_per_call"].as_f64().unwrap() > 0.0, "{row}");
        // Same packed bytes per expert as the fused benchmark's W4A8 group 32.
        let per_expert = bytes_per_expert(row);
        assert_eq!(per_expert, (3 * 128 * 64) as f64 * 0.5625, "{row}");
    }
    let fused = moe_json(&[
        "bench",
        "--json",
        "--experts-only",
        "--shape",
        "e8-k2-h128-i64",
        "--batch-sizes",
        "1",
        "--min-bytes",
        "1M",
        "--iters",
        "1",
        "--warmup-ms",
        "0",
    ]);
    assert_eq!(fused["rows"][0]["stage"], "fused");
    assert!(fused["rows"][0].get("stages").is_none());
    let broken_down = moe_json(&[
        "bench",
        "--json",
        "--experts-only",
        "--breakdown",
        "--shape",
        "e8-k2-h128-i64",
        "--batch-sizes",
        "4",
        "--min-bytes",
        "1M",
        "--iters",
        "2",
        "--warmup-ms",
        "0",
    ]);
    let stages = &broken_down["rows"][0]["stages"];
    for stage in [
        "route_ms",
        "gather_ms",
        "gate_up_ms",
        "activation_ms",
        "down_ms",
        "reduce_ms",
    ] {
        assert!(stages[stage].as_f64().unwrap() >= 0.0, "{stage}: {stages}");
    }
    assert!(stages["gate_up_ms"].as_f64().unwrap() > 0.0, "{stages}");
    for flag in [
        &["--isa", "avx2"][..],
        &["--w4a8-prefill", "bf16"],
        &["--breakdown"],
    ] {
        let args: Vec<&str> = ["bench"].iter().chain(flag).copied().collect();
        assert_clean_failure(&args, "--experts-only");
    }
    // Each prefill choice runs, and the rows' kernel lines say what is in force.
    for (prefill, in_force) in [
        ("int8", "requantised"),
        ("int8-channel", "requantised to int8 per channel from"),
    ] {
        let chosen = moe_json(&[
            "bench",
            "--json",
            "--experts-only",
            "--w4a8-prefill",
            prefill,
            "--shape",
            "e8-k2-h128-i64",
            "--batch-sizes",
            "32",
            "--min-bytes",
            "1M",
            "--iters",
            "1",
            "--warmup-ms",
            "0",
        ]);
        let row = &chosen["rows"][0];
        assert!(row["ms_per_call"].as_f64().unwrap() > 0.0, "{row}");
        let ops = row["ops"].to_string();
        // Only a rung with the AMX tiles has the requantised kernel.
        if ops.contains("amx from") {
            assert_eq!(
                ops.contains(in_force),
                prefill != "int8",
                "{prefill}: {ops}"
            );
        }
    }
    assert_clean_failure(
        &["bench", "--experts-only", "--w4a8-prefill", "int4"],
        "int8-channel",
    );
    assert_clean_failure(&["bench", "--layer", "--experts-only"], "cannot be used");
    assert_clean_failure(&["bench", "--zero-points"], "--zero-points");
    assert_clean_failure(&["bench", "--peak-gmacs", "0"], "--peak-gmacs");
}

/// Every format runs on both roads at a tiny shape, the layer built through `MoeLayer`'s
/// lifecycle with the same packed bytes per expert as the fused pipeline's.
#[test]
fn bench_runs_every_format_on_both_roads_with_its_own_bytes() {
    let weights = (3 * 128 * 64) as f64;
    let cases: [(&[&str], f64); 9] = [
        (&["--format", "w4a8"], 0.5 + 2.0 / 32.0),
        // int8 codes plus an f32 scale and an i32 code sum per channel.
        (
            &["--format", "w8a8"],
            1.0 + 8.0 * (2 * 64 + 128) as f64 / weights,
        ),
        (
            &["--format", "w4a16", "--group-size", "64"],
            0.5 + 2.0 / 64.0,
        ),
        // A zero point byte per group next to the bf16 scale.
        (&["--format", "w4a16", "--zero-points"], 0.5 + 3.0 / 32.0),
        (&["--format", "w8a16", "--zero-points"], 1.0 + 3.0 / 32.0),
        (&["--format", "bf16"], 2.0),
        (&["--format", "f32"], 4.0),
        // e2m1 codes and an e8m0 scale byte per 32.
        (&["--format", "mxfp4"], 0.5 + 1.0 / 32.0),
        // e4m3 codes and an f32 block scale per channel and 128 columns (one block column
        // for K = 128 and K = 64).
        (
            &["--format", "fp8"],
            1.0 + 4.0 * (2 * 64 + 128) as f64 / weights,
        ),
    ];
    for (format, bytes_per_weight) in cases {
        for road in [&[][..], &["--experts-only"]] {
            let mut args = vec![
                "bench",
                "--json",
                "--shape",
                "e8-k2-h128-i64",
                "--batch-sizes",
                "3",
                "--min-bytes",
                "1M",
                "--iters",
                "2",
                "--warmup-ms",
                "0",
                "--dram-gbs",
                "10",
            ];
            args.extend_from_slice(format);
            args.extend_from_slice(road);
            let v = moe_json(&args);
            let rows = bench_rows(&v);
            let stages: Vec<&str> = rows.iter().map(|r| r["stage"].as_str().unwrap()).collect();
            let want: &[&str] = if road.is_empty() {
                &["block", "experts"]
            } else {
                &["fused"]
            };
            assert_eq!(stages, want, "{args:?}");
            for row in rows {
                let per_expert = bytes_per_expert(row);
                let want = weights * bytes_per_weight;
                assert!((per_expert - want).abs() <= 1e-9 * want, "{args:?}: {row}");
                assert!(row["copies"].as_u64().unwrap() >= 2, "{args:?}: {row}");
                assert!(
                    row["ms_per_call"].as_f64().unwrap() > 0.0,
                    "{args:?}: {row}"
                );
            }
        }
    }
}

/// `--plot` draws the rows: an SVG naming the shape's lines and the axes.
#[test]
fn bench_plot_writes_an_svg_of_the_rows() {
    let tmp = ScratchDir::new("plot");
    let svg = tmp.join("plot.svg");
    let v = moe_json(&[
        "bench",
        "--json",
        "--shape",
        "e8-k2-h128-i64",
        "--batch-sizes",
        "1,4",
        "--min-bytes",
        "1M",
        "--iters",
        "2",
        "--warmup-ms",
        "0",
        "--dram-gbs",
        "10",
        "--peak-gmacs",
        "50",
        "--plot",
        path_arg(&svg),
    ]);
    assert_eq!(v["rows"].as_array().map(Vec::len), Some(4));
    let text = std::fs::read_to_string(&svg).expect("the plot was written");
    assert!(text.trim_start().starts_with("<svg"), "{text}");
    assert!(text.trim_end().ends_with("</svg>"), "{text}");
    for needle in [
        "e8-k2-h128-i64 block",
        "e8-k2-h128-i64 experts",
        "e8-k2-h128-i64 DRAM bound",
        "e8-k2-h128-i64 compute bound",
        "M (tokens per call)",
        "ms per call",
    ] {
        assert!(text.contains(needle), "{needle:?} missing");
    }
}

#[test]
fn bad_input_fails_with_a_message() {
    assert_clean_failure(&["inspect"], "--model");
    assert_clean_failure(
        &["inspect", "--model", "/nonexistent/moe-model"],
        "not a directory",
    );
    let empty = ScratchDir::new("empty");
    assert_clean_failure(
        &["inspect", "--model", path_arg(empty.path())],
        "config.json",
    );
    assert_clean_failure(&["demo", "--hidden", "100"], "--hidden");
    assert_clean_failure(&["demo", "--experts", "4", "--top-k", "5"], "--top-k");
    assert_clean_failure(&["bench", "--shape", "llama"], "unknown shape");
    assert_clean_failure(&["bench", "--min-bytes", "12X"], "suffix");
    assert_clean_failure(&["frobnicate"], "unrecognized subcommand");
}

/// `moe run` routes from router logits or takes a precomputed top-k from the input file, runs
/// one tensor- or expert-parallel rank (the ranks' outputs sum to the whole layer's), and
/// repeats its call on request.
#[test]
fn run_takes_logits_a_precomputed_top_k_and_ranks() {
    let dir = fixture("qwen3moe-w4a8-g32");
    let input = dir.join("expected.safetensors");
    let tmp = ScratchDir::new("routing");
    let run = |name: &str, extra: &[&str]| -> Vec<f32> {
        let out_file = tmp.join(&format!("{name}.safetensors"));
        let mut args = moe_run_args(&dir, &input, &out_file);
        args.extend_from_slice(extra);
        moe(&args).assert_success();
        SafetensorsFile::read(&out_file).f32s("output")
    };
    let want: Vec<f32> = SafetensorsFile::read(&input)
        .bf16s("out_vllm")
        .into_iter()
        .map(f32::from)
        .collect();
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let close = |what: &str, got: &[f32], want: &[f32]| {
        let worst = max_abs_diff(got, want);
        assert!(worst <= 1e-2 * scale, "{what}: max abs diff {worst}");
    };
    let topk = [
        "--topk-ids-tensor",
        "topk_ids",
        "--topk-weights-tensor",
        "topk_weights",
    ];
    let from_logits = run("logits", &["--logits-tensor", "router_logits"]);
    close("router logits", &from_logits, &want);
    let whole = run("topk", &topk);
    close("precomputed top-k", &whole, &want);
    // `--repeat` calls the block several times and writes what one call writes; the report
    // counts the calls and keeps the first one's time beside the median.
    let repeated = tmp.join("repeat.safetensors");
    let mut args = moe_run_args(&dir, &input, &repeated);
    args.extend_from_slice(&topk);
    args.extend(["--repeat", "3"]);
    let report = moe_json(&args);
    assert_eq!(report["runs"], 3, "{report}");
    for key in ["run_ms", "first_run_ms"] {
        assert!(
            report[key].as_f64().is_some_and(|ms| ms > 0.0),
            "{key}: {report}"
        );
    }
    let again = SafetensorsFile::read(&repeated).f32s("output");
    assert!(
        again
            .iter()
            .zip(&whole)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "--repeat changed the output"
    );
    let mut zero = moe_run_args(&dir, &input, &repeated);
    zero.extend(["--repeat", "0"]);
    assert_clean_failure(&zero, "--repeat");
    for (size_flag, rank_flag) in [("--ep-size", "--ep-rank"), ("--tp-size", "--tp-rank")] {
        let mut sum = vec![0f32; whole.len()];
        for rank in ["0", "1"] {
            let mut args = topk.to_vec();
            args.extend([size_flag, "2", rank_flag, rank]);
            let part = run(&format!("{size_flag}-{rank}"), &args);
            for (s, p) in sum.iter_mut().zip(&part) {
                *s += p;
            }
        }
        close(size_flag, &sum, &whole);
    }
    assert_clean_failure(
        &[
            "run",
            "--model",
            path_arg(&dir),
            "--input",
            path_arg(&input),
            "--input-tensor",
            "x",
            "--output",
            path_arg(&tmp.join("bad.safetensors")),
            "--logits-tensor",
            "topk_weights",
        ],
        "expected [5, 8]",
    );
}

/// `--wna16-activations int8` runs W4A16 weights on the W4A8 kernels through the layer and
/// reads the W4A8 packing's bytes; it is refused where it does not apply.
#[test]
fn bench_w4a16_with_int8_activations_runs_on_the_w4a8_kernels() {
    let args = [
        "bench",
        "--shape",
        "e8-k2-h128-i64",
        "--batch-sizes",
        "1,3",
        "--min-bytes",
        "1M",
        "--iters",
        "2",
        "--warmup-ms",
        "0",
        "--dram-gbs",
        "10",
        "--format",
        "w4a16",
        "--wna16-activations",
        "int8",
    ];
    let out = moe(&args);
    let text = out.assert_success().stdout();
    assert!(text.contains("kernel cpu-int4-w4a8/"), "{text}");
    assert!(text.contains("int8 activations"), "{text}");
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let v = moe_json(&json_args);
    let weights = (3 * 128 * 64) as f64;
    for row in bench_rows(&v) {
        let per_expert = bytes_per_expert(row);
        assert_eq!(per_expert, weights * (0.5 + 2.0 / 32.0), "{row}");
    }
    let mut w8 = args.to_vec();
    let format_at = w8.len() - 3;
    w8[format_at] = "w8a16";
    assert_clean_failure(&w8, "--wna16-activations int8");
    let mut fused = args.to_vec();
    fused.push("--experts-only");
    assert_clean_failure(&fused, "--wna16-activations int8");
}

/// A gpt-oss MXFP4 checkpoint written by the test runs through `moe run` (the router computed
/// from the hidden states with its bias) and matches the f64 forward of its dequantized weights
/// (transformers' gpt-oss: softmax over the top-k logits, interleaved gate/up with biases,
/// SwiGLU-OAI with a clamp that clips): within `1e-5·max|out|` on the f32 road
/// (`MOE_KERNELS_BF16_DOT=0`), and within a relative L2 error of `1e-2` (the fixtures' WNA16
/// budget) on the CPU's default road, whose WNA16 GEMMs may round their inputs to bf16; `moe inspect` describes it and names
/// the native WNA16 kernel.
#[test]
fn gpt_oss_mxfp4_runs_and_matches_the_dequantized_reference() {
    use moe_testutil::gpt_oss::GptOss;
    let tmp = ScratchDir::new("gpt-oss");
    let model = tmp.join("model");
    std::fs::create_dir_all(&model).unwrap();
    let m = GptOss::random(0x9055, [8, 4, 64, 64], 0.75);
    m.write(&model);
    let t = 6;
    let x = moe_testutil::SplitMix64::new(17).vec_uniform(t * m.h, -1.0, 1.0);
    let input = tmp.join("input.safetensors");
    write_safetensors(
        &input,
        &BTreeMap::from([(
            "hidden_states".to_string(),
            (safetensors::Dtype::F32, vec![t, m.h], f32_bytes(&x)),
        )]),
    );
    let output = tmp.join("output.safetensors");
    let (want_ids, weights) = m.route(&x);
    let (clipped, total) = m.clipped(&x, &want_ids);
    assert!(clipped > 0 && clipped < total, "{clipped}/{total}");
    let want = m.forward(&x, &want_ids, &weights);
    for f32_road in [true, false] {
        let args = [
            "run",
            "--json",
            "--model",
            path_arg(&model),
            "--input",
            path_arg(&input),
            "--output",
            path_arg(&output),
        ];
        let env: &[(&str, &str)] = if f32_road {
            &[("MOE_KERNELS_BF16_DOT", "0")]
        } else {
            &[]
        };
        let v = moe_with_env(&args, env).assert_success().json();
        assert_eq!(v["scheme"], "mxfp4", "{v}");
        assert!(
            v["kernel"].as_str().unwrap().starts_with("cpu-wna16"),
            "{v}"
        );
        let written = SafetensorsFile::read(&output);
        let ids: Vec<usize> = written
            .i32s("topk_ids")
            .into_iter()
            .map(|id| id as usize)
            .collect();
        assert_eq!(ids, want_ids);
        let got = written.f32s("output");
        if f32_road {
            let scale = want.iter().fold(1e-6f64, |a, v| a.max(v.abs()));
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= 1e-5 * scale,
                    "f32 road [{i}]: {g} vs {w} (scale {scale})"
                );
            }
        } else {
            let (mut err, mut norm) = (0f64, 0f64);
            for (&g, &w) in got.iter().zip(&want) {
                err += (f64::from(g) - w).powi(2);
                norm += w * w;
            }
            let rel = (err / norm).sqrt();
            assert!(rel < 1e-2, "default road: relative L2 {rel}");
        }
    }
    let v = moe_json(&[
        "inspect",
        "--json",
        "--model",
        path_arg(&model),
        "--layer",
        "0",
    ]);
    assert_eq!(v["family"], "GptOss", "{v}");
    assert_eq!(v["quant_scheme"], "mxfp4");
    assert!(
        v["backend"]["kernel"]
            .as_str()
            .unwrap()
            .starts_with("cpu-wna16"),
        "{v}"
    );
    assert!(
        v["layer"]["weights"].as_str().unwrap().contains("MXFP4"),
        "{v}"
    );
    assert_eq!(v["layer"]["router_bias"], true);
    assert_eq!(
        v["runs_activation"],
        "swigluoai (alpha 1.702, limit 0.75, gate/up Interleaved)"
    );
}

#[test]
fn bench_mxfp4_reads_codes_and_scales() {
    let v = moe_json(&[
        "bench",
        "--json",
        "--format",
        "mxfp4",
        "--experts-only",
        "--shape",
        "e8-k2-h128-i64",
        "--batch-sizes",
        "1,3",
        "--min-bytes",
        "1M",
        "--iters",
        "3",
    ]);
    assert_eq!(v["format"], "mxfp4");
    // Per expert and weight: half a byte of code plus a one-byte e8m0 scale per 32 weights,
    // the checkpoint's own bytes.
    let weights = (3 * 128 * 64) as f64;
    for row in bench_rows(&v) {
        let per_expert = bytes_per_expert(row);
        assert_eq!(per_expert, weights * (0.5 + 1.0 / 32.0), "{row}");
        assert!(row["ms_per_call"].as_f64().unwrap() > 0.0);
    }
}
