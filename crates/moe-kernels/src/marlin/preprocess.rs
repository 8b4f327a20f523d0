//! The element-wise transformations around the repack: the FP8-activation code remap and ×512
//! scales (spec `marlin.md` §7.1), the INT8-activation scale quantisation with its global scale
//! (§7.2), and act-order's stable argsort of `g_idx` with its checks (§3.4).

use half::{bf16, f16};

use super::error::MarlinError;

/// A 16-bit float scale type (fp16 or bf16): arithmetic is done in f32 and rounded back to
/// nearest-even after every operation, as PyTorch does for 16-bit tensors.
pub trait Scale16: Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// Name for messages and file metadata (`"float16"`, `"bfloat16"`).
    const NAME: &'static str;
    /// Widens to f32 (exact).
    fn to_f32(self) -> f32;
    /// Rounds an f32 to this type, to nearest-even.
    fn from_f32(v: f32) -> Self;
    /// The raw bits.
    fn to_bits(self) -> u16;
    /// From raw bits.
    fn from_bits(bits: u16) -> Self;
}

impl Scale16 for f16 {
    const NAME: &'static str = "float16";
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_bits(self) -> u16 {
        f16::to_bits(self)
    }
    fn from_bits(bits: u16) -> Self {
        f16::from_bits(bits)
    }
}

impl Scale16 for bf16 {
    const NAME: &'static str = "bfloat16";
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_bits(self) -> u16 {
        bf16::to_bits(self)
    }
    fn from_bits(bits: u16) -> Self {
        bf16::from_bits(bits)
    }
}

/// Remaps every 4-bit code of packed words for FP8 activations (`marlin_int4_fp8_preprocess`
/// without zero points): `v → v − 8` if `v ≥ 8`, else `15 − v`. Element-wise, so it applies to
/// GPTQ words before the repack or to Marlin words after it, with the same result.
pub fn fp8_remap_int4(words: &mut [u32]) {
    for w in words {
        let mut out = 0u32;
        for t in 0..8 {
            let v = (*w >> (4 * t)) & 0xf;
            let r = if v >= 8 { v - 8 } else { 15 - v };
            out |= r << (4 * t);
        }
        *w = out;
    }
}

/// The inverse of the FP8 code remap for one code: `v' < 8 → v' + 8`, else `15 − v'`.
pub const fn fp8_unmap_code(v: u32) -> u32 {
    if v < 8 { v + 8 } else { 15 - v }
}

/// Multiplies scales by 512 in their own dtype, for FP8 activations (the kernel's FP8 codes carry
/// a factor 1/512). Refuses a scale that is not finite or would overflow (fp16 above ~127.98).
pub fn fp8_scale_x512<S: Scale16>(
    tensor: &'static str,
    scales: &mut [S],
) -> Result<(), MarlinError> {
    for (index, s) in scales.iter_mut().enumerate() {
        let v = s.to_f32();
        let scaled = S::from_f32(v * 512.0);
        if !scaled.to_f32().is_finite() {
            return Err(MarlinError::BadScale {
                tensor,
                index,
                value: v,
                reason: "×512 for FP8 activations is not finite in the scale dtype",
            });
        }
        *s = scaled;
    }
    Ok(())
}

