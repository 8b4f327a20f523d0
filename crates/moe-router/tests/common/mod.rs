//! A naive float64 reference router for the tests: every algorithm of spec §2 written the
//! obvious way (full sorts, no scratch), with the crate's tie rule (larger value first, then the
//! lower index), so the optimised router can be checked against it on any input.

#![allow(dead_code)]

/// What the reference computes.
#[derive(Debug, Clone)]
pub enum RefAlgorithm {
    /// Top-k on the logits, softmax over the chosen or `exp(v - logsumexp)`.
    CpuSoftmax,
    /// Score (`"softmax"`, `"sigmoid"`, `"sqrtsoftplus"`), bias for selection, top-k.
    Scored(&'static str),
    /// Grouped top-k: scoring, groups, kept groups.
    Grouped(&'static str, usize, usize),
    /// Top-k on logits, sigmoid weights.
    Llama4,
}

/// A reference configuration.
#[derive(Debug, Clone)]
pub struct RefSpec {
    pub algorithm: RefAlgorithm,
    pub top_k: usize,
    pub renormalize: bool,
    pub bias: Option<Vec<f64>>,
    /// Multiplies the final weights.
    pub scale: f64,
}

/// Indices of the `k` largest values, larger first, ties to the lower index.
pub fn ranked(values: &[f64], k: usize, allowed: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).filter(|&i| allowed(i)).collect();
    idx.sort_by(|&a, &b| values[b].partial_cmp(&values[a]).unwrap().then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

fn score(scoring: &str, x: &[f64]) -> Vec<f64> {
    match scoring {
        "softmax" => {
            let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|v| v / s).collect()
        }
        "sigmoid" => x.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
        "sqrtsoftplus" => x.iter().map(|v| (1.0 + v.exp()).ln().sqrt()).collect(),
        other => panic!("unknown scoring {other}"),
    }
}

/// Routes one token: the chosen ids (in selection order) and their weights.
pub fn route(spec: &RefSpec, x: &[f64]) -> (Vec<usize>, Vec<f64>) {
    let k = spec.top_k;
    let (ids, mut w): (Vec<usize>, Vec<f64>) = match &spec.algorithm {
        RefAlgorithm::CpuSoftmax => {
            let ids = ranked(x, k, |_| true);
            let m = x[ids[0]];
            let w: Vec<f64> = if spec.renormalize {
                let s: f64 = ids.iter().map(|&i| (x[i] - m).exp()).sum();
                ids.iter().map(|&i| (x[i] - m).exp() / s).collect()
            } else {
                let s: f64 = x.iter().map(|v| (v - m).exp()).sum();
                ids.iter().map(|&i| (x[i] - m).exp() / s).collect()
            };
            return (ids, w.iter().map(|v| v * spec.scale).collect());
        }
        RefAlgorithm::Llama4 => {
            let ids = ranked(x, k, |_| true);
            let w = ids.iter().map(|&i| 1.0 / (1.0 + (-x[i]).exp())).collect();
            return (ids, w);
        }
        RefAlgorithm::Scored(scoring) => {
            let s = score(scoring, x);
            let sel = selection(&s, spec.bias.as_deref());
            let ids = ranked(&sel, k, |_| true);
            let w = ids.iter().map(|&i| s[i]).collect();
            (ids, w)
        }
        RefAlgorithm::Grouped(scoring, g, gk) => {
            let s = score(scoring, x);
            let sel = selection(&s, spec.bias.as_deref());
            let size = x.len() / g;
            let group_scores: Vec<f64> = sel
                .chunks(size)
                .map(|c| {
                    let mut c = c.to_vec();
                    c.sort_by(|a, b| b.partial_cmp(a).unwrap());
                    if spec.bias.is_some() {
                        c[0] + c[1]
                    } else {
                        c[0]
                    }
                })
                .collect();
            let kept = ranked(&group_scores, *gk, |_| true);
            let ids = ranked(&sel, k, |i| kept.contains(&(i / size)));
            let w = ids.iter().map(|&i| s[i]).collect();
            (ids, w)
        }
    };
    if spec.renormalize {
        let sum: f64 = w.iter().sum();
        if sum > 0.0 {
            w.iter_mut().for_each(|v| *v /= sum);
        }
    }
    (ids, w.iter().map(|v| v * spec.scale).collect())
}

fn selection(s: &[f64], bias: Option<&[f64]>) -> Vec<f64> {
    match bias {
        Some(b) => s.iter().zip(b).map(|(s, b)| s + b).collect(),
        None => s.to_vec(),
    }
}
