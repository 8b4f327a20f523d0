//! Embedding the MoE layer in a Rust inference runtime built on candle: the runtime's MoE
//! module wraps a [`MoeLayer`], takes a candle tensor of hidden states (`[T, H]` or
//! `[B, S, H]`, bf16 / f16 / f32) and returns one of the same shape and dtype, running on the
//! runtime's own rayon pool.
//!
//! Run it on a fixture checkpoint (default: `qwen3moe-w4a8-g32` under `$MOE_FIXTURES`, else
//! under `../shared/fixtures` next to the workspace):
//!
//! ```text
//! cargo run -p moe-layer --example candle_runtime [-- MODEL_DIR]
//! ```
//!
//! It loads `x` from the fixture's `expected.safetensors` as a candle tensor, runs layer 0's
//! MoE block, and checks the result against `out_vllm` within the fixtures README's tolerance
//! (`1e-2 × max|out_vllm|`), exiting with an error otherwise. `cargo test` runs the same check
//! (this example is also built as a test).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use moe_layer::MoeLayer;
use moe_layer::checkpoint::{Checkpoint, ShardAccess};

/// The runtime's MoE block: router and experts of one decoder layer.
struct CandleMoeBlock {
    layer: MoeLayer,
}

impl CandleMoeBlock {
    /// Loads and prepares decoder layer `index`'s MoE block of the model in `dir`.
    fn load(dir: &Path, index: usize, max_tokens: usize) -> candle_core::Result<Self> {
        let ckpt = Checkpoint::open(dir, ShardAccess::Mmap).map_err(candle_core::Error::wrap)?;
        let layer = MoeLayer::from_checkpoint(&ckpt, index, max_tokens)
            .map_err(candle_core::Error::wrap)?;
        Ok(Self { layer })
    }

    /// Routes with the checkpoint's gate and runs the experts. The compute follows the
    /// input's dtype, as vLLM's does.
    fn forward(&self, hidden_states: &Tensor) -> candle_core::Result<Tensor> {
        let shape = hidden_states.shape().clone();
        let x = hidden_states.flatten_all()?;
        let out = match x.dtype() {
            DType::BF16 => self.run(&x.to_vec1::<bf16>()?)?,
            DType::F16 => self.run(&x.to_vec1::<f16>()?)?,
            DType::F32 => self.run(&x.to_vec1::<f32>()?)?,
            other => candle_core::bail!("MoE block: unsupported dtype {other:?}"),
        };
        out.reshape(shape)
    }

    fn run<X>(&self, x: &[X]) -> candle_core::Result<Tensor>
    where
        X: moe_kernels::moe::MoeFloat + candle_core::WithDType,
    {
        let k = self.layer.config().top_k;
        let pairs = x.len() / self.layer.config().hidden * k;
        let (mut ids, mut weights) = (vec![0i32; pairs], vec![0f32; pairs]);
        let mut out = vec![X::from_f32(0.0); x.len()];
        self.layer
            .route_hidden(x, &mut ids, &mut weights)
            .and_then(|_| self.layer.apply_with_topk(x, &ids, &weights, &mut out))
            .map_err(candle_core::Error::wrap)?;
        Tensor::from_vec(out, x.len(), &Device::Cpu)
    }
}

/// The model directory: the first argument, else the fixture (the test harness's own
/// arguments are not model directories, so the test always uses the fixture).
fn fixture_dir() -> PathBuf {
    let arg = std::env::args().nth(1).filter(|_| !cfg!(test));
    arg.map(PathBuf::from)
        .unwrap_or_else(|| moe_testutil::fixtures_dir().join("qwen3moe-w4a8-g32"))
}

fn main() -> candle_core::Result<()> {
    let dir = fixture_dir();
    let block = CandleMoeBlock::load(&dir, 0, 64)?;
    let expected = candle_core::safetensors::load(dir.join("expected.safetensors"), &Device::Cpu)?;
    let get = |name: &str| {
        expected
            .get(name)
            .cloned()
            .ok_or_else(|| candle_core::Error::msg(format!("expected.safetensors has no {name}")))
    };
    let (x, want) = (get("x")?, get("out_vllm")?);
    // As a runtime would: batch 1, sequence T, on the runtime's own pool of two threads.
    let (t, h) = x.dims2()?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .map_err(candle_core::Error::wrap)?;
    let out = pool.install(|| block.forward(&x.reshape((1, t, h))?))?;
    assert_eq!(out.dims(), [1, t, h]);
    assert_eq!(out.dtype(), x.dtype());

    let out = out.reshape((t, h))?.to_dtype(DType::F32)?;
    let want = want.to_dtype(DType::F32)?;
    let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
    let diff = (out - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
    let backend = block.layer.backend().map(|b| b.kernel).unwrap_or_default();
    println!(
        "{}: {t} tokens through {backend}; max |out - out_vllm| {diff:.3e}, tolerance {:.3e}",
        dir.display(),
        1e-2 * scale
    );
    if !(scale > 0.0 && diff <= 1e-2 * scale) {
        candle_core::bail!(
            "output differs from out_vllm by {diff} (tolerance {})",
            1e-2 * scale
        );
    }
    Ok(())
}

#[test]
fn the_candle_block_reproduces_the_fixture() {
    if let Err(e) = main() {
        panic!("{e}");
    }
}
