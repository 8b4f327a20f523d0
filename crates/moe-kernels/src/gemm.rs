//! The GEMM driver: validates arguments, quantises and encodes the activation rows for the
//! chosen kernel, splits the output channels into panel ranges, and runs them sequentially or
//! on the current rayon pool.
//!
//! Every output element is computed by exactly one kernel call in a fixed order, so results are
//! bitwise independent of the thread count. Scratch memory lives in a caller-owned
//! [`GemmScratch`] that only grows, so a warmed-up caller allocates nothing.

use crate::KernelError;
use crate::aligned::AlignedVec;
use crate::dispatch::{KernelSet, W4A8Kernel, W8A8Kernel};
use crate::packed::{PackedW4A8, PackedW8A8, check_len};
use crate::par::{Par, split_panels};
use crate::ukernel::{ActEncoding, Bf16Weights, W4A8Job, W4A8Out, W4Bf16Job, W8A8Job};
use moe_quant::act::quantize_row_asym_i8;

mod tokens;
pub(crate) use tokens::{
    TokenCodes, TokenParams, TokenQuant, quantize_tokens, w4a8_gemm_tokens, w8a8_gemm_tokens,
};

/// Activation rows already quantised asymmetrically (spec §4.2(a)): `x ≈ (q − zp)·recip`.
#[derive(Debug, Clone, Copy)]
pub struct AsymQuantRows<'a> {
    /// Codes `[M, K]`.
    pub q: &'a [i8],
    /// Zero point per row `[M]`, in `[-128, 127]`.
    pub zero_point: &'a [i32],
    /// Dequantisation factor per row `[M]`.
    pub recip: &'a [f32],
}

/// Activation rows already quantised symmetrically (spec §5.3 stage 0): `x ≈ q·scale`.
#[derive(Debug, Clone, Copy)]
pub struct SymQuantRows<'a> {
    /// Codes `[M, K]` in `[-127, 127]`.
    pub q: &'a [i8],
    /// Scale per row `[M]`.
    pub scale: &'a [f32],
}

/// Reusable working memory of the GEMM driver; grows to the largest call and is kept.
#[derive(Debug, Default, Clone)]
pub struct GemmScratch {
    q: Vec<i8>,
    zero_point: Vec<i32>,
    row_scale: Vec<f32>,
    encoded: Vec<u8>,
    corr: Vec<i32>,
    block_corr: Vec<i32>,
    block_words: Vec<i32>,
    nan_rows: Vec<usize>,
    /// The activations in a kernel's own layout (the AMX tiles), when it has one.
    tiles: AlignedVec<u8>,
    /// Float activation rows gathered into a weight format's K order (WNA16 act-order, the
    /// Marlin executor).
    f32_rows: Vec<f32>,
    /// Output rows in a weight format's own column order before they are scattered into the
    /// caller's `out` (the Marlin executor's per-tile accumulators).
    f32_out: Vec<f32>,
    /// Per row and scale group, the sum of a row's activations as a bf16 body rounded them
    /// (weight-only codes with zero points).
    group_sums: Vec<f32>,
}

impl GemmScratch {
    /// Empty scratch; the first calls allocate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Scratch already sized for `m` rows of `k` values, so calls up to that size never allocate.
    pub fn with_capacity(m: usize, k: usize) -> Self {
        let k_pad = k.next_multiple_of(crate::packed::w4a8::K_STEP);
        Self {
            q: Vec::with_capacity(m * k),
            zero_point: Vec::with_capacity(m),
            row_scale: Vec::with_capacity(m),
            encoded: Vec::with_capacity(m * k_pad),
            corr: Vec::with_capacity(m),
            // Scale groups are multiples of 32 values, so a row has at most `k_pad / 32`
            // blocks (one when channelwise).
            block_corr: Vec::with_capacity(m * (k_pad / 32).max(1)),
            block_words: Vec::with_capacity(m * (k_pad / 32).max(1)),
            nan_rows: Vec::with_capacity(m),
            tiles: AlignedVec::new(),
            f32_rows: Vec::new(),
            f32_out: Vec::new(),
            group_sums: Vec::new(),
        }
    }

    /// Sizes the float row buffer for `len` values, so formats that gather their activation
    /// rows (WNA16 act-order) never allocate on the hot path.
    pub(crate) fn reserve_f32_rows(&mut self, len: usize) {
        self.f32_rows
            .reserve(len.saturating_sub(self.f32_rows.len()));
    }

