//! The router against vLLM's router goldens (`$MOE_GOLDENS/router`, see the goldens README):
//! every case is routed with the configuration that mirrors its producing function, ids are
//! compared as sets per row, weights within the README's tolerance for the case's kind and dtype.
//!
//! Rows flagged `row_has_boundary_tie` may legitimately pick another tied expert or group: there
//! the sorted weights must match, or else the row must match the float64 reference router with
//! this crate's tie rule (a tie between groups changes which experts are eligible, so sorted
//! weights need not agree).

mod common;

use common::{RefAlgorithm, RefSpec};
use half::bf16;
use moe_router::{
    Grouping, IdsOut, Logits, RoundingProfile, Router, RouterConfig, ScalingPlacement, ScoringFunc,
};
use moe_testutil::{GoldenCase, for_each_golden_case};
use safetensors::Dtype;

/// The case's routing parameters, read from its metadata.
struct Params {
    kind: String,
    e: usize,
    k: usize,
    bf16_logits: bool,
    renormalize: bool,
    scoring: ScoringFunc,
    groups: Option<(usize, usize)>,
    scale: f32,
    bias: Option<Vec<f32>>,
    scale_on_output: bool,
}

impl Params {
    fn read(case: &GoldenCase) -> Self {
        let groups = match case.meta("num_expert_group") {
            serde_json::Value::Null => None,
            _ => Some((
                case.meta_i64("num_expert_group") as usize,
                case.meta_i64("topk_group") as usize,
            )),
        };
        let scale = case.meta("routed_scaling_factor");
        let scale = scale
            .as_f64()
            .or_else(|| scale.as_str().and_then(|s| s.parse().ok()))
            .expect("routed_scaling_factor is a number") as f32;
        Self {
            kind: case.meta_str("kind"),
            e: case.meta_i64("num_experts") as usize,
            k: case.meta_i64("top_k") as usize,
            bf16_logits: case.dtype("logits") == Dtype::BF16,
            renormalize: case.meta_bool("renormalize"),
            scoring: case
                .meta_str("scoring_func")
                .parse()
                .expect("known scoring_func"),
            groups,
            scale,
            bias: case.meta_bool("has_bias").then(|| case.f32s("bias")),
            scale_on_output: case.meta_bool("apply_routed_scaling_factor_on_output"),
        }
    }

    /// The configuration that mirrors the producing function, and the weight tolerance
    /// (absolute, plus a part relative to the expected weight).
    fn config(&self, rounding: RoundingProfile) -> Result<(RouterConfig, f32, f32), String> {
        let with_bias = |c: RouterConfig| match &self.bias {
            Some(b) => c.with_correction_bias(b.clone()),
            None => c,
        };
        let grouped = |(g, gk)| {
            with_bias(
                RouterConfig::grouped_topk(self.e, self.k, self.scoring, Grouping::new(g, gk))
                    .with_renormalize(self.renormalize)
                    .with_routed_scaling(self.scale, ScalingPlacement::OnWeights),
            )
        };
        let bf = self.bf16_logits;
        Ok(match self.kind.as_str() {
            "cpu_softmax" => {
                let c = RouterConfig::cpu_softmax(self.e, self.k)
                    .with_renormalize(self.renormalize)
                    .with_rounding(rounding);
                let (abs, rel) = match (bf, rounding) {
                    (false, _) => (1e-5, 0.0),
                    // Reproduces the per-op bf16 roundings: within two bf16 ulps.
                    (true, RoundingProfile::TorchEager) => (1e-7, 2.0 * 2f32.powi(-8)),
                    (true, _) => (2e-2, 0.0),
                };
                (c, abs, rel)
            }
            "cpu_grouped" => (grouped(self.groups.ok_or("no groups")?), 1e-5, 0.0),
            "generic_grouped" => {
                let tol = if bf { 1e-3 * self.scale.max(1.0) } else { 1e-5 };
                (
                    grouped(self.groups.ok_or("no groups")?).with_rounding(rounding),
                    tol,
                    0.0,
                )
            }
            "biased_topk" => {
                // SGLang's kernel scales only when renormalising and asked to.
                let placement = if self.renormalize && self.scale_on_output {
                    ScalingPlacement::OnWeights
                } else {
                    ScalingPlacement::OnOutput
                };
                let c = RouterConfig::scored_topk(self.e, self.k, self.scoring)
                    .with_renormalize(self.renormalize)
                    .with_routed_scaling(self.scale, placement);
                (with_bias(c), 1e-5, 0.0)
            }
            other => return Err(format!("unknown kind {other}")),
        })
    }

    fn reference(&self, router: &Router) -> RefSpec {
        let scoring = match self.scoring {
            ScoringFunc::Softmax => "softmax",
            ScoringFunc::Sigmoid => "sigmoid",
            _ => "sqrtsoftplus",
        };
        let algorithm = match (self.kind.as_str(), self.groups) {
            ("cpu_softmax", _) => RefAlgorithm::CpuSoftmax,
            (_, Some((g, gk))) => RefAlgorithm::Grouped(scoring, g, gk),
            _ => RefAlgorithm::Scored(scoring),
        };
        let on_weights = router.output_scale() == 1.0;
        RefSpec {
            algorithm,
            top_k: self.k,
            renormalize: self.renormalize,
            bias: self
                .bias
                .as_ref()
                .map(|b| b.iter().map(|&v| v as f64).collect()),
            scale: if on_weights { self.scale as f64 } else { 1.0 },
        }
    }
}

