//! Top-k selection with this crate's tie rule: larger value first, and among equal values the
//! lower index first. Ids come out in that order.
//!
//! Upstream leaves ties open (`torch.topk(sorted=False)` on CPU; the CUDA kernel prefers the lower
//! index). Fixing the rule makes routing reproducible; sums over experts must not depend on the
//! order anyway, because the experts are reduced in ascending id order (spec §2.7, §4.1).

/// A running top-k: a list of at most `k` (value, index) pairs kept sorted by the tie rule.
///
/// Candidates must be offered in ascending index order. Then an equal value never displaces an
/// entry already held (that entry has the lower index), so the comparison is a plain `>` and the
/// insertion point is after every entry whose value is `>=` the candidate's.
pub(crate) struct TopK<'a> {
    values: &'a mut [f32],
    ids: &'a mut [u32],
    len: usize,
}

impl<'a> TopK<'a> {
    /// An empty selection keeping `values.len()` (= `ids.len()`) entries.
    pub fn new(values: &'a mut [f32], ids: &'a mut [u32]) -> Self {
        debug_assert_eq!(values.len(), ids.len());
        Self {
            values,
            ids,
            len: 0,
        }
    }

    /// Offers expert `id` with selection value `value`; ids must arrive in ascending order.
    /// Values must not be NaN (callers reject non-finite logits first).
    #[inline]
    pub fn offer(&mut self, value: f32, id: u32) {
        let k = self.values.len();
        if self.len == k {
            if k == 0 || value <= self.values[k - 1] {
                return;
            }
        } else {
            self.len += 1;
        }
        // Shift smaller entries right until the slot after the last entry >= value.
        let mut pos = self.len - 1;
        while pos > 0 && self.values[pos - 1] < value {
            self.values[pos] = self.values[pos - 1];
            self.ids[pos] = self.ids[pos - 1];
            pos -= 1;
        }
        self.values[pos] = value;
        self.ids[pos] = id;
    }

    /// Number of entries held so far.
    pub fn len(&self) -> usize {
        self.len
    }
}

/// Selects the top `ids.len()` entries of `values` into `ids` (and their values into `top`).
pub(crate) fn select(values: &[f32], top: &mut [f32], ids: &mut [u32]) {
    let mut sel = TopK::new(top, ids);
    for (i, &v) in values.iter().enumerate() {
        sel.offer(v, i as u32);
    }
    debug_assert_eq!(sel.len(), sel.values.len());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top(values: &[f32], k: usize) -> Vec<u32> {
        let mut t = vec![0.0; k];
        let mut ids = vec![0; k];
        select(values, &mut t, &mut ids);
        ids
    }

    #[test]
    fn larger_value_first() {
        assert_eq!(top(&[0.1, 0.9, 0.5, 0.7], 2), [1, 3]);
        assert_eq!(top(&[0.1, 0.9, 0.5, 0.7], 4), [1, 3, 2, 0]);
    }

    #[test]
    fn ties_prefer_the_lower_index() {
        assert_eq!(top(&[1.0, 2.0, 2.0, 2.0, 0.0], 2), [1, 2]);
        assert_eq!(top(&[1.0, 1.0, 1.0, 1.0], 3), [0, 1, 2]);
        assert_eq!(top(&[0.0, 3.0, 1.0, 3.0, 1.0], 4), [1, 3, 2, 4]);
    }

    #[test]
    fn negative_and_infinite_values() {
        assert_eq!(top(&[-3.0, f32::NEG_INFINITY, -1.0, -2.0], 3), [2, 3, 0]);
        assert_eq!(top(&[f32::NEG_INFINITY; 3], 2), [0, 1]);
    }
}
