//! The packed int4 weight format of the W4A8 GEMM: nibble panels and per-block scales, built once
//! from int4 values stored as i8.
//!
//! Layout (per matrix; `P = ceil(N/16)` panels, `Kp = K` rounded up to 8, `B` blocks per row):
//!
//! - `nibbles[(p·Kp/8 + s)·64 + j]`, for panel `p`, step `s` (K values `8s..8s+8`) and byte `j`:
//!   channel `16p + j/4`, low nibble = `w[8s + j%4] + 8`, high nibble = `w[8s + 4 + j%4] + 8`.
//!   Unpacking the low nibbles of 64 bytes therefore gives the `vpdpbusd` operand for K values
//!   `8s..8s+4` of 16 channels, the high nibbles the one for `8s+4..8s+8`.
//!   That is the [`PanelOrder::Lanes`] order; in the [`PanelOrder::Pairs`] order (the `smmla`
//!   operand, chosen at pack time with [`PackedW4A8::with_order`]) steps `2t` and `2t + 1` form
//!   128 bytes instead: byte `16u + 8h + i` (`u < 8`, `h < 2`, `i < 8`) is channel
//!   `16p + 2u + h`, low nibble = `w[16t + i] + 8`, high nibble = `w[16t + 8 + i] + 8`. An odd
//!   last step stays in the lane order.
//! - `scales[(p·B + b)·16 + c]`: the scale of channel `16p + c` in block `b`, kept as the caller
//!   gave it: bf16 for group scales (they widen to f32 exactly), f32 for channelwise ones.
//! - `bias[16p + c]` when present.
//!
//! Channels past `N` and K values past `K` are zero weights with zero scale and bias.
//!
//! Decode streams every byte of this format from DRAM once per call, so it holds nothing that
//! can be derived: the per-block weight sums `Σw` that the zero-point correction needs are
//! recomputed by the kernels from the nibbles they already have in registers (the aarch64 neon
//! tile recounts the code sums from L1 with `block_code_sum`). At group size 32 that is 0.5625 bytes per
//! weight, the size of the checkpoint's own int4 codes and bf16 scales.

use std::num::NonZeroUsize;

use crate::aligned::AlignedVec;
use half::bf16;
use moe_quant::WeightGroups;

use super::{PANEL, PanelOrder, STEP_BYTES, check_len, round_up};
use crate::KernelError;

/// K values per packed step (one 64-byte vector of nibbles).
pub(crate) const K_STEP: usize = 8;

/// Largest supported K: int32 block sums stay exact while `K·255·8 < 2^31` (spec §4.6).
pub const MAX_K: usize = (1 << 20) - 1;

/// Looks up the scale of (row, block) in the caller's scales while packing.
type BlockScale<'a> = Box<dyn Fn(usize, usize) -> Scale + 'a>;

/// One caller scale, in its own precision.
#[derive(Clone, Copy)]
enum Scale {
    Bf16(bf16),
    F32(f32),
}

/// The weight scales of a W4A8 matrix, as the spec stores them (§4.3).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum W4A8Scales<'a> {
    /// One f32 scale per output channel, `[N]` (equivalently `[N, 1]`).
    Channelwise(&'a [f32]),
    /// bf16 scales `[N, K / group_size]` for groups of `group_size` K values; `group_size` must
    /// be a multiple of 32 dividing K. `group_size == K` is channelwise.
    Grouped {
        /// K values per group.
        group_size: usize,
        /// Row-major `[N, K / group_size]`.
        scales: &'a [bf16],
    },
}

/// An int4 weight matrix `[N, K]` packed for the W4A8 kernels; immutable once built.
/// Equality compares the packed bytes, so two builds of the same weights can be checked equal.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedW4A8 {
    n: usize,
    k: usize,
    k_pad: usize,
    groups: WeightGroups,
    /// K values per scale block: the group size, or `k_pad` channelwise (derived from
    /// `groups`, kept for the kernels' inner loops).
    block_len: usize,
    n_blocks: usize,
    n_panels: usize,
    /// The order of the bytes inside each panel.
    order: PanelOrder,
    nibbles: AlignedVec<u8>,
    scales: BlockScales,
    bias: Option<Vec<f32>>,
}