/// INT8-activation scale processing (`marlin_act_int8_process_scales`), for a tensor with more
/// than one group, after its permutation: `smax` over the whole tensor (every expert), the
/// global scale `smax / 4096` (f32), and per scale
/// `round_half_even(round_D(round_D(s / smax) · 4096))` as an i16.
///
/// Negative scales are refused (vLLM's kernel reads these i16 as unsigned: vllm-project/vllm#48905), as are
/// non-finite ones and an all-zero tensor (division by zero).
pub fn int8_act_scales<S: Scale16>(
    tensor: &'static str,
    scales: &[S],
) -> Result<(Vec<i16>, f32), MarlinError> {
    let mut smax = 0f32;
    let mut smax_index = 0;
    for (index, s) in scales.iter().enumerate() {
        let v = s.to_f32();
        if !v.is_finite() {
            return Err(MarlinError::BadScale {
                tensor,
                index,
                value: v,
                reason: "not finite",
            });
        }
        if v < 0.0 {
            return Err(MarlinError::NegativeScale {
                tensor,
                index,
                value: v,
            });
        }
        if v > smax {
            smax = v;
            smax_index = index;
        }
    }
    if smax <= 0.0 {
        return Err(MarlinError::BadScale {
            tensor,
            index: smax_index,
            value: smax,
            reason: "the largest scale must be positive for INT8 activations",
        });
    }
    let q = scales
        .iter()
        .map(|s| {
            let ratio = S::from_f32(s.to_f32() / smax);
            let scaled = S::from_f32(ratio.to_f32() * 4096.0);
            scaled.to_f32().round_ties_even() as i16
        })
        .collect();
    Ok((q, smax / 4096.0))
}

/// Stable argsort of one expert's `g_idx` (ties in ascending channel order) and the sorted
/// `g_idx`. Upstream uses the unstable `torch.argsort`; any sorting permutation gives the same
/// layer, and the stable one makes our output deterministic (spec §3.4).
pub fn stable_argsort(g_idx: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let mut perm: Vec<u32> = (0..g_idx.len() as u32).collect();
    perm.sort_by_key(|&k| g_idx[k as usize]);
    let sorted = perm.iter().map(|&k| g_idx[k as usize]).collect();
    (perm, sorted)
}

/// Checks that one expert's act-order `g_idx` assigns exactly `group_size` channels to each of
/// the `size_k / group_size` groups.
pub fn check_g_idx(
    tensor: &'static str,
    expert: usize,
    g_idx: &[u32],
    group_size: usize,
) -> Result<(), MarlinError> {
    if g_idx.is_empty() {
        return Ok(());
    }
    let groups = g_idx.len() / group_size.max(1);
    let mut count = vec![0usize; groups];
    for &g in g_idx {
        match count.get_mut(g as usize) {
            Some(c) => *c += 1,
            None => {
                return Err(MarlinError::GIdxNotGroupPermutation {
                    tensor,
                    expert,
                    group: u64::from(g),
                    count: 0,
                    expected: group_size,
                });
            }
        }
    }
    if let Some((group, &c)) = count.iter().enumerate().find(|(_, c)| **c != group_size) {
        return Err(MarlinError::GIdxNotGroupPermutation {
            tensor,
            expert,
            group: group as u64,
            count: c,
            expected: group_size,
        });
    }
    Ok(())
}

/// Checks that `perm` (already known to be a permutation) sorts `g_idx` non-decreasingly.
pub fn check_perm_sorts(
    tensor: &'static str,
    expert: usize,
    perm: &[u32],
    g_idx: &[u32],
) -> Result<(), MarlinError> {
    for (index, pair) in perm.windows(2).enumerate() {
        let (prev, next) = (g_idx[pair[0] as usize], g_idx[pair[1] as usize]);
        if next < prev {
            return Err(MarlinError::PermDoesNotSortGIdx {
                tensor,
                expert,
                index: index + 1,
                prev: u64::from(prev),
                next: u64::from(next),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_remap_is_a_bijection_with_its_inverse() {
        let mut w = [0xfedc_ba98u32, 0x7654_3210];
        fp8_remap_int4(&mut w);
        assert_eq!(w, [0x7654_3210, 0x89ab_cdef]);
        for v in 0..16 {
            let mut x = [v];
            fp8_remap_int4(&mut x);
            assert_eq!(fp8_unmap_code(x[0] & 0xf), v);
        }
    }

    #[test]
    fn stable_argsort_keeps_ties_in_order() {
        let (perm, sorted) = stable_argsort(&[1, 0, 1, 0]);
        assert_eq!(perm, [1, 3, 0, 2]);
        assert_eq!(sorted, [0, 0, 1, 1]);
    }
}