    /// Sizes the kernel-layout buffer for the activation tiles of the bf16 paths
    /// ([`bf16_tile_bytes`]).
    pub(crate) fn reserve_bf16_tiles(&mut self, rows: usize, k: usize) {
        self.reserve_tiles(bf16_tile_bytes(rows, k));
    }

    /// Sizes the kernel-layout buffer for `len` bytes, so kernels that re-lay their activation
    /// rows (see [`KernelSet::layout_bytes`]) never allocate on the hot path.
    pub(crate) fn reserve_tiles(&mut self, len: usize) {
        self.tiles.reserve_total(len);
    }

    /// Sizes the per-group activation sums for `len` values.
    pub(crate) fn reserve_group_sums(&mut self, len: usize) {
        self.group_sums
            .reserve(len.saturating_sub(self.group_sums.len()));
    }

    /// Sizes the staged output buffer for `len` values ([`Self::f32_rows_and_out`]).
    pub(crate) fn reserve_f32_out(&mut self, len: usize) {
        self.f32_out.reserve(len.saturating_sub(self.f32_out.len()));
    }

    /// Float rows gathered into a weight format's K order (`rows` values) and staged output
    /// rows (`outs` values), borrowed together; both keep whatever an earlier call left.
    pub(crate) fn f32_rows_and_out(
        &mut self,
        rows: usize,
        outs: usize,
    ) -> (&mut [f32], &mut [f32]) {
        if self.f32_rows.len() < rows {
            self.f32_rows.resize(rows, 0.0);
        }
        if self.f32_out.len() < outs {
            self.f32_out.resize(outs, 0.0);
        }
        (&mut self.f32_rows[..rows], &mut self.f32_out[..outs])
    }

    /// Float rows gathered into a weight format's K order (`len` values) and the
    /// kernel-layout buffer, borrowed together.
    pub(crate) fn f32_rows_and_tiles(&mut self, len: usize) -> (&mut [f32], &mut AlignedVec<u8>) {
        let (rows, tiles, _) = self.f32_rows_tiles_and_sums(len);
        (rows, tiles)
    }

    /// [`Self::f32_rows_and_tiles`] with the per-group activation sums of a bf16 body.
    pub(crate) fn f32_rows_tiles_and_sums(
        &mut self,
        len: usize,
    ) -> (&mut [f32], &mut AlignedVec<u8>, &mut Vec<f32>) {
        if self.f32_rows.len() < len {
            self.f32_rows.resize(len, 0.0);
        }
        (
            &mut self.f32_rows[..len],
            &mut self.tiles,
            &mut self.group_sums,
        )
    }
}

/// Bytes of the bf16 paths' activation tiles (the AMX-BF16 tiles' layout, which the AVX-512
/// BF16 bodies share) for `rows` rows of `k` values: 16-row tiles of 64-byte chunks of 32 bf16
/// values, the rows past `rows` padded with zeros.
pub(crate) fn bf16_tile_bytes(rows: usize, k: usize) -> usize {
    const TILE_ROWS: usize = 16;
    const CHUNK_VALUES: usize = 32;
    rows.next_multiple_of(TILE_ROWS)
        .saturating_mul(k.div_ceil(CHUNK_VALUES) * 2 * CHUNK_VALUES)
}