/// Per-block scales in the precision they arrived in, `[n_panels][n_blocks][16]`.
#[derive(Debug, Clone, PartialEq)]
enum BlockScales {
    /// Group scales: bf16 in the checkpoint, so storing them as bf16 loses nothing and halves
    /// the scale bytes streamed per call.
    Bf16(Vec<bf16>),
    /// Channelwise f32 scales (one block per channel, so their size does not matter).
    F32(Vec<f32>),
}

impl PackedW4A8 {
    /// Packs `w` (`[N, K]` row-major, values in `[-8, 7]`) with its scales and optional f32
    /// bias `[N]`, in the [`PanelOrder::Lanes`] order. Every shape, length and value is checked
    /// here, so the kernels need not.
    pub fn pack(
        n: usize,
        k: usize,
        w: &[i8],
        scales: W4A8Scales<'_>,
        bias: Option<&[f32]>,
    ) -> Result<Self, KernelError> {
        if k == 0 || k > MAX_K {
            return Err(KernelError::UnsupportedDim {
                dim: "K",
                got: k,
                reason: "K must be in 1..2^20 (int32 block sums must stay exact)",
            });
        }
        let expected_len = n.checked_mul(k).ok_or(KernelError::UnsupportedDim {
            dim: "N",
            got: n,
            reason: "N·K overflows usize",
        })?;
        check_len("w_int4", expected_len, w.len())?;
        if !super::all_branch_free(w, |v| (-8..=7).contains(&v))
            && let Some(index) = w.iter().position(|v| !(-8..=7).contains(v))
        {
            return Err(KernelError::ValueOutOfRange {
                tensor: "w_int4",
                index,
                value: i64::from(w[index]),
                min: -8,
                max: 7,
            });
        }
        if let Some(b) = bias {
            check_len("bias", n, b.len())?;
        }

        // Resolve the grouping to (grouping, per-block scale lookup).
        let (groups, block_scale): (WeightGroups, BlockScale<'_>) = match scales {
            W4A8Scales::Channelwise(s) => {
                check_len("scales", n, s.len())?;
                (
                    WeightGroups::Channelwise,
                    Box::new(move |row, _| Scale::F32(s[row])),
                )
            }
            W4A8Scales::Grouped {
                group_size,
                scales: s,
            } => {
                let Some(g) = NonZeroUsize::new(group_size)
                    .filter(|g| g.get() % 32 == 0 && k.is_multiple_of(g.get()))
                else {
                    return Err(KernelError::InvalidGroupSize { group_size, k });
                };
                let per_row = k / group_size;
                check_len("scales", n * per_row, s.len())?;
                let groups = if group_size < k {
                    WeightGroups::Groups(g)
                } else {
                    WeightGroups::Channelwise
                };
                (
                    groups,
                    Box::new(move |row, b| Scale::Bf16(s[row * per_row + b])),
                )
            }
        };
        if groups.is_channelwise() && !k.is_multiple_of(2) {
            return Err(KernelError::UnsupportedDim {
                dim: "K",
                got: k,
                reason: "channelwise int4 weights need an even K (values are packed in pairs)",
            });
        }

        let k_pad = round_up(k, K_STEP);
        let block_len = groups.group_size().unwrap_or(k_pad);
        let n_blocks = k_pad / block_len;
        let n_panels = n.div_ceil(PANEL);
        let steps = k_pad / K_STEP;
        let weight = |row: usize, col: usize| -> i8 {
            if row < n && col < k {
                w[row * k + col]
            } else {
                0
            }
        };

        let mut nibbles = AlignedVec::zeroed(n_panels * steps * STEP_BYTES);
        let n_scales = n_panels * n_blocks * PANEL;
        let mut block_scales = match groups {
            WeightGroups::Groups(_) => BlockScales::Bf16(vec![bf16::ZERO; n_scales]),
            WeightGroups::Channelwise => BlockScales::F32(vec![0.0; n_scales]),
        };
        // Whole steps of real channels read eight consecutive values of one row; only the last
        // step of a row whose K is not a multiple of 8, and channels past N, take the padded
        // lookup. Both give the same bytes.
        let full_steps = k / K_STEP;
        for p in 0..n_panels {
            let panel = &mut nibbles[p * steps * STEP_BYTES..][..steps * STEP_BYTES];
            for c in 0..PANEL {
                let row = p * PANEL + c;
                if row >= n {
                    for step in panel.chunks_exact_mut(STEP_BYTES) {
                        step[c * 4..c * 4 + 4].fill(0x88);
                    }
                    continue;
                }
                let src = &w[row * k..][..k];
                for (s, v) in src.chunks_exact(K_STEP).enumerate() {
                    let dst = &mut panel[s * STEP_BYTES + c * 4..][..4];
                    for (t, d) in dst.iter_mut().enumerate() {
                        *d = ((v[t] + 8) as u8) | (((v[t + 4] + 8) as u8) << 4);
                    }
                }
                for s in full_steps..steps {
                    for t in 0..4 {
                        let lo = (weight(row, K_STEP * s + t) + 8) as u8;
                        let hi = (weight(row, K_STEP * s + 4 + t) + 8) as u8;
                        panel[s * STEP_BYTES + c * 4 + t] = lo | (hi << 4);
                    }
                }
            }
            for b in 0..n_blocks {
                for c in 0..PANEL {
                    let row = p * PANEL + c;
                    if row >= n {
                        continue;
                    }
                    let at = (p * n_blocks + b) * PANEL + c;
                    match (&mut block_scales, block_scale(row, b)) {
                        (BlockScales::Bf16(v), Scale::Bf16(x)) => v[at] = x,
                        (BlockScales::F32(v), Scale::F32(x)) => v[at] = x,
                        // `group_size == K` keeps bf16 group scales channelwise: widen exactly.
                        (BlockScales::F32(v), Scale::Bf16(x)) => v[at] = x.to_f32(),
                        (BlockScales::Bf16(_), Scale::F32(_)) => {
                            unreachable!("f32 scales are channelwise, which stores f32")
                        }
                    }
                }
            }
        }
        let bias = bias.map(|b| {
            let mut padded = vec![0f32; n_panels * PANEL];
            padded[..n].copy_from_slice(b);
            padded
        });
        Ok(Self {
            n,
            k,
            k_pad,
            groups,
            block_len,
            n_blocks,
            n_panels,
            order: PanelOrder::Lanes,
            nibbles,
            scales: block_scales,
            bias,
        })
    }

