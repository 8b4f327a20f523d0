//! The router: a validated configuration and the per-call loop that checks the caller's buffers,
//! routes token by token, applies the routed scaling and the expert map, and writes the outputs.

use crate::config::{Algorithm, RouterConfig, ScalingPlacement};
use crate::expert_map::ExpertMap;
use crate::io::{IdsOut, Logits};
use crate::method::RoutingMethodType;
use crate::precision::Rounding;
use crate::scored::{ScoreBuffers, ScoreParams};
use crate::scratch::RouterScratch;
use crate::{RouterError, cpu_softmax, grouped, llama4, scored, sparse_mixer};

/// Routes tokens to experts: for each token, `top_k` expert ids and their f32 weights.
///
/// Built once from a [`RouterConfig`] (validated there), then shared freely: routing takes
/// `&self` and keeps its working memory in a caller-owned [`RouterScratch`].
#[derive(Debug, Clone)]
pub struct Router {
    config: RouterConfig,
}

impl Router {
    /// Validates `config` and builds the router.
    pub fn new(config: RouterConfig) -> Result<Self, RouterError> {
        config.validate()?;
        Ok(Self { config })
    }

    /// The configuration.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Working memory sized for this router.
    pub fn new_scratch(&self) -> RouterScratch {
        RouterScratch::new(&self.config)
    }

    /// The label vLLM would give this configuration.
    pub fn routing_method_type(&self) -> RoutingMethodType {
        self.config.routing_method_type()
    }

    /// The factor the caller must multiply the MoE output by: the routed scaling factor when
    /// its placement is [`ScalingPlacement::OnOutput`], otherwise 1.
    pub fn output_scale(&self) -> f32 {
        match self.config.routed_scaling.placement {
            ScalingPlacement::OnOutput => self.config.routed_scaling.factor,
            ScalingPlacement::OnWeights => 1.0,
        }
    }

    /// Whether the weight multiplies the token before the expert MLP instead of the expert's
    /// output (Llama4).
    pub fn apply_router_weight_on_input(&self) -> bool {
        matches!(self.config.algorithm, Algorithm::Llama4)
    }

    /// The expert map, when ids are written as local ids.
    pub fn expert_map(&self) -> Option<&ExpertMap> {
        self.config.expert_map.as_ref()
    }