/// What a case showed: largest weight difference on rows without ties, tie rows, and tie rows
/// that needed the reference (another tie resolution than the golden's).
struct Outcome {
    max_diff: f32,
    tie_rows: usize,
    via_reference: usize,
}

/// Routes the case and compares with the golden.
fn check(case: &GoldenCase, rounding: RoundingProfile) -> Result<Outcome, String> {
    let p = Params::read(case);
    let (config, abs_tol, rel_tol) = p.config(rounding)?;
    let router = Router::new(config).map_err(|e| e.to_string())?;
    let mut scratch = router.new_scratch();
    let logits_f32 = case.f32s("logits");
    let bits = if p.bf16_logits {
        case.u16_bits("logits")
    } else {
        vec![]
    };
    let logits_bf16: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
    let logits = if p.bf16_logits {
        Logits::Bf16(&logits_bf16)
    } else {
        Logits::F32(&logits_f32)
    };
    let m = logits_f32.len() / p.e;
    let mut weights = vec![0f32; m * p.k];
    let mut ids = vec![0i32; m * p.k];
    router
        .route_into(logits, &mut weights, IdsOut::I32(&mut ids), &mut scratch)
        .map_err(|e| e.to_string())?;

    let want_w = case.f32s("topk_weights");
    let want_ids = case.i64s("topk_ids");
    let ties = case.i64s("row_has_boundary_tie");
    let descending_order = case.meta_str("ids_order").starts_with("descending");
    let reference = p.reference(&router);
    let within = |got: f32, want: f32| (got - want).abs() <= abs_tol + rel_tol * want.abs();
    let mut max_diff = 0f32;
    let (mut tie_rows, mut via_reference) = (0, 0);
    for row in 0..m {
        let r = row * p.k..(row + 1) * p.k;
        let mut got: Vec<(i64, f32)> = ids[r.clone()]
            .iter()
            .map(|&i| i as i64)
            .zip(weights[r.clone()].iter().copied())
            .collect();
        let mut want: Vec<(i64, f32)> = want_ids[r.clone()]
            .iter()
            .copied()
            .zip(want_w[r.clone()].iter().copied())
            .collect();
        if ties[row] == 0 {
            if descending_order && got.iter().map(|g| g.0).ne(want.iter().map(|w| w.0)) {
                return Err(format!("row {row}: id order {got:?} != {want:?}"));
            }
            got.sort_by_key(|g| g.0);
            want.sort_by_key(|w| w.0);
            if got.iter().map(|g| g.0).ne(want.iter().map(|w| w.0)) {
                return Err(format!("row {row}: ids {got:?} != {want:?}"));
            }
            for (g, w) in got.iter().zip(&want) {
                max_diff = max_diff.max((g.1 - w.1).abs());
                if !within(g.1, w.1) {
                    return Err(format!(
                        "row {row} expert {}: weight {} vs {}",
                        g.0, g.1, w.1
                    ));
                }
            }
            continue;
        }
        tie_rows += 1;
        let mut gs: Vec<f32> = got.iter().map(|g| g.1).collect();
        let mut ws: Vec<f32> = want.iter().map(|w| w.1).collect();
        gs.sort_by(f32::total_cmp);
        ws.sort_by(f32::total_cmp);
        if gs.iter().zip(&ws).all(|(&g, &w)| within(g, w)) {
            continue;
        }
        // A different tie resolution (typically between groups): check against the reference.
        via_reference += 1;
        let x: Vec<f64> = logits_f32[row * p.e..(row + 1) * p.e]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let (ref_ids, ref_w) = common::route(&reference, &x);
        let ref_tol = if p.bf16_logits && p.kind != "cpu_grouped" {
            2e-2
        } else {
            1e-5
        };
        for (j, (&id, &w)) in ids[r.clone()].iter().zip(&weights[r.clone()]).enumerate() {
            if id as usize != ref_ids[j] || (w as f64 - ref_w[j]).abs() > ref_tol {
                return Err(format!(
                    "tie row {row}: ({id}, {w}) differs from the golden and from the reference \
                     ({}, {})",
                    ref_ids[j], ref_w[j]
                ));
            }
        }
    }
    Ok(Outcome {
        max_diff,
        tie_rows,
        via_reference,
    })
}

fn run(area_label: &str, rounding_for: impl Fn(&str) -> RoundingProfile) {
    for_each_golden_case("router", |case| {
        let rounding = rounding_for(&case.meta_str("kind"));
        let o = check(case, rounding)?;
        eprintln!(
            "{area_label} {:<72} max |dw| {:.3e}  tie rows {} (via reference {})",
            case.name, o.max_diff, o.tie_rows, o.via_reference
        );
        Ok(())
    });
}

/// Each kind with the profile that reproduces its producing function.
#[test]
fn router_goldens_with_matching_rounding() {
    run("matching", |kind| match kind {
        "cpu_softmax" => RoundingProfile::TorchEager,
        "generic_grouped" => RoundingProfile::TorchCompiled,
        _ => RoundingProfile::F32,
    });
}

/// Every kind computed in f32 stays within the README's tolerance for an f32 implementation.
#[test]
fn router_goldens_in_f32() {
    run("f32", |_| RoundingProfile::F32);
}