    /// Output channels N.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Reduction dimension K.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The scale grouping; channelwise also for group scales with `group_size == K`.
    pub fn groups(&self) -> WeightGroups {
        self.groups
    }

    /// Whether a bias is added.
    pub fn has_bias(&self) -> bool {
        self.bias.is_some()
    }

    /// Scale blocks per output channel (1 for channelwise).
    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Bytes of packed data (nibbles, scales, bias).
    pub fn packed_bytes(&self) -> usize {
        let scales = match &self.scales {
            BlockScales::Bf16(v) => 2 * v.len(),
            BlockScales::F32(v) => 4 * v.len(),
        };
        self.nibbles.len() + scales + 4 * self.bias.as_ref().map_or(0, Vec::len)
    }

    /// The order of the bytes inside the panels.
    pub fn order(&self) -> PanelOrder {
        self.order
    }

    /// The same weights in the panel order `order` (a kernel set's choice is
    /// [`crate::KernelSet::panel_order`]); the values, scales and sizes are unchanged.
    #[must_use]
    pub fn with_order(mut self, order: PanelOrder) -> Self {
        if order == self.order {
            return self;
        }
        let steps = self.k_pad / K_STEP;
        let len = steps * STEP_BYTES;
        let mut out = AlignedVec::zeroed(self.nibbles.len());
        for (src, dst) in self
            .nibbles
            .chunks_exact(len)
            .zip(out.chunks_exact_mut(len))
        {
            for c in 0..PANEL {
                for k in 0..self.k_pad {
                    let code = code_of(src, self.order, steps, c, k);
                    let (at, high) = code_at(order, steps, c, k);
                    dst[at] |= if high { code << 4 } else { code };
                }
            }
        }
        self.nibbles = out;
        self.order = order;
        self
    }

