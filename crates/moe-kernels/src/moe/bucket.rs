//! Step 1 of spec §4.1: bucket the (token, slot) pairs by local expert, stable, experts
//! ascending, and remember for each token where its contributions landed, in bucket order
//! (which is the order the per-token sum must follow).

use super::numerics::ExpertId;
use super::scratch::{MoeScratch, NOT_LOCAL};
use crate::KernelError;

/// The routing of one call.
pub(crate) struct Routing<'a, Id> {
    /// `[T, k]` global expert ids.
    pub ids: &'a [Id],
    /// `[T, k]` router weights.
    pub weights: &'a [f32],
    /// Top-k.
    pub top_k: usize,
    /// Global id → local id or −1, `[global experts]`; `None` = identity.
    pub expert_map: Option<&'a [i32]>,
    /// Number of global experts (valid ids are `0..global`).
    pub global_experts: usize,
    /// Number of local experts.
    pub local_experts: usize,
}

impl<Id: ExpertId> Routing<'_, Id> {
    /// The local expert of pair `i`, or `None` when it lives on another rank. Ids were checked.
    #[inline]
    fn local(&self, i: usize) -> Option<usize> {
        let global = self.ids[i].to_i64() as usize;
        match self.expert_map {
            None => Some(global),
            Some(map) => usize::try_from(map[global]).ok(),
        }
    }

    /// Checks every id before anything is written.
    fn validate(&self) -> Result<(), KernelError> {
        let bad = self
            .ids
            .iter()
            .position(|id| !(0..self.global_experts as i64).contains(&id.to_i64()));
        match bad {
            None => Ok(()),
            Some(index) => Err(KernelError::ExpertIdOutOfRange {
                tensor: "topk_ids",
                index,
                id: self.ids[index].to_i64(),
                num_experts: self.global_experts,
            }),
        }
    }

    /// Fills the scratch's `offsets`, `tok`, `gate` and `order`; returns the number of
    /// bucketed rows (pairs on local experts).
    pub(crate) fn bucket(&self, s: &mut MoeScratch) -> Result<usize, KernelError> {
        self.validate()?;
        let e = self.local_experts;
        let pairs = self.ids.len();
        let counts = &mut s.cursor[..e];
        counts.fill(0);
        for i in 0..pairs {
            if let Some(l) = self.local(i) {
                counts[l] += 1;
            }
        }
        s.offsets[0] = 0;
        for l in 0..e {
            s.offsets[l + 1] = s.offsets[l] + s.cursor[l];
            s.cursor[l] = s.offsets[l];
        }
        for i in 0..pairs {
            s.order[i] = match self.local(i) {
                Some(l) => {
                    let pos = s.cursor[l];
                    s.cursor[l] += 1;
                    s.tok[pos] = i / self.top_k;
                    s.gate[pos] = self.weights[i];
                    pos
                }
                None => NOT_LOCAL,
            };
        }
        // Bucket positions grow with the expert id (and with the slot inside one expert), so
        // sorting a token's positions gives its contributions in ascending expert order.
        if self.top_k > 1 {
            for row in s.order[..pairs].chunks_exact_mut(self.top_k) {
                row.sort_unstable();
            }
        }
        Ok(s.offsets[e])
    }
}
