//! The packed int8 weight format of the W8A8 GEMM: byte panels, per-channel weight sums and
//! f32 scales, built once from i8 weights with one scale per output channel (spec §5.1).
//!
//! Layout (`P = ceil(N/16)` panels, `Kp = K` rounded up to 4):
//!
//! - `bytes[(p·Kp/4 + s)·64 + j]` = `w[16p + j/4][4s + j%4]`: one `vpdpbusd` operand per step.
//!   That is the [`PanelOrder::Lanes`] order; in the [`PanelOrder::Pairs`] order (the `smmla`
//!   operand, chosen at pack time with [`PackedW8A8::with_order`]) steps `2t` and `2t + 1` form
//!   128 bytes instead: byte `16u + 8h + i` (`u < 8`, `h < 2`, `i < 8`) is
//!   `w[16p + 2u + h][8t + i]`. An odd last step stays in the lane order.
//! - `wsum[16p + c]` = `Σ_k w` of the channel, for kernels that take activations as `q + 128`.
//! - `scales[16p + c]` = the channel's f32 scale.
//!
//! Channels past `N` and K values past `K` are zero.

use super::{PANEL, PanelOrder, STEP_BYTES, check_len, round_up};
use crate::KernelError;
use crate::aligned::AlignedVec;

/// K values per packed step.
pub(crate) const K_STEP: usize = 4;

/// Largest supported K: `Σ (q + 128)·w` must fit in i32 (`255·128·K < 2^31`).
pub const MAX_K: usize = 1 << 16;

/// An int8 weight matrix `[N, K]` with per-channel scales, packed for the W8A8 kernels.
#[derive(Debug, Clone)]
pub struct PackedW8A8 {
    n: usize,
    k: usize,
    k_pad: usize,
    n_panels: usize,
    /// The order of the bytes inside each panel.
    order: PanelOrder,
    bytes: AlignedVec<i8>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // for `q + 128` kernels (x86)
    wsum: Vec<i32>,
    scales: Vec<f32>,
}