    /// Rebuilds the `[N, K]` int4 values: the inverse of [`PackedW4A8::pack`] for the weights
    /// (in either order), used by tests and inspection tools.
    pub fn unpack_int4(&self) -> Vec<i8> {
        let steps = self.k_pad / K_STEP;
        let mut w = vec![0i8; self.n * self.k];
        for row in 0..self.n {
            let (p, c) = (row / PANEL, row % PANEL);
            let panel = self.panel_nibbles(p);
            for col in 0..self.k {
                w[row * self.k + col] = code_of(panel, self.order, steps, c, col) as i8 - 8;
            }
        }
        w
    }

    /// Step `s` of panel `p` in the lane order, whatever the stored order: the bytes the
    /// portable body reads.
    pub(crate) fn lanes_step(&self, p: usize, s: usize) -> [u8; STEP_BYTES] {
        let steps = self.k_pad / K_STEP;
        let panel = self.panel_nibbles(p);
        if !self.order.paired(s, steps) {
            return panel[s * STEP_BYTES..][..STEP_BYTES].try_into().unwrap();
        }
        let mut out = [0u8; STEP_BYTES];
        for c in 0..PANEL {
            for r in 0..K_STEP {
                let code = code_of(panel, self.order, steps, c, K_STEP * s + r);
                out[4 * c + r % 4] |= if r < 4 { code } else { code << 4 };
            }
        }
        out
    }

    /// K rounded up to the packed step; activation rows are padded to this length.
    pub(crate) fn k_pad(&self) -> usize {
        self.k_pad
    }

    /// K values per scale block (`k_pad` for channelwise).
    pub(crate) fn block_len(&self) -> usize {
        self.block_len
    }

    /// Number of 16-channel panels.
    pub(crate) fn n_panels(&self) -> usize {
        self.n_panels
    }

    /// The nibbles of panel `p`: `k_pad/8` steps of 64 bytes.
    pub(crate) fn panel_nibbles(&self, p: usize) -> &[u8] {
        let len = self.k_pad / K_STEP * STEP_BYTES;
        &self.nibbles[p * len..][..len]
    }

    /// The f32 scales of block `b` of panel `p`, widened from bf16 where stored so (exact).
    #[inline(always)]
    pub(crate) fn block_scales(&self, p: usize, b: usize) -> [f32; PANEL] {
        let at = (p * self.n_blocks + b) * PANEL;
        match &self.scales {
            BlockScales::Bf16(v) => {
                let v: &[bf16; PANEL] = v[at..][..PANEL].try_into().unwrap();
                let mut out = [0f32; PANEL];
                for (o, x) in out.iter_mut().zip(v) {
                    *o = f32::from_bits(u32::from(x.to_bits()) << 16);
                }
                out
            }
            BlockScales::F32(v) => v[at..][..PANEL].try_into().unwrap(),
        }
    }

