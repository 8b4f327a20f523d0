//! Activation codes quantised once per call, for every expert that reads the same token.
//!
//! The int8 formats quantise each activation row per token (W4A8 asymmetrically, spec
//! §4.2(a); W8A8 symmetrically, spec §5.3 stage 0), so the `top_k` experts a token is routed to
//! would each quantise an identical row. The fused pipeline instead quantises every token once
//! ([`quantize_tokens`]) and each expert's GEMM gathers the codes of its rows
//! ([`w4a8_gemm_tokens`], [`w8a8_gemm_tokens`]): one quantisation per token instead of one per
//! (token, expert) pair, and `K` bytes gathered per row instead of `4K`. The quantisers are the
//! ones the per-expert GEMMs use, so codes, zero points and scales, and therefore the outputs,
//! are the same bits either way.

use super::{has_nan, poison_nan_rows, run_w4a8_encoded, run_w8a8_encoded};
use crate::dispatch::KernelSet;
use crate::packed::{PackedW4A8, PackedW8A8, check_len};
use crate::par::Par;
use crate::ukernel::ActEncoding;
use crate::{GemmScratch, KernelError};
use moe_quant::act::{quantize_row_asym_i8, quantize_row_sym_i8};

/// How a weight format quantises its activation rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenQuant {
    /// Per-row asymmetric int8 with a zero point (W4A8).
    Asym,
    /// Per-row symmetric int8 (W8A8).
    Sym,
}

/// One token's quantisation parameters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TokenParams {
    /// The dequantisation factor (asymmetric) or the row scale (symmetric).
    pub(crate) scale: f32,
    /// The zero point (asymmetric); 0 when symmetric.
    pub(crate) zero_point: i32,
    /// Whether the row held a NaN (its outputs become NaN, spec §4.6).
    pub(crate) has_nan: bool,
}

/// The quantised rows of a call's tokens: token `t`'s `k` codes `q` at `codes[t·k..][..k]`,
/// its parameters at `params[t]`.
#[derive(Debug, Clone, Copy)]
pub struct TokenCodes<'a> {
    /// Codes per token (the hidden size).
    pub(crate) k: usize,
    /// `[T, k]` codes.
    pub(crate) codes: &'a [i8],
    /// `[T]` parameters.
    pub(crate) params: &'a [TokenParams],
}

/// Quantises the rows of `x` (`k` values each) under `rule` into `codes` and `params`, one
/// row per entry of `params`, with the quantisers of `ks`.
pub(crate) fn quantize_tokens(
    ks: &KernelSet,
    rule: TokenQuant,
    x: &[f32],
    k: usize,
    codes: &mut [i8],
    params: &mut [TokenParams],
) {
    assert!(
        k > 0 && x.len() == params.len() * k && codes.len() == x.len(),
        "quantize_tokens: buffers do not match the rows"
    );
    let rows = x.chunks_exact(k).zip(codes.chunks_exact_mut(k));
    for ((row, q), p) in rows.zip(params) {
        *p = match rule {
            TokenQuant::Asym => quantize_asym(ks, row, q),
            TokenQuant::Sym => quantize_sym(ks, row, q),
        };
    }
}

/// One row, asymmetrically, as [`super::w4a8_gemm`] would quantise it.
fn quantize_asym(ks: &KernelSet, row: &[f32], q: &mut [i8]) -> TokenParams {
    match ks.act_asym_u8() {
        Some(quantize) => {
            let bytes = as_bytes_mut(q);
            // SAFETY: the quantiser comes from `ks`, built from its rung's token; `bytes`
            // holds `row.len()` values.
            let r = unsafe { quantize(row, bytes) };
            // The quantiser writes `q + 128`; the codes are kept as `q`.
            bytes.iter_mut().for_each(|b| *b ^= 0x80);
            TokenParams {
                scale: r.row.recip,
                zero_point: r.row.zero_point,
                has_nan: r.has_nan,
            }
        }
        None => {
            let r = quantize_row_asym_i8(row, q);
            TokenParams {
                scale: r.recip,
                zero_point: r.zero_point,
                has_nan: has_nan(row),
            }
        }
    }
}

/// One row, symmetrically, as [`super::w8a8_gemm`] would quantise it.
fn quantize_sym(ks: &KernelSet, row: &[f32], q: &mut [i8]) -> TokenParams {
    match ks.act_sym() {
        Some(quantize) => {
            // SAFETY: as in `quantize_asym`; flip 0 writes the codes `q` as they are.
            let r = unsafe { quantize(row, as_bytes_mut(q), 0) };
            TokenParams {
                scale: r.scale,
                zero_point: 0,
                has_nan: r.has_nan,
            }
        }
        None => TokenParams {
            scale: quantize_row_sym_i8(row, q),
            zero_point: 0,
            has_nan: has_nan(row),
        },
    }
}

