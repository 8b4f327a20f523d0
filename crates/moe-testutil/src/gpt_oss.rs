//! A small gpt-oss-shaped MXFP4 checkpoint written by tests, and the f64 forward of its MoE
//! block computed the way transformers' `GptOssExperts` does from the dequantized weights.
//!
//! The layer stores the experts fused per layer: `gate_up_proj_blocks` `[E, 2I, H/32, 16]`
//! (e2m1 codes, element `2j` of a block in the low nibble of byte `j`), `gate_up_proj_scales`
//! `[E, 2I, H/32]` (e8m0), `gate_up_proj_bias` `[E, 2I]` (bf16), the same for `down_proj`
//! (`[E, H, I/32, 16]`, `[E, H, I/32]`, `[E, H]`), and the router `mlp.router.weight` `[E, H]`
//! with `mlp.router.bias` `[E]`. Gate and up rows of `gate_up_proj` alternate.

use std::collections::BTreeMap;
use std::path::Path;

use half::bf16;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};

use crate::SplitMix64;

/// The e2m1 value of each 4-bit code.
pub const E2M1: [f64; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// SwiGLU-OAI's sigmoid slope.
pub const ALPHA: f64 = 1.702;

/// One stored tensor: dtype, shape, little-endian bytes.
pub type Tensor = (Dtype, Vec<usize>, Vec<u8>);

/// A one-layer gpt-oss MoE block with random MXFP4 experts.
#[derive(Debug, Clone)]
pub struct GptOss {
    /// Experts.
    pub e: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Hidden size.
    pub h: usize,
    /// Intermediate size (a multiple of 32).
    pub i: usize,
    /// `swiglu_limit`.
    pub limit: f64,
    /// Router weight `[E, H]` and bias `[E]`, bf16 values.
    pub router_w: Vec<f32>,
    /// Router bias `[E]`.
    pub router_b: Vec<f32>,
    /// `[E, 2I, ceil(H/32), 16]`.
    pub blocks13: Vec<u8>,
    /// `[E, 2I, ceil(H/32)]`.
    pub scales13: Vec<u8>,
    /// `[E, 2I]`, bf16 values.
    pub bias13: Vec<f32>,
    /// `[E, H, I/32, 16]`.
    pub blocks2: Vec<u8>,
    /// `[E, H, I/32]`.
    pub scales2: Vec<u8>,
    /// `[E, H]`, bf16 values.
    pub bias2: Vec<f32>,
}

fn bf16_round(v: Vec<f32>) -> Vec<f32> {
    v.into_iter().map(|x| bf16::from_f32(x).to_f32()).collect()
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
        .collect()
}

impl GptOss {
    /// Random experts: codes uniform over all 16, scales `2^-5..2^-2` (so weights reach
    /// ±1.5), biases and router in bf16.
    pub fn random(seed: u64, [e, top_k, h, i]: [usize; 4], limit: f64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let (hb, ib) = (h.div_ceil(32), i.div_ceil(32));
        let mut bytes = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.below(256) as u8).collect() };
        let blocks13 = bytes(e * 2 * i * hb * 16);
        let blocks2 = bytes(e * h * ib * 16);
        let mut scales =
            |n: usize| -> Vec<u8> { (0..n).map(|_| 122 + rng.below(4) as u8).collect() };
        let scales13 = scales(e * 2 * i * hb);
        let scales2 = scales(e * h * ib);
        Self {
            e,
            top_k,
            h,
            i,
            limit,
            router_w: bf16_round(rng.vec_uniform(e * h, -0.5, 0.5)),
            router_b: bf16_round(rng.vec_uniform(e, -0.5, 0.5)),
            blocks13,
            scales13,
            bias13: bf16_round(rng.vec_uniform(e * 2 * i, -0.5, 0.5)),
            blocks2,
            scales2,
            bias2: bf16_round(rng.vec_uniform(e * h, -0.5, 0.5)),
        }
    }

    /// `config.json`.
    pub fn config(&self) -> Value {
        json!({
            "model_type": "gpt_oss",
            "architectures": ["GptOssForCausalLM"],
            "torch_dtype": "bfloat16",
            "hidden_act": "silu",
            "hidden_size": self.h,
            "intermediate_size": self.i,
            "num_hidden_layers": 1,
            "num_local_experts": self.e,
            "num_experts_per_tok": self.top_k,
            "experts_per_token": self.top_k,
            "swiglu_limit": self.limit,
            "quantization_config": {
                "quant_method": "mxfp4",
                "modules_to_not_convert": [
                    "model.layers.*.self_attn",
                    "model.layers.*.mlp.router",
                    "model.embed_tokens",
                    "lm_head"
                ]
            }
        })
    }

    /// Every tensor of layer 0, by name.
    pub fn tensors(&self) -> BTreeMap<String, Tensor> {
        let (e, h, i) = (self.e, self.h, self.i);
        let (hb, ib) = (h.div_ceil(32), i.div_ceil(32));
        let p = "model.layers.0.mlp";
        let mut t = BTreeMap::new();
        let mut put = |name: String, dtype, shape: &[usize], bytes| {
            t.insert(name, (dtype, shape.to_vec(), bytes));
        };
        put(
            format!("{p}.router.weight"),
            Dtype::BF16,
            &[e, h],
            bf16_bytes(&self.router_w),
        );
        put(
            format!("{p}.router.bias"),
            Dtype::BF16,
            &[e],
            bf16_bytes(&self.router_b),
        );
        let x = format!("{p}.experts");
        put(
            format!("{x}.gate_up_proj_blocks"),
            Dtype::U8,
            &[e, 2 * i, hb, 16],
            self.blocks13.clone(),
        );
        put(
            format!("{x}.gate_up_proj_scales"),
            Dtype::U8,
            &[e, 2 * i, hb],
            self.scales13.clone(),
        );
        put(
            format!("{x}.gate_up_proj_bias"),
            Dtype::BF16,
            &[e, 2 * i],
            bf16_bytes(&self.bias13),
        );
        put(
            format!("{x}.down_proj_blocks"),
            Dtype::U8,
            &[e, h, ib, 16],
            self.blocks2.clone(),
        );
        put(
            format!("{x}.down_proj_scales"),
            Dtype::U8,
            &[e, h, ib],
            self.scales2.clone(),
        );
        put(
            format!("{x}.down_proj_bias"),
            Dtype::BF16,
            &[e, h],
            bf16_bytes(&self.bias2),
        );
        t
    }

    /// `config.json` of the same model stored in bf16 (no `quantization_config`).
    pub fn bf16_config(&self) -> Value {
        let mut config = self.config();
        config
            .as_object_mut()
            .expect("an object")
            .remove("quantization_config");
        config
    }

    /// Layer 0 as gpt-oss's bf16 checkpoints store it: the dequantized experts (exact in
    /// bf16: two significant bits times a power of two) fused with K leading, `gate_up_proj`
    /// `[E, H, 2I]` (gate `j` at column `2j`, up `j` at `2j + 1`) and `down_proj`
    /// `[E, I, H]`, beside the MXFP4 layout's biases and router.
    pub fn bf16_tensors(&self) -> BTreeMap<String, Tensor> {
        let (e, h, i) = (self.e, self.h, self.i);
        let mut t = self.tensors();
        t.retain(|name, _| !name.ends_with("_blocks") && !name.ends_with("_scales"));
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        for x in 0..e {
            let w13 = Self::dequant(&self.blocks13, &self.scales13, x, 2 * i, h);
            gate_up.extend((0..h * 2 * i).map(|s| w13[(s % (2 * i)) * h + s / (2 * i)] as f32));
            let w2 = Self::dequant(&self.blocks2, &self.scales2, x, h, i);
            down.extend((0..i * h).map(|s| w2[(s % h) * i + s / h] as f32));
        }
        let x = "model.layers.0.mlp.experts";
        let bf16 = |name: &str, shape: Vec<usize>, v: &[f32]| {
            (format!("{x}.{name}"), (Dtype::BF16, shape, bf16_bytes(v)))
        };
        t.extend([
            bf16("gate_up_proj", vec![e, h, 2 * i], &gate_up),
            bf16("down_proj", vec![e, i, h], &down),
        ]);
        t
    }

    /// Writes `config.json` and `model.safetensors` with `tensors` into `dir`.
    pub fn write_with(config: &Value, tensors: &BTreeMap<String, Tensor>, dir: &Path) {
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap();
        std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    }

    /// Writes the checkpoint into `dir`.
    pub fn write(&self, dir: &Path) {
        Self::write_with(&self.config(), &self.tensors(), dir);
    }

    /// Expert `x`'s weights `[n, k]` dequantized exactly from `[E, n, ceil(k/32), 16]` blocks.
    fn dequant(blocks: &[u8], scales: &[u8], x: usize, n: usize, k: usize) -> Vec<f64> {
        let kb = k.div_ceil(32);
        let mut w = vec![0f64; n * k];
        for r in 0..n {
            for c in 0..k {
                let row = x * n + r;
                let byte = blocks[(row * kb + c / 32) * 16 + (c % 32) / 2];
                let code = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
                let s = 2f64.powi(i32::from(scales[row * kb + c / 32]) - 127);
                w[r * k + c] = E2M1[usize::from(code)] * s;
            }
        }
        w
    }

    /// The router's choice for every token: `(ids, weights)` `[T, k]`, top-k of the logits
    /// `x·Wᵀ + b` (ties to the lower id), softmax over the k chosen logits.
    pub fn route(&self, x: &[f32]) -> (Vec<usize>, Vec<f64>) {
        let (e, h, k) = (self.e, self.h, self.top_k);
        let mut ids = Vec::new();
        let mut weights = Vec::new();
        for row in x.chunks_exact(h) {
            let logits: Vec<f64> = (0..e)
                .map(|x| {
                    (0..h)
                        .map(|c| f64::from(row[c]) * f64::from(self.router_w[x * h + c]))
                        .sum::<f64>()
                        + f64::from(self.router_b[x])
                })
                .collect();
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
            let top = &order[..k];
            let max = logits[top[0]];
            let exps: Vec<f64> = top.iter().map(|&x| (logits[x] - max).exp()).collect();
            let sum: f64 = exps.iter().sum();
            ids.extend_from_slice(top);
            weights.extend(exps.iter().map(|v| v / sum));
        }
        (ids, weights)
    }

    /// The block's output `[T, H]` in f64 for a given routing: per chosen expert
    /// `gu = W13·x + b13`, gate `g = min(gu[2j], L)`, up `u = clamp(gu[2j+1], −L, L)`,
    /// `a = (u + 1)·g·σ(α·g)`, `y = W2·a + b2`, summed with the routing weights.
    pub fn forward(&self, x: &[f32], ids: &[usize], weights: &[f64]) -> Vec<f64> {
        let (h, i, k, l) = (self.h, self.i, self.top_k, self.limit);
        let w13: Vec<Vec<f64>> = (0..self.e)
            .map(|x| Self::dequant(&self.blocks13, &self.scales13, x, 2 * i, h))
            .collect();
        let w2: Vec<Vec<f64>> = (0..self.e)
            .map(|x| Self::dequant(&self.blocks2, &self.scales2, x, h, i))
            .collect();
        let tokens = x.len() / h;
        let mut out = vec![0f64; tokens * h];
        for t in 0..tokens {
            let row = &x[t * h..][..h];
            for s in 0..k {
                let (ex, wt) = (ids[t * k + s], weights[t * k + s]);
                let gu: Vec<f64> = (0..2 * i)
                    .map(|r| {
                        (0..h)
                            .map(|c| w13[ex][r * h + c] * f64::from(row[c]))
                            .sum::<f64>()
                            + f64::from(self.bias13[ex * 2 * i + r])
                    })
                    .collect();
                let a: Vec<f64> = (0..i)
                    .map(|j| {
                        let g = gu[2 * j].min(l);
                        let u = gu[2 * j + 1].clamp(-l, l);
                        (u + 1.0) * g / (1.0 + (-ALPHA * g).exp())
                    })
                    .collect();
                for r in 0..h {
                    let y = (0..i).map(|j| w2[ex][r * i + j] * a[j]).sum::<f64>()
                        + f64::from(self.bias2[ex * h + r]);
                    out[t * h + r] += wt * y;
                }
            }
        }
        out
    }

    /// How many gate and up values of the chosen experts the clamp changes, out of how many
    /// (so a test can show its limit clips).
    pub fn clipped(&self, x: &[f32], ids: &[usize]) -> (usize, usize) {
        let (h, i, l) = (self.h, self.i, self.limit);
        let mut clipped = 0;
        let mut total = 0;
        for (t, row) in x.chunks_exact(h).enumerate() {
            for &ex in &ids[t * self.top_k..][..self.top_k] {
                let w = Self::dequant(&self.blocks13, &self.scales13, ex, 2 * i, h);
                for r in 0..2 * i {
                    let v = (0..h)
                        .map(|c| w[r * h + c] * f64::from(row[c]))
                        .sum::<f64>()
                        + f64::from(self.bias13[ex * 2 * i + r]);
                    total += 1;
                    if v > l || (r % 2 == 1 && v < -l) {
                        clipped += 1;
                    }
                }
            }
        }
        (clipped, total)
    }
}