/// `out[M, N] = W4A8(x[M, K], w)`: quantises each row of `x` per spec §4.2(a) and runs the
/// W4A8 GEMM of spec §4.5 with the kernels of `ks`.
///
/// Non-finite inputs (spec §4.6): a row containing NaN yields an all-NaN output row; a row
/// whose range overflows the scale (an infinity, or a range too tiny for `255/range`) is
/// quantised as an all-zero row by `moe_quant`, so its output is the bias.
///
/// With [`crate::W4A8Prefill::Bf16Tiles`] chosen in `ks` and enough rows, the rows are not
/// quantised: they are rounded to bf16 and multiplied with the weights dequantized to bf16
/// on the bf16 tiles (other numerics, see [`crate::W4A8Prefill`]); non-finite inputs then
/// propagate as IEEE arithmetic does.
pub fn w4a8_gemm(
    ks: &KernelSet,
    m: usize,
    x: &[f32],
    w: &PackedW4A8,
    out: &mut [f32],
    scratch: &mut GemmScratch,
    par: Par,
) -> Result<(), KernelError> {
    let k = w.k();
    check_len("x", m * k, x.len())?;
    check_len("out", m * w.n(), out.len())?;
    if let Some(tiles) = ks.w4bf16_for(m, w.order()) {
        // SAFETY: the layout function comes from the same `KernelSet` as the entry, registered
        // only where its features are available.
        unsafe { (tiles.tile_a)(x, m, k, &mut scratch.tiles) };
        let job = W4Bf16Job {
            w: Bf16Weights::W4A8(w),
            a_tiles: &scratch.tiles,
            m,
            out: out.as_mut_ptr(),
            ld: w.n(),
        };
        split_panels(w.n_panels(), par, m * w.n() * k, |panels| {
            // SAFETY: the entry comes from a `KernelSet`, which registers it only where its
            // rung and features are available; `x` holds `m·K` values and `out` `m·N` (checked
            // above), borrowed for this whole call; the panel ranges are disjoint and in
            // bounds.
            unsafe { (tiles.entry)(&job, panels) }
        });
        return Ok(());
    }
    let kernel = ks.w4a8_for(m, w);
    let fused = match kernel.encoding {
        ActEncoding::U8Offset128 | ActEncoding::I8BlockCorrected => ks.act_asym_u8(),
        ActEncoding::I8 => None,
    };
    if let Some(quantize) = fused {
        // Fused path: the SIMD quantiser writes `q + 128`, the kernel's encoding or one XOR
        // away from it.
        let k_pad = w.k_pad();
        scratch.encoded.clear();
        scratch.encoded.resize(m * k_pad, kernel.encoding.pad());
        scratch.corr.clear();
        scratch.row_scale.clear();
        scratch.nan_rows.clear();
        for (i, (row, dst)) in x
            .chunks_exact(k)
            .zip(scratch.encoded.chunks_exact_mut(k_pad))
            .enumerate()
        {
            // SAFETY: the quantiser comes from the same `KernelSet`, built from its rung's
            // token; `dst` holds `k_pad ≥ k` bytes.
            let r = unsafe { quantize(row, dst) };
            if kernel.encoding == ActEncoding::I8BlockCorrected {
                dst[..k].iter_mut().for_each(|b| *b ^= 0x80);
            }
            scratch
                .corr
                .push(kernel.encoding.w4a8_row_corr(r.row.zero_point));
            scratch.row_scale.push(r.row.recip);
            if r.has_nan {
                scratch.nan_rows.push(i);
            }
        }
        run_w4a8_encoded(kernel, m, w, scratch, out, par);
        return Ok(());
    }
    let mut q = std::mem::take(&mut scratch.q);
    let mut zero_point = std::mem::take(&mut scratch.zero_point);
    let mut recip = std::mem::take(&mut scratch.row_scale);
    q.resize(m * k, 0);
    zero_point.clear();
    recip.clear();
    scratch.nan_rows.clear();
    for (i, (row, q_row)) in x.chunks_exact(k).zip(q.chunks_exact_mut(k)).enumerate() {
        let r = quantize_row_asym_i8(row, q_row);
        zero_point.push(r.zero_point);
        recip.push(r.recip);
        if has_nan(row) {
            scratch.nan_rows.push(i);
        }
    }
    let a = AsymQuantRows {
        q: &q,
        zero_point: &zero_point,
        recip: &recip,
    };
    let result = w4a8_gemm_quantized(ks, m, a, w, out, scratch, par);
    poison_nan_rows(&scratch.nan_rows, w.n(), out);
    scratch.q = q;
    scratch.zero_point = zero_point;
    scratch.row_scale = recip;
    result
}

/// `out[M, N]` from activation rows the caller already quantised (the microkernel boundary).
pub fn w4a8_gemm_quantized(
    ks: &KernelSet,
    m: usize,
    a: AsymQuantRows<'_>,
    w: &PackedW4A8,
    out: &mut [f32],
    scratch: &mut GemmScratch,
    par: Par,
) -> Result<(), KernelError> {
    check_len("out", m * w.n(), out.len())?;
    let kernel = ks.w4a8_for(m, w);
    prepare_w4a8(m, a, w, kernel.encoding, scratch)?;
    let rows = EncodedRows {
        a: &scratch.encoded,
        corr: &scratch.corr,
        block_corr: &scratch.block_corr,
        block_words: &scratch.block_words,
        recip: a.recip,
    };
    run_w4a8(kernel, m, w, rows, &mut scratch.tiles, out, par);
    Ok(())
}

