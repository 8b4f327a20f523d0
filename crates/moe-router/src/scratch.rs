//! Per-token working memory, sized once from a configuration and reused by every routing call,
//! so routing itself never allocates. One scratch per thread routes concurrently with one router.

use crate::RouterError;
use crate::config::RouterConfig;

/// Working memory for [`crate::Router::route_into`]; make it with [`crate::Router::new_scratch`]
/// (or [`RouterScratch::new`]) and keep it.
///
/// Its size is linear in the expert count: about `13 · num_experts` bytes plus a few values per
/// group and per chosen expert. A scratch sized for a larger configuration also fits a smaller one.
#[derive(Debug, Clone, Default)]
pub struct RouterScratch {
    pub(crate) row: Vec<f32>,
    pub(crate) scores: Vec<f32>,
    pub(crate) selection: Vec<f32>,
    pub(crate) seen: Vec<bool>,
    pub(crate) group_scores: Vec<f32>,
    pub(crate) group_kept: Vec<bool>,
    pub(crate) group_values: Vec<f32>,
    pub(crate) group_ids: Vec<u32>,
    pub(crate) values: Vec<f32>,
    pub(crate) ids: Vec<u32>,
    pub(crate) weights: Vec<f32>,
}

impl RouterScratch {
    /// A scratch large enough for `config`.
    pub fn new(config: &RouterConfig) -> Self {
        let e = config.num_experts;
        let k = config.top_k;
        let (g, gk) = config
            .grouping()
            .map_or((0, 0), |g| (g.num_groups, g.topk_group));
        Self {
            row: vec![0.0; e],
            scores: vec![0.0; e],
            selection: vec![0.0; e],
            seen: vec![false; e],
            group_scores: vec![0.0; g],
            group_kept: vec![false; g],
            group_values: vec![0.0; gk],
            group_ids: vec![0; gk],
            values: vec![0.0; k],
            ids: vec![0; k],
            weights: vec![0.0; k],
        }
    }

    /// Checks that this scratch has room for `config` (already validated).
    pub(crate) fn check(&self, config: &RouterConfig) -> Result<(), RouterError> {
        let need = |what, needed: usize, got: usize| {
            if got < needed {
                Err(RouterError::ScratchTooSmall { what, needed, got })
            } else {
                Ok(())
            }
        };
        need("experts", config.num_experts, self.row.len())?;
        need("top_k", config.top_k, self.ids.len())?;
        if let Some(g) = config.grouping() {
            need("groups", g.num_groups, self.group_scores.len())?;
            need("kept groups", g.topk_group, self.group_ids.len())?;
        }
        Ok(())
    }
}
