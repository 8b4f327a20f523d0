//! Proves which rung ran: fails when `MOE_EXPECT_ISA` names another rung than the selected one,
//! and prints what was detected (run with `--nocapture`), checking that the report is
//! consistent.

use moe_kernels::{Isa, IsaArch, KernelSet, cpu_features, isa_cap, kernels, selected_isa};

/// The rung whose build of the dense GEMM body rung `rung` must run: the x86 rungs register
/// the body compiled for their vector width (AVX-512 F for the AVX-512 VNNI and AMX rungs);
/// the aarch64 rungs and the scalar rung run the portable build (NEON is the aarch64
/// baseline, so the portable build is already vectorized there).
fn expected_dense_isa(rung: Isa) -> Isa {
    match rung {
        Isa::Avx2 | Isa::AvxVnni => Isa::Avx2,
        Isa::Avx512Vnni | Isa::Amx => Isa::Avx512Vnni,
        _ => Isa::Scalar,
    }
}

#[test]
fn selected_isa_matches_moe_expect_isa() {
    let Ok(expected) = std::env::var("MOE_EXPECT_ISA") else {
        eprintln!("MOE_EXPECT_ISA unset; selected rung: {}", selected_isa());
        return;
    };
    let expected: Isa = expected.parse().expect("MOE_EXPECT_ISA must name a rung");
    // The rung is what detection (under the cap) selected. A rung may borrow a lower rung's
    // kernels for some op (AMX below its M threshold), which `describe_ops` reports.
    assert_eq!(
        selected_isa(),
        expected,
        "selected rung differs from MOE_EXPECT_ISA"
    );
    for line in kernels().describe_ops() {
        eprintln!("  {line}");
    }
    // A rung that registered no dense build runs the portable one: catch that.
    assert_eq!(
        kernels().dense_isa(),
        expected_dense_isa(expected),
        "dense GEMM build"
    );
    // Every aarch64 rung has kernels of its own for every op: prove that they are what runs,
    // so a silent fallback to a lower rung's code cannot pass.
    if expected.arch() == IsaArch::Aarch64 {
        for m in [1, 64] {
            assert_eq!(
                kernels().w4a8_isa(m, 32),
                expected,
                "w4a8 kernels for m = {m}"
            );
            assert_eq!(kernels().w8a8_isa(m), expected, "w8a8 kernels for m = {m}");
        }
    }
    // The AMX rung runs AVX-512 VNNI for few rows and its tiles for many: prove the tiles run.
    if expected == Isa::Amx {
        assert_eq!(
            kernels().w4a8_isa(1024, 32),
            Isa::Amx,
            "w4a8 kernels for m = 1024"
        );
        assert_eq!(
            kernels().w8a8_isa(1024),
            Isa::Amx,
            "w8a8 kernels for m = 1024"
        );
    }
}

/// The rung whose code runs the WNA16 GEMM's f32 body on rung `rung`: the x86 rungs with
/// AVX-512 run the AVX-512 body, AVX2 and AVX-VNNI the portable body built for AVX2, every
/// aarch64 rung the NEON body, and the scalar rung the portable one.
fn expected_wna16_isa(rung: Isa) -> Isa {
    match rung {
        Isa::Avx2 | Isa::AvxVnni => Isa::Avx2,
        Isa::Avx512Vnni | Isa::Amx => Isa::Avx512Vnni,
        Isa::Neon | Isa::NeonDot | Isa::NeonI8mm => Isa::Neon,
        _ => Isa::Scalar,
    }
}

/// Every rung this CPU offers runs its own build of the dense GEMM and of the WNA16 f32 body,
/// whatever `MOE_EXPECT_ISA` says: a rung whose set lost either fails here on any machine
/// that has it.
#[test]
fn every_available_rung_runs_its_own_dense_and_wna16_bodies() {
    for isa in moe_kernels::available_isas() {
        let ks = KernelSet::for_isa(isa).expect("an available rung builds its kernel set");
        assert_eq!(
            ks.without_bf16_path().wna16_isa(),
            expected_wna16_isa(isa),
            "WNA16 f32 body of rung {isa}"
        );
        assert_eq!(
            ks.dense_isa(),
            expected_dense_isa(isa),
            "dense GEMM build of rung {isa}"
        );
        assert_eq!(moe_kernels::dense_isa(&ks), ks.dense_isa(), "rung {isa}");
        let line = format!("dense_gemm: {}", ks.dense_isa());
        assert!(
            ks.describe_ops().contains(&line),
            "rung {isa}: describe_ops lacks {line:?}: {:?}",
            ks.describe_ops()
        );
    }
}

#[test]
fn report_detected_cpu_features() {
    println!("arch: {}", std::env::consts::ARCH);
    for (name, present) in cpu_features() {
        println!("  {name:<28} {}", if present { "yes" } else { "no" });
    }
    println!("cap: {:?}", isa_cap());
    let available = moe_kernels::available_isas();
    println!("available rungs: {available:?}");
    println!("selected rung: {}", selected_isa());
    let ops = kernels().describe_ops();
    for line in &ops {
        println!("  {line}");
    }
    // What is printed must hang together: the selected rung is one the CPU supports (or the
    // scalar fallback), every available rung builds its kernel set, and the report names every
    // operation.
    assert!(
        available.contains(&selected_isa()) || selected_isa() == Isa::Scalar,
        "selected rung {} is not available ({available:?})",
        selected_isa()
    );
    for isa in &available {
        assert!(
            KernelSet::for_isa(*isa).is_some(),
            "available rung {isa} has no kernel set"
        );
    }
    for op in [
        "w4a8_gemm",
        "w8a8_gemm",
        "wna16_gemm",
        "dense_gemm",
        "dense_expert_gemm",
    ] {
        assert!(
            ops.iter().any(|line| line.starts_with(op)),
            "describe_ops names no {op}: {ops:?}"
        );
    }
}