/// Runs the kernel on the rows `scratch` holds in its encoding (`encoded`, `corr`, `row_scale`
/// and `nan_rows` filled for `m` rows): makes the block corrections if the encoding needs them,
/// multiplies, and turns the rows that held a NaN into NaN rows.
fn run_w4a8_encoded(
    kernel: W4A8Kernel,
    m: usize,
    w: &PackedW4A8,
    scratch: &mut GemmScratch,
    out: &mut [f32],
    par: Par,
) {
    let s = &mut *scratch;
    s.block_corr.clear();
    s.block_words.clear();
    if kernel.encoding.needs_block_corr() {
        block_corrections(
            w,
            &s.encoded,
            &s.corr,
            &mut s.block_corr,
            &mut s.block_words,
        );
    }
    let rows = EncodedRows {
        a: &s.encoded,
        corr: &s.corr,
        block_corr: &s.block_corr,
        block_words: &s.block_words,
        recip: &s.row_scale,
    };
    run_w4a8(kernel, m, w, rows, &mut s.tiles, out, par);
    poison_nan_rows(&s.nan_rows, w.n(), out);
}

/// Whether a row holds a NaN; branch-free so that it vectorises (an early exit would keep the
/// loop scalar, and rows without NaN, the usual case, are read to the end anyway).
fn has_nan(row: &[f32]) -> bool {
    row.iter().fold(false, |nan, v| nan | v.is_nan())
}

/// Activation rows in a kernel's encoding, with their corrections.
struct EncodedRows<'a> {
    /// `[m][k_pad]` encoded codes.
    a: &'a [u8],
    /// Per-row correction ([`ActEncoding::w4a8_row_corr`]).
    corr: &'a [i32],
    /// Per-(row, block) correction, `[m][n_blocks]`, when the encoding needs it.
    block_corr: &'a [i32],
    /// The same as paired words ([`W4A8Job::block_words`]), when blocks are short enough.
    block_words: &'a [i32],
    /// Per-row dequantization factor.
    recip: &'a [f32],
}

/// Runs the kernel on rows already encoded for it.
///
/// Callers guarantee (and this function's safety argument relies on): the rows hold `m` rows
/// of `w.k_pad()` bytes in `kernel.encoding`, `m` corrections and factors with the zero points
/// in `[-128, 127]`, `m·n_blocks` block corrections if the encoding needs them, and `out`
/// holds `m·N` elements. `tiles` receives the kernel's own layout of the rows, if it has one.
fn run_w4a8(
    kernel: W4A8Kernel,
    m: usize,
    w: &PackedW4A8,
    rows: EncodedRows<'_>,
    tiles: &mut AlignedVec<u8>,
    out: &mut [f32],
    par: Par,
) {
    assert!(
        rows.a.len() == m * w.k_pad()
            && rows.corr.len() == m
            && rows.recip.len() == m
            && (!kernel.encoding.needs_block_corr()
                || (rows.block_corr.len() == m * w.n_blocks()
                    && rows.block_words.len()
                        == if paired_blocks(w.block_len()) {
                            m * w.n_blocks()
                        } else {
                            0
                        })),
        "run_w4a8: rows not prepared"
    );
    assert_eq!(out.len(), m * w.n(), "run_w4a8: output length");
    let a_tiles: &[u8] = match kernel.tile_a {
        Some(tile_a) => {
            tile_a(rows.a, rows.corr, m, w, tiles);
            tiles
        }
        None => &[],
    };
    let job = W4A8Job {
        w,
        a: rows.a,
        a_tiles,
        row_corr: rows.corr,
        block_corr: rows.block_corr,
        block_words: rows.block_words,
        row_recip: rows.recip,
        m,
        out: W4A8Out::Values {
            ptr: out.as_mut_ptr(),
            ld: w.n(),
        },
    };
    let macs = m * w.n() * w.k();
    split_panels(w.n_panels(), par, macs, |panels| {
        // SAFETY: `kernel` comes from a `KernelSet`, which only exists for rungs this CPU
        // supports; the rows were validated and encoded for this kernel (asserted above, zero
        // points checked by the callers); `out` holds exactly `m·N` elements and is borrowed
        // mutably for this whole call; `split_panels` hands out disjoint panel ranges inside
        // `0..n_panels`.
        unsafe { (kernel.entry)(&job, panels) }
    });
}