/// The bytes of `q`.
fn as_bytes_mut(q: &mut [i8]) -> &mut [u8] {
    // SAFETY: `i8` and `u8` have the same size and alignment and every bit pattern is valid
    // for both; the new slice covers exactly `q`'s memory and takes over its unique borrow.
    unsafe { std::slice::from_raw_parts_mut(q.as_mut_ptr().cast::<u8>(), q.len()) }
}

/// Writes the rows of `tokens` into `[m][k_pad]` bytes in encoding `enc`, padding K with the
/// encoding's zero.
fn gather_encoded(
    a: TokenCodes<'_>,
    tokens: &[usize],
    k_pad: usize,
    enc: ActEncoding,
    dst: &mut Vec<u8>,
) {
    dst.clear();
    dst.resize(tokens.len() * k_pad, enc.pad());
    let flip = enc.encode(0);
    for (&t, row) in tokens.iter().zip(dst.chunks_exact_mut(k_pad)) {
        let src = &a.codes[t * a.k..][..a.k];
        for (d, &s) in row.iter_mut().zip(src) {
            *d = (s as u8) ^ flip;
        }
    }
}

/// Checks that `a` holds rows of `k` codes for every token of `tokens`.
fn check_tokens(a: TokenCodes<'_>, tokens: &[usize], k: usize) -> Result<(), KernelError> {
    check_len("token codes K", k, a.k)?;
    check_len("token codes", a.params.len() * a.k, a.codes.len())?;
    match tokens.iter().position(|&t| t >= a.params.len()) {
        Some(index) => Err(KernelError::ValueOutOfRange {
            tensor: "tokens",
            index,
            value: tokens[index] as i64,
            min: 0,
            max: a.params.len() as i64 - 1,
        }),
        None => Ok(()),
    }
}

/// `out[m, N] = W4A8(rows of tokens)`, one output row per entry of `tokens`, from codes made
/// by [`quantize_tokens`] with [`TokenQuant::Asym`]. `Ok(false)` (nothing written) when the
/// kernel for `m` rows multiplies float rows (the bf16 tiles of the W4A8 prefill option): the
/// caller then runs [`super::w4a8_gemm`] on the rows themselves.
pub(crate) fn w4a8_gemm_tokens(
    ks: &KernelSet,
    tokens: &[usize],
    a: TokenCodes<'_>,
    w: &PackedW4A8,
    out: &mut [f32],
    scratch: &mut GemmScratch,
    par: Par,
) -> Result<bool, KernelError> {
    let m = tokens.len();
    if ks.w4bf16_for(m, w.order()).is_some() {
        return Ok(false);
    }
    check_tokens(a, tokens, w.k())?;
    check_len("out", m * w.n(), out.len())?;
    let kernel = ks.w4a8_for(m, w);
    let s = &mut *scratch;
    gather_encoded(a, tokens, w.k_pad(), kernel.encoding, &mut s.encoded);
    s.corr.clear();
    s.row_scale.clear();
    s.nan_rows.clear();
    for (i, &t) in tokens.iter().enumerate() {
        let p = a.params[t];
        s.corr.push(kernel.encoding.w4a8_row_corr(p.zero_point));
        s.row_scale.push(p.scale);
        if p.has_nan {
            s.nan_rows.push(i);
        }
    }
    run_w4a8_encoded(kernel, m, w, scratch, out, par);
    Ok(true)
}

/// `out[m, N] = W8A8(rows of tokens)`, one output row per entry of `tokens`, from codes made
/// by [`quantize_tokens`] with [`TokenQuant::Sym`].
pub(crate) fn w8a8_gemm_tokens(
    ks: &KernelSet,
    tokens: &[usize],
    a: TokenCodes<'_>,
    w: &PackedW8A8,
    out: &mut [f32],
    scratch: &mut GemmScratch,
    par: Par,
) -> Result<(), KernelError> {
    let m = tokens.len();
    check_tokens(a, tokens, w.k())?;
    check_len("out", m * w.n(), out.len())?;
    let kernel = ks.w8a8_for(m, w.order());
    let s = &mut *scratch;
    gather_encoded(a, tokens, w.k_pad(), kernel.encoding, &mut s.encoded);
    s.row_scale.clear();
    s.nan_rows.clear();
    for (i, &t) in tokens.iter().enumerate() {
        let p = a.params[t];
        s.row_scale.push(p.scale);
        if p.has_nan {
            s.nan_rows.push(i);
        }
    }
    run_w8a8_encoded(
        kernel,
        m,
        &s.encoded,
        &s.row_scale,
        w,
        out,
        &mut s.tiles,
        par,
    );
    poison_nan_rows(&s.nan_rows, w.n(), out);
    Ok(())
}
