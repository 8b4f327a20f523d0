//! Expert parallelism: which global experts this rank holds, and their local ids
//! (`determine_expert_map` in vLLM's `fused_moe/layer.py`, spec §7.5).
//!
//! With `ep_size` ranks, each rank owns `E / ep_size` experts, the first `E % ep_size` ranks one
//! more. The map sends an owned global id to its local id `0..num_local` and every other global
//! id to [`ExpertMap::NOT_LOCAL`], which the expert kernels skip: the combine across ranks adds
//! their contribution elsewhere.

use std::fmt;
use std::str::FromStr;

use crate::RouterError;

/// How global experts are spread over the expert-parallel ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExpertPlacement {
    /// Each rank owns one contiguous range of global ids (vLLM `"linear"`).
    Linear,
    /// Rank `r` owns `r, r + ep_size, r + 2 ep_size, …` (vLLM `"round_robin"`).
    RoundRobin,
}

impl ExpertPlacement {
    /// The spelling vLLM uses (`expert_placement_strategy`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Linear => "linear",
            Self::RoundRobin => "round_robin",
        }
    }
}

impl fmt::Display for ExpertPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ExpertPlacement {
    type Err = RouterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "linear" => Ok(Self::Linear),
            "round_robin" => Ok(Self::RoundRobin),
            _ => Err(RouterError::UnknownName {
                what: "expert_placement_strategy",
                name: s.to_string(),
            }),
        }
    }
}

/// Global-to-local expert ids for one expert-parallel rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertMap {
    global_to_local: Box<[i32]>,
    num_local: usize,
    ep_size: usize,
    ep_rank: usize,
    placement: ExpertPlacement,
}

impl ExpertMap {
    /// The local id of an expert held by another rank.
    pub const NOT_LOCAL: i32 = -1;

    /// The map of rank `ep_rank` out of `ep_size` for `num_experts` global experts.
    ///
    /// `ep_size == 1` gives the identity map (vLLM then passes no map at all). Ranks beyond the
    /// expert count own no expert.
    pub fn new(
        num_experts: usize,
        ep_size: usize,
        ep_rank: usize,
        placement: ExpertPlacement,
    ) -> Result<Self, RouterError> {
        let num_local = Self::local_count(num_experts, ep_size, ep_rank)?;
        let base = num_experts / ep_size;
        let rem = num_experts % ep_size;
        let mut map = vec![Self::NOT_LOCAL; num_experts].into_boxed_slice();
        for local in 0..num_local {
            let global = match placement {
                ExpertPlacement::Linear => ep_rank * base + ep_rank.min(rem) + local,
                ExpertPlacement::RoundRobin => ep_rank + local * ep_size,
            };
            map[global] = local as i32;
        }
        Ok(Self {
            global_to_local: map,
            num_local,
            ep_size,
            ep_rank,
            placement,
        })
    }

    /// How many of `num_experts` experts rank `ep_rank` of `ep_size` holds: `E / ep_size`, one
    /// more on the first `E % ep_size` ranks. Every placement gives each rank this count.
    pub fn local_count(
        num_experts: usize,
        ep_size: usize,
        ep_rank: usize,
    ) -> Result<usize, RouterError> {
        if num_experts == 0 {
            return Err(RouterError::NoExperts);
        }
        if ep_size == 0 || ep_rank >= ep_size {
            return Err(RouterError::EpRankOutOfRange { ep_rank, ep_size });
        }
        Ok(num_experts / ep_size + usize::from(ep_rank < num_experts % ep_size))
    }

    /// Number of global experts the map covers.
    pub fn num_global_experts(&self) -> usize {
        self.global_to_local.len()
    }

    /// Number of experts this rank holds.
    pub fn num_local_experts(&self) -> usize {
        self.num_local
    }

    /// Number of expert-parallel ranks.
    pub fn ep_size(&self) -> usize {
        self.ep_size
    }

    /// This rank.
    pub fn ep_rank(&self) -> usize {
        self.ep_rank
    }

    /// The placement strategy.
    pub fn placement(&self) -> ExpertPlacement {
        self.placement
    }

    /// The local id of global expert `global`, or `None` when another rank holds it (or the id
    /// is out of range).
    pub fn local_id(&self, global: usize) -> Option<usize> {
        match self.global_to_local.get(global) {
            Some(&l) if l >= 0 => Some(l as usize),
            _ => None,
        }
    }

    /// The whole map as vLLM stores it: `i32[num_experts]`, [`Self::NOT_LOCAL`] for other ranks.
    pub fn as_slice(&self) -> &[i32] {
        &self.global_to_local
    }

    /// Translates one in-range global id (the router only produces those).
    #[inline]
    pub(crate) fn translate(&self, global: u32) -> i32 {
        self.global_to_local[global as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_gives_the_first_ranks_one_more() {
        // 10 experts over 4 ranks: 3, 3, 2, 2.
        let owned: Vec<Vec<usize>> = (0..4)
            .map(|r| {
                let m = ExpertMap::new(10, 4, r, ExpertPlacement::Linear).unwrap();
                (0..10).filter(|&g| m.local_id(g).is_some()).collect()
            })
            .collect();
        assert_eq!(
            owned,
            [vec![0, 1, 2], vec![3, 4, 5], vec![6, 7], vec![8, 9]]
        );
        let m = ExpertMap::new(10, 4, 2, ExpertPlacement::Linear).unwrap();
        assert_eq!(m.as_slice(), [-1, -1, -1, -1, -1, -1, 0, 1, -1, -1]);
        assert_eq!(m.num_local_experts(), 2);
    }

    #[test]
    fn round_robin_strides_by_ep_size() {
        let m = ExpertMap::new(10, 4, 1, ExpertPlacement::RoundRobin).unwrap();
        assert_eq!(m.as_slice(), [-1, 0, -1, -1, -1, 1, -1, -1, -1, 2]);
        let m = ExpertMap::new(10, 4, 3, ExpertPlacement::RoundRobin).unwrap();
        assert_eq!(m.num_local_experts(), 2);
        assert_eq!(m.local_id(7), Some(1));
    }

    #[test]
    fn every_expert_has_exactly_one_owner() {
        for e in 1..20 {
            for ep in 1..7 {
                for placement in [ExpertPlacement::Linear, ExpertPlacement::RoundRobin] {
                    let maps: Vec<_> = (0..ep)
                        .map(|r| ExpertMap::new(e, ep, r, placement).unwrap())
                        .collect();
                    for g in 0..e {
                        assert_eq!(maps.iter().filter(|m| m.local_id(g).is_some()).count(), 1);
                    }
                    for m in &maps {
                        let mut locals: Vec<_> = (0..e).filter_map(|g| m.local_id(g)).collect();
                        locals.sort();
                        assert_eq!(locals, (0..m.num_local_experts()).collect::<Vec<_>>());
                    }
                }
            }
        }
    }

    #[test]
    fn bad_ranks_are_rejected() {
        assert!(matches!(
            ExpertMap::new(8, 0, 0, ExpertPlacement::Linear),
            Err(RouterError::EpRankOutOfRange { .. })
        ));
        assert!(matches!(
            ExpertMap::new(8, 2, 2, ExpertPlacement::Linear),
            Err(RouterError::EpRankOutOfRange {
                ep_rank: 2,
                ep_size: 2
            })
        ));
        assert!(matches!(
            "striped".parse::<ExpertPlacement>(),
            Err(RouterError::UnknownName { .. })
        ));
        assert_eq!(
            "round_robin".parse::<ExpertPlacement>().unwrap(),
            ExpertPlacement::RoundRobin
        );
    }
}