/// `κ = 8·(Σ_{k∈b} q_k − zp·B)` per row and scale block, for [`ActEncoding::I8BlockCorrected`]
/// (`encoded` holds the raw codes, padding 0; `zp` is the row correction, the zero point), and
/// where blocks are short enough for the paired correction, the same corrections as the
/// [`W4A8Job::block_words`] those kernels read (`words` is left empty otherwise).
fn block_corrections(
    w: &PackedW4A8,
    encoded: &[u8],
    zp: &[i32],
    dst: &mut Vec<i32>,
    words: &mut Vec<i32>,
) {
    let (k_pad, block_len) = (w.k_pad(), w.block_len());
    dst.clear();
    words.clear();
    for (row, &zp) in encoded.chunks_exact(k_pad).zip(zp) {
        // Wrapping, as the kernels' own int32 sums: the final `acc_i` is exact whenever it
        // fits, whatever its parts do.
        let zp_block = zp.wrapping_mul(block_len as i32);
        dst.extend(row.chunks_exact(block_len).map(|block| {
            let sum = block
                .iter()
                .fold(0i32, |s, &b| s.wrapping_add(i32::from(b as i8)));
            sum.wrapping_sub(zp_block).wrapping_mul(8)
        }));
    }
    let (m, n_blocks) = (zp.len(), w.n_blocks());
    if paired_blocks(block_len) && n_blocks > 0 {
        // Block-major, so that a tile finds the words of its rows for one block side by side.
        words.resize(m * n_blocks, 0);
        for (r, (kappas, &zp)) in dst.chunks_exact(n_blocks).zip(zp).enumerate() {
            for (b, &kappa) in kappas.iter().enumerate() {
                words[b * m + r] = paired_word(kappa, zp);
            }
        }
    }
}

/// Whether blocks of `block_len` values take the paired correction: a block's code sum
/// (`Σc ≤ 15·B`) and every `κ/8` (`|Σ (q − zp)| ≤ 255·B`) are then both i16.
pub(crate) fn paired_blocks(block_len: usize) -> bool {
    block_len * 255 < 1 << 15
}

/// The paired correction word of a row and block: `−κ/8` in the high i16 (`κ` is a multiple of
/// 8, so `−κ << 13` puts it there) and `−zp` in the low one.
fn paired_word(kappa: i32, zp: i32) -> i32 {
    (kappa.wrapping_neg() << 13) | (zp.wrapping_neg() & 0xFFFF)
}

/// The int32 block accumulators `[m][n_blocks][16·n_panels]` (padded channels included), for
/// comparing rungs with the reference exactly.
#[cfg(test)]
pub(crate) fn w4a8_block_acc(
    ks: &KernelSet,
    m: usize,
    a: AsymQuantRows<'_>,
    w: &PackedW4A8,
) -> Result<Vec<i32>, KernelError> {
    let mut scratch = GemmScratch::new();
    // Block accumulators exist on the exact numerics only.
    let ks = ks.with_w4a8_prefill(crate::W4A8Prefill::ExactInt8);
    let kernel = ks.w4a8_for(m, w);
    prepare_w4a8(m, a, w, kernel.encoding, &mut scratch)?;
    let mut acc = vec![0i32; m * w.n_blocks() * w.n_panels() * crate::packed::PANEL];
    if let Some(tile_a) = kernel.tile_a {
        tile_a(&scratch.encoded, &scratch.corr, m, w, &mut scratch.tiles);
    }
    let job = W4A8Job {
        w,
        a: &scratch.encoded,
        a_tiles: &scratch.tiles,
        row_corr: &scratch.corr,
        block_corr: &scratch.block_corr,
        block_words: &scratch.block_words,
        row_recip: a.recip,
        m,
        out: W4A8Out::BlockAcc {
            ptr: acc.as_mut_ptr(),
        },
    };
    // SAFETY: as in `w4a8_gemm_quantized`; `acc` holds the whole `[m][n_blocks][n_pad]` buffer.
    unsafe { (kernel.entry)(&job, 0..w.n_panels()) };
    Ok(acc)
}