    /// `Σ_{k∈b} c` of the codes `c = w + 8` of the panel's channels `channels` (a range inside
    /// `0..16`; the others read 0) in block `b` of panel `p`, recounted from the nibbles: the
    /// aarch64 neon tile multiplies the codes themselves
    /// ([`crate::ukernel::ActEncoding::I8BlockCorrected`]) with no dot product to spare for
    /// their sums, so it reads the block it has just streamed through L1 again for them.
    /// Padding K values are code 8.
    #[cfg(any(test, target_arch = "aarch64"))]
    #[inline(always)]
    pub(crate) fn block_code_sum(
        &self,
        p: usize,
        b: usize,
        channels: std::ops::Range<usize>,
    ) -> [i32; PANEL] {
        let steps_per_block = self.block_len / K_STEP;
        let nibbles = &self.panel_nibbles(p)[b * steps_per_block * STEP_BYTES..]
            [..steps_per_block * STEP_BYTES];
        // Blocks start on even steps (a group is a multiple of 4 steps; channelwise is one
        // block), so a block holds whole pairs and, channelwise, an odd last step.
        let paired = match self.order {
            PanelOrder::Pairs => steps_per_block & !1,
            PanelOrder::Lanes => 0,
        };
        let (pairs, lanes) = nibbles.split_at(paired * STEP_BYTES);
        // Σ of the codes fits u32 for any block (at most 2^17 steps of 8 codes ≤ 15 per channel).
        let mut codes = [0u32; PANEL];
        for pair in pairs.as_chunks::<{ 2 * STEP_BYTES }>().0 {
            let octets = &pair.as_chunks::<8>().0[channels.clone()];
            for (sum, octet) in codes[channels.clone()].iter_mut().zip(octets) {
                let q = u64::from_le_bytes(*octet);
                let lo = q & 0x0F0F_0F0F_0F0F_0F0F;
                let hi = (q >> 4) & 0x0F0F_0F0F_0F0F_0F0F;
                // Bytes of `lo + hi` are ≤ 30, and 8 of them ≤ 240: summing cannot carry.
                *sum += ((lo + hi).wrapping_mul(0x0101_0101_0101_0101) >> 56) as u32;
            }
        }
        for step in lanes.as_chunks::<STEP_BYTES>().0 {
            let quads = &step.as_chunks::<4>().0[channels.clone()];
            for (sum, quad) in codes[channels.clone()].iter_mut().zip(quads) {
                let q = u32::from_le_bytes(*quad);
                let lo = q & 0x0F0F_0F0F;
                let hi = (q >> 4) & 0x0F0F_0F0F;
                // Bytes of `lo + hi` are ≤ 30: summing the four bytes cannot carry.
                *sum += (lo + hi).wrapping_mul(0x0101_0101) >> 24;
            }
        }
        // At most 15·2^20 < 2^31.
        codes.map(|sum| sum as i32)
    }

    /// `Σ_{k∈b} w` of the 16 channels of block `b` of panel `p`: the code sums less `8·B`, so
    /// padding K values (weight 0) add nothing.
    #[cfg(test)]
    pub(crate) fn block_wsum(&self, p: usize, b: usize) -> [i32; PANEL] {
        let bias = 8 * self.block_len as i64;
        self.block_code_sum(p, b, 0..PANEL)
            .map(|sum| (i64::from(sum) - bias) as i32)
    }

    /// The bias of panel `p`: 16 values, if any.
    pub(crate) fn panel_bias(&self, p: usize) -> Option<&[f32]> {
        self.bias.as_deref().map(|b| &b[p * PANEL..][..PANEL])
    }
}

/// Where the code of channel `c` (of a panel) at K value `k` lies in a panel of `steps` steps
/// stored in `order`: the byte, and whether it is the high nibble.
fn code_at(order: PanelOrder, steps: usize, c: usize, k: usize) -> (usize, bool) {
    let s = k / K_STEP;
    if order.paired(s, steps) {
        let (t, kk) = (k / (2 * K_STEP), k % (2 * K_STEP));
        (t * 2 * STEP_BYTES + 8 * c + kk % K_STEP, kk >= K_STEP)
    } else {
        let r = k % K_STEP;
        (s * STEP_BYTES + 4 * c + r % 4, r >= 4)
    }
}

