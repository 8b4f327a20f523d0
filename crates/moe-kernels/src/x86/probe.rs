//! The x86 loops of [`crate::probe`]: `vfmadd231ps ymm` and the two 16-bit-product integer
//! instructions the 256-bit bodies use (`vpmaddwd`, `vpmaddubsw`) on AVX2, `vpdpbusd zmm` and
//! `vfmadd231ps zmm` on AVX-512, and the tile products (`x86/amx/probe.rs`) where AMX is usable.

use std::arch::x86_64::*;
use std::time::Duration;

use super::{Amx, Avx2, Avx512Vnni};
use crate::probe::{UnitProbe, best_rate};

/// Independent accumulators per loop: more than the instructions' latency times their issue
/// rate (4-5 cycles at two per cycle).
const CHAINS: usize = 12;
/// Instructions per accumulator per batch.
const ROUNDS: usize = 64;

pub(crate) fn unit_probes() -> Vec<UnitProbe> {
    let mut probes = Vec::new();
    if Avx2::try_new().is_some() && std::is_x86_feature_detected!("fma") {
        probes.push(UnitProbe {
            name: "avx2 vfmadd231ps ymm",
            op: "f32-FMA",
            run: ymm_fma_rate,
        });
        probes.push(UnitProbe {
            name: "avx2 vpmaddwd ymm",
            op: "int16-MAC",
            run: madd_rate,
        });
        probes.push(UnitProbe {
            name: "avx2 vpmaddubsw ymm",
            op: "int8-MAC",
            run: maddubs_rate,
        });
    }
    if Avx512Vnni::try_new().is_some() {
        probes.push(UnitProbe {
            name: "avx512 vfmadd231ps zmm",
            op: "f32-FMA",
            run: fma_rate,
        });
        probes.push(UnitProbe {
            name: "avx512-vnni vpdpbusd zmm",
            op: "int8-MAC",
            run: vnni_rate,
        });
    }
    if Amx::try_new().is_some() {
        probes.push(UnitProbe {
            name: "amx-int8 tdpbusd",
            op: "int8-MAC",
            run: super::amx::probe::int8_rate,
        });
        if super::amx::probe::has_amx_bf16() {
            probes.push(UnitProbe {
                name: "amx-bf16 tdpbf16ps",
                op: "bf16-MAC",
                run: super::amx::probe::bf16_rate,
            });
        }
    }
    probes
}

/// `vpdpbusd zmm` int8 multiply-adds per second (64 per instruction).
fn vnni_rate(duration: Duration) -> f64 {
    let Some(_) = Avx512Vnni::try_new() else {
        return 0.0;
    };
    let ops = (CHAINS * ROUNDS * 64) as f64;
    // SAFETY: the token proves AVX-512 F and VNNI.
    best_rate(duration, ops, || unsafe { vnni_batch() })
}

/// `vfmadd231ps zmm` f32 multiply-adds per second (16 per instruction).
fn fma_rate(duration: Duration) -> f64 {
    let Some(_) = Avx512Vnni::try_new() else {
        return 0.0;
    };
    let ops = (CHAINS * ROUNDS * 16) as f64;
    // SAFETY: the token proves AVX-512 F.
    best_rate(duration, ops, || unsafe { fma_batch() })
}

#[target_feature(enable = "avx512f,avx512vnni")]
fn vnni_batch() {
    let (a, b) = std::hint::black_box((_mm512_set1_epi8(3), _mm512_set1_epi8(5)));
    let mut acc = [_mm512_setzero_si512(); CHAINS];
    for _ in 0..ROUNDS {
        for v in &mut acc {
            *v = _mm512_dpbusd_epi32(*v, a, b);
        }
    }
    std::hint::black_box(acc);
}

#[target_feature(enable = "avx512f")]
fn fma_batch() {
    let (a, b) = std::hint::black_box((_mm512_set1_ps(1.0), _mm512_set1_ps(1e-9)));
    let mut acc = [_mm512_setzero_ps(); CHAINS];
    for _ in 0..ROUNDS {
        for v in &mut acc {
            *v = _mm512_fmadd_ps(a, b, *v);
        }
    }
    std::hint::black_box(acc);
}

/// `vfmadd231ps ymm` f32 multiply-adds per second (8 per instruction).
fn ymm_fma_rate(duration: Duration) -> f64 {
    if Avx2::try_new().is_none() || !std::is_x86_feature_detected!("fma") {
        return 0.0;
    }
    let ops = (CHAINS * ROUNDS * 8) as f64;
    // SAFETY: AVX2 (the token) and FMA were detected just above.
    best_rate(duration, ops, || unsafe { ymm_fma_batch() })
}

/// `vpmaddwd ymm` 16-bit multiply-adds per second (16 per instruction). Alone, without the add
/// that a body needs to keep its sums: the rate of the multiplier.
fn madd_rate(duration: Duration) -> f64 {
    if Avx2::try_new().is_none() {
        return 0.0;
    }
    let ops = (CHAINS * ROUNDS * 16) as f64;
    // SAFETY: the token proves AVX2.
    best_rate(duration, ops, || unsafe { madd_batch() })
}

/// `vpmaddubsw ymm` 8-bit multiply-adds per second (32 per instruction), alone as above.
fn maddubs_rate(duration: Duration) -> f64 {
    if Avx2::try_new().is_none() {
        return 0.0;
    }
    let ops = (CHAINS * ROUNDS * 32) as f64;
    // SAFETY: the token proves AVX2.
    best_rate(duration, ops, || unsafe { maddubs_batch() })
}

#[target_feature(enable = "avx2,fma")]
fn ymm_fma_batch() {
    let (a, b) = std::hint::black_box((_mm256_set1_ps(1.0), _mm256_set1_ps(1e-9)));
    let mut acc = [_mm256_setzero_ps(); CHAINS];
    for _ in 0..ROUNDS {
        for v in &mut acc {
            *v = _mm256_fmadd_ps(a, b, *v);
        }
    }
    std::hint::black_box(acc);
}

/// Each product feeds the next as an operand, so the loop measures issue, not a memory-free
/// constant the compiler could fold; `CHAINS` chains hide the latency.
#[target_feature(enable = "avx2")]
fn madd_batch() {
    let b = std::hint::black_box(_mm256_set1_epi16(1));
    let mut acc: [__m256i; CHAINS] =
        std::array::from_fn(|i| std::hint::black_box(_mm256_set1_epi32(i as i32)));
    for _ in 0..ROUNDS {
        for v in &mut acc {
            *v = _mm256_madd_epi16(*v, b);
        }
    }
    std::hint::black_box(acc);
}

#[target_feature(enable = "avx2")]
fn maddubs_batch() {
    let b = std::hint::black_box(_mm256_set1_epi8(1));
    let mut acc: [__m256i; CHAINS] =
        std::array::from_fn(|i| std::hint::black_box(_mm256_set1_epi8(i as i8)));
    for _ in 0..ROUNDS {
        for v in &mut acc {
            *v = _mm256_maddubs_epi16(*v, b);
        }
    }
    std::hint::black_box(acc);
}