/// Validates quantised rows and writes the kernel's encoding and row corrections into scratch.
fn prepare_w4a8(
    m: usize,
    a: AsymQuantRows<'_>,
    w: &PackedW4A8,
    encoding: ActEncoding,
    scratch: &mut GemmScratch,
) -> Result<(), KernelError> {
    let (k, k_pad) = (w.k(), w.k_pad());
    check_len("q", m * k, a.q.len())?;
    check_len("zero_point", m, a.zero_point.len())?;
    check_len("recip", m, a.recip.len())?;
    if let Some(index) = a
        .zero_point
        .iter()
        .position(|zp| !(-128..=127).contains(zp))
    {
        return Err(KernelError::ValueOutOfRange {
            tensor: "zero_point",
            index,
            value: i64::from(a.zero_point[index]),
            min: -128,
            max: 127,
        });
    }
    encode_rows(a.q, m, k, k_pad, encoding, &mut scratch.encoded);
    scratch.corr.clear();
    scratch
        .corr
        .extend(a.zero_point.iter().map(|&zp| encoding.w4a8_row_corr(zp)));
    scratch.block_corr.clear();
    scratch.block_words.clear();
    if encoding.needs_block_corr() {
        block_corrections(
            w,
            &scratch.encoded,
            &scratch.corr,
            &mut scratch.block_corr,
            &mut scratch.block_words,
        );
    }
    Ok(())
}

/// Copies `m` rows of `k` codes into `[m][k_pad]` bytes in the kernel's encoding (one loop per
/// encoding, so that each vectorises).
fn encode_rows(q: &[i8], m: usize, k: usize, k_pad: usize, enc: ActEncoding, dst: &mut Vec<u8>) {
    dst.clear();
    dst.resize(m * k_pad, enc.pad());
    if k == 0 {
        return;
    }
    for (src, row) in q.chunks_exact(k).zip(dst.chunks_exact_mut(k_pad)) {
        let row = &mut row[..k];
        match enc {
            ActEncoding::I8 | ActEncoding::I8BlockCorrected => {
                for (d, &s) in row.iter_mut().zip(src) {
                    *d = s as u8;
                }
            }
            ActEncoding::U8Offset128 => {
                for (d, &s) in row.iter_mut().zip(src) {
                    *d = (s as u8) ^ 0x80;
                }
            }
        }
    }
}

/// `out[M, N] = W8A8(x[M, K], w)`: quantises each row of `x` symmetrically per spec §5.3
/// stage 0 and multiplies with the int8 weights. A row containing NaN yields an all-NaN row.
pub fn w8a8_gemm(
    ks: &KernelSet,
    m: usize,
    x: &[f32],
    w: &PackedW8A8,
    out: &mut [f32],
    scratch: &mut GemmScratch,
    par: Par,
) -> Result<(), KernelError> {
    let k = w.k();
    check_len("x", m * k, x.len())?;
    check_len("out", m * w.n(), out.len())?;
    let kernel = ks.w8a8_for(m, w.order());
    let mut scale = std::mem::take(&mut scratch.row_scale);
    scale.clear();
    scratch.nan_rows.clear();
    if let Some(quantize) = ks.act_sym() {
        // Fused: one pass over each row quantises, encodes and looks for NaN.
        let k_pad = w.k_pad();
        let flip = kernel.encoding.encode(0);
        let mut encoded = std::mem::take(&mut scratch.encoded);
        encoded.clear();
        encoded.resize(m * k_pad, kernel.encoding.pad());
        for (i, (row, dst)) in x
            .chunks_exact(k)
            .zip(encoded.chunks_exact_mut(k_pad))
            .enumerate()
        {
            // SAFETY: the quantiser comes from the same `KernelSet`, built from its rung's
            // token; `dst` holds `k_pad ≥ k` bytes.
            let r = unsafe { quantize(row, dst, flip) };
            scale.push(r.scale);
            if r.has_nan {
                scratch.nan_rows.push(i);
            }
        }
        run_w8a8_encoded(kernel, m, &encoded, &scale, w, out, &mut scratch.tiles, par);
        scratch.encoded = encoded;
    } else {
        let mut q = std::mem::take(&mut scratch.q);
        q.resize(m * k, 0);
        for (i, (row, q_row)) in x.chunks_exact(k).zip(q.chunks_exact_mut(k)).enumerate() {
            scale.push(moe_quant::act::quantize_row_sym_i8(row, q_row));
            if has_nan(row) {
                scratch.nan_rows.push(i);
            }
        }
        let rows = SymQuantRows {
            q: &q,
            scale: &scale,
        };
        run_w8a8(ks, m, rows, w, out, scratch, par)?;
        scratch.q = q;
    }
    poison_nan_rows(&scratch.nan_rows, w.n(), out);
    scratch.row_scale = scale;
    Ok(())
}