/// The code of channel `c` at K value `k` in the panel bytes `panel` stored in `order`.
fn code_of(panel: &[u8], order: PanelOrder, steps: usize, c: usize, k: usize) -> u8 {
    let (at, high) = code_at(order, steps, c, k);
    if high {
        panel[at] >> 4
    } else {
        panel[at] & 0x0F
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moe_testutil::SplitMix64;

    #[test]
    fn unpack_inverts_pack() {
        let mut rng = SplitMix64::new(7);
        for &(n, k, g) in &[
            (1, 2, None),
            (17, 70, None),
            (33, 64, Some(32)),
            (16, 256, Some(128)),
        ] {
            let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-8, 7) as i8).collect();
            let packed = match g {
                None => {
                    let s = vec![1.0f32; n];
                    PackedW4A8::pack(n, k, &w, W4A8Scales::Channelwise(&s), None)
                }
                Some(g) => {
                    let s = vec![bf16::ONE; n * k / g];
                    let scales = W4A8Scales::Grouped {
                        group_size: g,
                        scales: &s,
                    };
                    PackedW4A8::pack(n, k, &w, scales, None)
                }
            }
            .unwrap();
            assert_eq!(packed.unpack_int4(), w, "n={n} k={k} g={g:?}");
            let pairs = packed.clone().with_order(PanelOrder::Pairs);
            assert_eq!(pairs.order(), PanelOrder::Pairs);
            assert_eq!(pairs.unpack_int4(), w, "pairs n={n} k={k} g={g:?}");
            for p in 0..packed.n_panels() {
                for s in 0..packed.k_pad() / K_STEP {
                    assert_eq!(pairs.lanes_step(p, s), packed.lanes_step(p, s));
                }
            }
            assert_eq!(pairs.with_order(PanelOrder::Lanes), packed);
        }
    }

    #[test]
    fn pairs_order_puts_two_channels_of_eight_k_values_in_each_slice() {
        let (n, k) = (16, 40);
        let w: Vec<i8> = (0..n * k)
            .map(|i| ((i * 7 + i / k) % 16) as i8 - 8)
            .collect();
        let s = vec![1.0f32; n];
        let packed = PackedW4A8::pack(n, k, &w, W4A8Scales::Channelwise(&s), None)
            .unwrap()
            .with_order(PanelOrder::Pairs);
        let bytes = packed.panel_nibbles(0);
        let code = |c: usize, col: usize| (w[c * k + col] + 8) as u8;
        // Steps 0..4 are two pairs; step 4 (K 32..40) is odd and keeps the lane order.
        for t in 0..2 {
            for u in 0..8 {
                for h in 0..2 {
                    for i in 0..8 {
                        let c = 2 * u + h;
                        let byte = bytes[t * 128 + 16 * u + 8 * h + i];
                        assert_eq!(byte & 0x0F, code(c, 16 * t + i));
                        assert_eq!(byte >> 4, code(c, 16 * t + 8 + i));
                    }
                }
            }
        }
        for c in 0..PANEL {
            for r in 0..4 {
                let byte = bytes[4 * 64 + 4 * c + r];
                assert_eq!(byte & 0x0F, code(c, 32 + r));
                assert_eq!(byte >> 4, code(c, 36 + r));
            }
        }
    }

    #[test]
    fn block_sums_and_scales_match_the_inputs() {
        let mut rng = SplitMix64::new(11);
        for &(n, k, g) in &[
            (1, 2, None),
            (17, 70, None),
            (33, 96, Some(32)),
            (5, 256, Some(128)),
        ] {
            let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-8, 7) as i8).collect();
            let blocks = g.map_or(1, |g| k / g);
            let s: Vec<bf16> = (0..n * blocks)
                .map(|_| bf16::from_f32(rng.range_i64(1, 1000) as f32 / 64.0))
                .collect();
            let cs: Vec<f32> = (0..n).map(|i| 0.1 + i as f32 / 3.0).collect();
            let packed = match g {
                None => PackedW4A8::pack(n, k, &w, W4A8Scales::Channelwise(&cs), None),
                Some(group_size) => {
                    let scales = W4A8Scales::Grouped {
                        group_size,
                        scales: &s,
                    };
                    PackedW4A8::pack(n, k, &w, scales, None)
                }
            }
            .unwrap();
            let len = g.unwrap_or(k);
            let pairs = packed.clone().with_order(PanelOrder::Pairs);
            for packed in [&packed, &pairs] {
                for row in 0..packed.n_panels() * PANEL {
                    let (p, c) = (row / PANEL, row % PANEL);
                    for b in 0..packed.n_blocks() {
                        let expected: i32 = if row < n {
                            w[row * k + b * len..][..len]
                                .iter()
                                .map(|&v| i32::from(v))
                                .sum()
                        } else {
                            0
                        };
                        assert_eq!(
                            packed.block_wsum(p, b)[c],
                            expected,
                            "n={n} k={k} row={row}"
                        );
                        let scale = match (row < n, g) {
                            (false, _) => 0.0,
                            (true, None) => cs[row],
                            (true, Some(_)) => s[row * blocks + b].to_f32(),
                        };
                        assert_eq!(packed.block_scales(p, b)[c], scale);
                    }
                }
            }
        }
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let w = vec![0i8; 4 * 64];
        let s = vec![bf16::ONE; 4 * 2];
        let grouped = |g| W4A8Scales::Grouped {
            group_size: g,
            scales: &s,
        };
        assert_eq!(
            PackedW4A8::pack(4, 64, &w, grouped(48), None).unwrap_err(),
            KernelError::InvalidGroupSize {
                group_size: 48,
                k: 64
            }
        );
        assert!(matches!(
            PackedW4A8::pack(4, 64, &w, grouped(0), None),
            Err(KernelError::InvalidGroupSize { .. })
        ));
        assert!(matches!(
            PackedW4A8::pack(4, 96, &[0; 4 * 96], grouped(64), None),
            Err(KernelError::InvalidGroupSize { .. })
        ));
        assert!(matches!(
            PackedW4A8::pack(4, 64, &w, grouped(64), None),
            Err(KernelError::LengthMismatch {
                tensor: "scales",
                ..
            })
        ));
        assert!(matches!(
            PackedW4A8::pack(5, 64, &w, grouped(32), None),
            Err(KernelError::LengthMismatch {
                tensor: "w_int4",
                ..
            })
        ));
        assert!(matches!(
            PackedW4A8::pack(4, 64, &w, grouped(32), Some(&[0.0; 3])),
            Err(KernelError::LengthMismatch { tensor: "bias", .. })
        ));
        let mut bad = w.clone();
        bad[5] = 8;
        assert!(matches!(
            PackedW4A8::pack(4, 64, &bad, grouped(32), None),
            Err(KernelError::ValueOutOfRange {
                index: 5,
                value: 8,
                ..
            })
        ));
        let cs = [1.0f32; 1];
        assert!(matches!(
            PackedW4A8::pack(1, 3, &[0, 0, 0], W4A8Scales::Channelwise(&cs), None),
            Err(KernelError::UnsupportedDim { dim: "K", .. })
        ));
        assert!(matches!(
            PackedW4A8::pack(1, 0, &[], W4A8Scales::Channelwise(&cs), None),
            Err(KernelError::UnsupportedDim { dim: "K", .. })
        ));
    }

    #[test]
    fn group_equal_to_k_is_channelwise() {
        let w = vec![1i8; 2 * 64];
        let s = vec![bf16::from_f32(0.5); 2];
        let p = PackedW4A8::pack(
            2,
            64,
            &w,
            W4A8Scales::Grouped {
                group_size: 64,
                scales: &s,
            },
            None,
        )
        .unwrap();
        assert_eq!(p.groups(), WeightGroups::Channelwise);
        assert_eq!(p.n_blocks(), 1);
        assert_eq!(p.block_scales(0, 0)[..2], [0.5, 0.5]);
        assert_eq!(p.block_wsum(0, 0)[..3], [64, 64, 0]);
    }
}