impl PackedW8A8 {
    /// Packs `w` (`[N, K]` row-major i8) with its f32 per-channel scales `[N]`, in the
    /// [`PanelOrder::Lanes`] order.
    pub fn pack(n: usize, k: usize, w: &[i8], scales: &[f32]) -> Result<Self, KernelError> {
        if k == 0 || k > MAX_K {
            return Err(KernelError::UnsupportedDim {
                dim: "K",
                got: k,
                reason: "K must be in 1..=65536 (int32 sums must stay exact)",
            });
        }
        let expected_len = n.checked_mul(k).ok_or(KernelError::UnsupportedDim {
            dim: "N",
            got: n,
            reason: "N·K overflows usize",
        })?;
        check_len("w_int8", expected_len, w.len())?;
        check_len("scales", n, scales.len())?;
        let k_pad = round_up(k, K_STEP);
        let n_panels = n.div_ceil(PANEL);
        let steps = k_pad / K_STEP;
        // Byte `j` of a step is `w[16p + j/4][4s + j%4]`: each row of the panel gives the
        // step its next 4 values, so rows are read in order and written 4 bytes at a time
        // (rows past N and values past K stay 0).
        let mut bytes = AlignedVec::zeroed(n_panels * steps * STEP_BYTES);
        for (p, panel) in bytes.chunks_exact_mut(steps * STEP_BYTES).enumerate() {
            for r in 0..PANEL.min(n - p * PANEL) {
                let row = &w[(p * PANEL + r) * k..][..k];
                let (quads, tail) = row.as_chunks::<K_STEP>();
                for (s, quad) in quads.iter().enumerate() {
                    panel[s * STEP_BYTES + r * K_STEP..][..K_STEP].copy_from_slice(quad);
                }
                if !tail.is_empty() {
                    let at = quads.len() * STEP_BYTES + r * K_STEP;
                    panel[at..][..tail.len()].copy_from_slice(tail);
                }
            }
        }
        let mut wsum = vec![0i32; n_panels * PANEL];
        let mut padded_scales = vec![0f32; n_panels * PANEL];
        for row in 0..n {
            wsum[row] = w[row * k..][..k].iter().map(|&v| i32::from(v)).sum();
            padded_scales[row] = scales[row];
        }
        Ok(Self {
            n,
            k,
            k_pad,
            n_panels,
            order: PanelOrder::Lanes,
            bytes,
            wsum,
            scales: padded_scales,
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

    /// Bytes of packed data (weights, per-channel sums and scales): what a call streams.
    pub fn packed_bytes(&self) -> usize {
        self.bytes.len() + 4 * (self.wsum.len() + self.scales.len())
    }

    /// The order of the bytes inside the panels.
    pub fn order(&self) -> PanelOrder {
        self.order
    }

    /// The same weights in the panel order `order` (a kernel set's choice is
    /// [`crate::KernelSet::panel_order`]); the values, sums, scales and sizes are unchanged.
    #[must_use]
    pub fn with_order(mut self, order: PanelOrder) -> Self {
        if order == self.order {
            return self;
        }
        let steps = self.k_pad / K_STEP;
        let len = steps * STEP_BYTES;
        let mut out = AlignedVec::zeroed(self.bytes.len());
        for (src, dst) in self.bytes.chunks_exact(len).zip(out.chunks_exact_mut(len)) {
            for c in 0..PANEL {
                for k in 0..self.k_pad {
                    dst[byte_at(order, steps, c, k)] = src[byte_at(self.order, steps, c, k)];
                }
            }
        }
        self.bytes = out;
        self.order = order;
        self
    }

    /// Rebuilds the `[N, K]` weights (inverse of [`PackedW8A8::pack`], in either order), for
    /// tests and tools.
    pub fn unpack_int8(&self) -> Vec<i8> {
        let steps = self.k_pad / K_STEP;
        let mut w = vec![0i8; self.n * self.k];
        for row in 0..self.n {
            let (p, c) = (row / PANEL, row % PANEL);
            let panel = self.panel_bytes(p);
            for col in 0..self.k {
                w[row * self.k + col] = panel[byte_at(self.order, steps, c, col)];
            }
        }
        w
    }

    /// Step `s` of panel `p` in the lane order, whatever the stored order: the bytes the
    /// portable body reads.
    pub(crate) fn lanes_step(&self, p: usize, s: usize) -> [i8; STEP_BYTES] {
        let steps = self.k_pad / K_STEP;
        let panel = self.panel_bytes(p);
        if !self.order.paired(s, steps) {
            return panel[s * STEP_BYTES..][..STEP_BYTES].try_into().unwrap();
        }
        std::array::from_fn(|j| panel[byte_at(self.order, steps, j / 4, K_STEP * s + j % 4)])
    }

    /// K rounded up to the packed step; activation rows are padded to this length.
    pub(crate) fn k_pad(&self) -> usize {
        self.k_pad
    }

    /// Number of 16-channel panels.
    pub(crate) fn n_panels(&self) -> usize {
        self.n_panels
    }

    /// The bytes of panel `p`: `k_pad/4` steps of 64.
    pub(crate) fn panel_bytes(&self, p: usize) -> &[i8] {
        let len = self.k_pad / K_STEP * STEP_BYTES;
        &self.bytes[p * len..][..len]
    }

    /// The weight sums of panel `p` (16 values).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // for `q + 128` kernels (x86)
    pub(crate) fn panel_wsum(&self, p: usize) -> &[i32] {
        &self.wsum[p * PANEL..][..PANEL]
    }

    /// The scales of panel `p` (16 values).
    pub(crate) fn panel_scales(&self, p: usize) -> &[f32] {
        &self.scales[p * PANEL..][..PANEL]
    }
}

/// Where the weight of channel `c` (of a panel) at K value `k` lies in a panel of `steps`
/// steps stored in `order`.
fn byte_at(order: PanelOrder, steps: usize, c: usize, k: usize) -> usize {
    let s = k / K_STEP;
    if order.paired(s, steps) {
        let t = k / (2 * K_STEP);
        t * 2 * STEP_BYTES + 8 * c + k % (2 * K_STEP)
    } else {
        s * STEP_BYTES + 4 * c + k % K_STEP
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moe_testutil::SplitMix64;

    #[test]
    fn unpack_inverts_pack() {
        let mut rng = SplitMix64::new(3);
        for &(n, k) in &[(1, 1), (17, 33), (32, 64)] {
            let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-128, 127) as i8).collect();
            let p = PackedW8A8::pack(n, k, &w, &vec![1.0; n]).unwrap();
            assert_eq!(p.unpack_int8(), w);
            let pairs = p.clone().with_order(PanelOrder::Pairs);
            assert_eq!(pairs.unpack_int8(), w, "pairs n={n} k={k}");
            for panel in 0..p.n_panels() {
                for s in 0..p.k_pad() / K_STEP {
                    assert_eq!(pairs.lanes_step(panel, s), p.lanes_step(panel, s));
                }
            }
            assert_eq!(pairs.with_order(PanelOrder::Lanes).bytes, p.bytes);
        }
    }

    #[test]
    fn pairs_order_puts_two_channels_of_eight_k_values_in_each_slice() {
        let (n, k) = (16, 20);
        let w: Vec<i8> = (0..n * k).map(|i| (i * 37 % 256) as u8 as i8).collect();
        let p = PackedW8A8::pack(n, k, &w, &[1.0; 16])
            .unwrap()
            .with_order(PanelOrder::Pairs);
        let bytes = p.panel_bytes(0);
        // Steps 0..4 are two pairs; step 4 (K 16..20) is odd and keeps the lane order.
        for t in 0..2 {
            for u in 0..8 {
                for h in 0..2 {
                    for i in 0..8 {
                        let at = t * 128 + 16 * u + 8 * h + i;
                        assert_eq!(bytes[at], w[(2 * u + h) * k + 8 * t + i]);
                    }
                }
            }
        }
        for c in 0..PANEL {
            for r in 0..4 {
                assert_eq!(bytes[4 * 64 + 4 * c + r], w[c * k + 16 + r]);
            }
        }
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        assert!(matches!(
            PackedW8A8::pack(2, 4, &[0; 7], &[1.0; 2]),
            Err(KernelError::LengthMismatch {
                tensor: "w_int8",
                ..
            })
        ));
        assert!(matches!(
            PackedW8A8::pack(2, 4, &[0; 8], &[1.0; 3]),
            Err(KernelError::LengthMismatch {
                tensor: "scales",
                ..
            })
        ));
        assert!(matches!(
            PackedW8A8::pack(2, 0, &[], &[1.0; 2]),
            Err(KernelError::UnsupportedDim { dim: "K", .. })
        ));
    }
}