/// Sets every listed output row to NaN (rows whose input held a NaN, spec §4.6).
fn poison_nan_rows(rows: &[usize], n: usize, out: &mut [f32]) {
    for &row in rows {
        out[row * n..][..n].fill(f32::NAN);
    }
}

/// `out[M, N]` from symmetric activation rows the caller already quantised.
pub fn w8a8_gemm_quantized(
    ks: &KernelSet,
    m: usize,
    a: SymQuantRows<'_>,
    w: &PackedW8A8,
    out: &mut [f32],
    scratch: &mut GemmScratch,
    par: Par,
) -> Result<(), KernelError> {
    if let Some(index) = a.q.iter().position(|&v| v == i8::MIN) {
        return Err(KernelError::ValueOutOfRange {
            tensor: "q",
            index,
            value: -128,
            min: -127,
            max: 127,
        });
    }
    run_w8a8(ks, m, a, w, out, scratch, par)
}

/// [`w8a8_gemm_quantized`] for codes known to lie in `[-127, 127]` (the quantisers' output).
fn run_w8a8(
    ks: &KernelSet,
    m: usize,
    a: SymQuantRows<'_>,
    w: &PackedW8A8,
    out: &mut [f32],
    scratch: &mut GemmScratch,
    par: Par,
) -> Result<(), KernelError> {
    let (k, k_pad) = (w.k(), w.k_pad());
    check_len("out", m * w.n(), out.len())?;
    check_len("q", m * k, a.q.len())?;
    check_len("scale", m, a.scale.len())?;
    let kernel = ks.w8a8_for(m, w.order());
    encode_rows(a.q, m, k, k_pad, kernel.encoding, &mut scratch.encoded);
    let s = &mut *scratch;
    run_w8a8_encoded(kernel, m, &s.encoded, a.scale, w, out, &mut s.tiles, par);
    Ok(())
}

/// Runs the W8A8 kernel on rows already encoded for it: `encoded` holds `m` rows of
/// `w.k_pad()` bytes in `kernel.encoding` with codes in `[-127, 127]`, `scale` `m` row scales,
/// and `out` `m·N` elements (callers check the lengths; asserted here). `tiles` receives the
/// kernel's own layout of the rows, if it has one.
#[allow(clippy::too_many_arguments)]
fn run_w8a8_encoded(
    kernel: W8A8Kernel,
    m: usize,
    encoded: &[u8],
    scale: &[f32],
    w: &PackedW8A8,
    out: &mut [f32],
    tiles: &mut AlignedVec<u8>,
    par: Par,
) {
    assert!(
        encoded.len() == m * w.k_pad() && scale.len() == m && out.len() == m * w.n(),
        "run_w8a8_encoded: rows not prepared"
    );
    let k = w.k();
    let a_tiles: &[u8] = match kernel.tile_a {
        Some(tile_a) => {
            tile_a(encoded, m, w.k_pad(), tiles);
            tiles
        }
        None => &[],
    };
    let job = W8A8Job {
        w,
        a: encoded,
        a_tiles,
        row_scale: scale,
        m,
        out: out.as_mut_ptr(),
        ld: w.n(),
    };
    split_panels(w.n_panels(), par, m * w.n() * k, |panels| {
        // SAFETY: as in `w4a8_gemm_quantized`: the kernel's rung is available, the rows were
        // encoded for it with codes in `[-127, 127]` (asserted lengths above), `out` holds
        // `m·N` elements and the panel ranges are disjoint and in bounds.
        unsafe { (kernel.entry)(&job, panels) }
    });
}