    /// Routes `num_tokens = logits.len() / num_experts` tokens and returns `num_tokens`.
    ///
    /// `logits` is `[num_tokens, num_experts]`; `weights_out` and `ids_out` are
    /// `[num_tokens, top_k]`, row-major. Each row's ids are distinct and ordered by selection
    /// value, larger first, ties to the lower expert id. Ids are global, or local with
    /// [`ExpertMap::NOT_LOCAL`] for other ranks when the configuration has an expert map.
    ///
    /// Nothing is allocated. Errors: buffers of the wrong size, a scratch too small, or a NaN or
    /// infinite logit anywhere in the batch (nothing written); a failing custom hook (rows
    /// before the offending one are written, the rest untouched).
    pub fn route_into(
        &self,
        logits: Logits<'_>,
        weights_out: &mut [f32],
        mut ids_out: IdsOut<'_>,
        scratch: &mut RouterScratch,
    ) -> Result<usize, RouterError> {
        let cfg = &self.config;
        let e = cfg.num_experts;
        let k = cfg.top_k;
        if !logits.len().is_multiple_of(e) {
            return Err(RouterError::LogitsShape {
                len: logits.len(),
                num_experts: e,
            });
        }
        let num_tokens = logits.len() / e;
        let expected = num_tokens * k;
        if weights_out.len() != expected {
            return Err(RouterError::BufferSize {
                buffer: "weights_out",
                expected,
                got: weights_out.len(),
            });
        }
        if ids_out.len() != expected {
            return Err(RouterError::BufferSize {
                buffer: "ids_out",
                expected,
                got: ids_out.len(),
            });
        }
        scratch.check(cfg)?;

        let bias = cfg.correction_bias.as_deref();
        let rounding = Rounding::new(cfg.rounding, logits.dtype(), bias.is_some());
        let scale = match cfg.routed_scaling.placement {
            ScalingPlacement::OnWeights if cfg.routed_scaling.factor != 1.0 => {
                Some(cfg.routed_scaling.factor)
            }
            _ => None,
        };
        let RouterScratch {
            row: row_buf,
            scores,
            selection,
            seen,
            group_scores,
            group_kept,
            group_values,
            group_ids,
            values,
            ids,
            weights,
        } = scratch;
        let (values, ids, weights) = (&mut values[..k], &mut ids[..k], &mut weights[..k]);

        // Validate every row before writing any, so a rejected batch leaves the outputs as
        // they were instead of half-routed.
        for row in 0..num_tokens {
            let x = logits.row_f32(row, e, row_buf);
            if let Some(expert) = x.iter().position(|v| !v.is_finite()) {
                return Err(RouterError::NonFiniteLogit {
                    row,
                    expert,
                    value: x[expert],
                });
            }
        }
        for row in 0..num_tokens {
            let x = logits.row_f32(row, e, row_buf);
            let params = |scoring| ScoreParams {
                scoring,
                bias,
                renormalize: cfg.renormalize,
                rounding,
            };
            match &cfg.algorithm {
                Algorithm::CpuSoftmax => {
                    cpu_softmax::route(x, cfg.renormalize, rounding, values, ids, weights)
                }
                Algorithm::ScoredTopK { scoring } => scored::route(
                    x,
                    params(*scoring),
                    ScoreBuffers {
                        scores: &mut scores[..e],
                        selection: &mut selection[..e],
                        values,
                        ids,
                        weights,
                    },
                ),
                Algorithm::GroupedTopK { scoring, grouping } => {
                    let (g, gk) = (grouping.num_groups, grouping.topk_group);
                    grouped::route(
                        x,
                        params(*scoring),
                        *grouping,
                        ScoreBuffers {
                            scores: &mut scores[..e],
                            selection: &mut selection[..e],
                            values,
                            ids,
                            weights,
                        },
                        grouped::GroupBuffers {
                            scores: &mut group_scores[..g],
                            kept: &mut group_kept[..g],
                            top_values: &mut group_values[..gk],
                            top_ids: &mut group_ids[..gk],
                        },
                    )
                }
                Algorithm::Llama4 => llama4::route(x, values, ids, weights),
                Algorithm::SparseMixer { jitter_eps } => {
                    sparse_mixer::route(x, *jitter_eps, ids, weights)
                }
                Algorithm::Custom(hook) => {
                    hook.route_token(x, weights, ids)
                        .map_err(|reason| RouterError::CustomRouting { row, reason })?;
                    check_custom_ids(row, ids, &mut seen[..e])?;
                }
            }
            if let Some(r) = scale {
                for w in weights.iter_mut() {
                    *w = rounding.at(rounding.weight_ops, *w * r);
                }
            }
            weights_out[row * k..(row + 1) * k].copy_from_slice(weights);
            match &cfg.expert_map {
                Some(map) => ids_out.write(row * k, ids.iter().map(|&id| map.translate(id))),
                None => ids_out.write(row * k, ids.iter().map(|&id| id as i32)),
            }
        }
        Ok(num_tokens)
    }
}

/// Rejects ids out of range or repeated within the token; `seen` is all false on entry and exit.
fn check_custom_ids(row: usize, ids: &[u32], seen: &mut [bool]) -> Result<(), RouterError> {
    let mut outcome = Ok(());
    for &id in ids {
        match seen.get_mut(id as usize) {
            None => {
                outcome = Err(RouterError::CustomIdOutOfRange {
                    row,
                    id,
                    num_experts: seen.len(),
                });
                break;
            }
            Some(s) if *s => {
                outcome = Err(RouterError::CustomDuplicateId { row, id });
                break;
            }
            Some(s) => *s = true,
        }
    }
    for &id in ids {
        if let Some(s) = seen.get_mut(id as usize) {
            *s = false;
        }
    }
    outcome
}
