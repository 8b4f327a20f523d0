//! The kernel candidates and their support hooks: vLLM's expert classes (reproduced with their
//! exact acceptance sets, for [`Strictness::VllmCompat`](crate::Strictness)) and moe-rs's CPU
//! kernels (our capability table, for native mode).
//!
//! Each hook answers one question of vLLM's `is_supported_config` (spec 7.6) and returns
//! `Err(Unsupported)` with the reason text vLLM would give. The hooks are methods of
//! [`KernelId`], defined in its own module without them; the `support` module, a layer above,
//! asks them in vLLM's order.
//!
//! Where our kernels accept more than vLLM's (documented per hook):
//! - W4A8 runs on x86-64 and AArch64 (vLLM: Arm only, "kernel only supports Arm CPU").
//! - W4A8 and W8A8 accept expert parallelism through the expert map (vLLM: `ep_size == 1` for
//!   W4A8, no EP for Arm int8).
//! - W4A8 and W8A8 accept GELU, GELU_TANH, SWIGLUOAI in both gate/up layouts and SWIGLUSTEP,
//!   computed as named (vLLM's int4 kernel drops SWIGLUSTEP's clamps, spec 3.3).
//! - Our monolithic kernels accept every routing method moe-router implements (vLLM: softmax
//!   methods only).
//! - W4A8 accepts f32 or bf16 scales for both channelwise and grouped weights, and any group
//!   size that is a multiple of 32.
//! - Our kernels are batch invariant (fixed reduction order), which vLLM's CPU kernels do not
//!   claim.

use moe_quant::{DType, QuantKey, WeightGroups};

use crate::activation::MoEActivation;
use crate::config::ParallelConfig;
pub use crate::kernel_id::{Kernel, KernelId};
use crate::platform::{CpuArch, Isa, Platform};
use crate::quant_config::{PyOpt, ScalarQuantKey, WeightKey};
use crate::query::{ActivationFormat, SupportQuery};
use crate::routing::RoutingMethodType;
use crate::unsupported::Unsupported;

/// The all-to-all backends vLLM's Marlin experts refuse (FlashInfer NVLink one- and two-sided).
/// The exact upstream spellings are an assumption.
pub const FLASHINFER_NVLINK_BACKENDS: [&str; 2] =
    ["flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided"];

impl Kernel {
    /// The kernel as it runs on a platform.
    pub fn on(id: KernelId, platform: &Platform) -> Self {
        let isa = id.has_rungs().then(|| platform.best_isa());
        Self { id, isa }
    }
}

const OUR_GATED: [MoEActivation; 6] = [
    MoEActivation::Silu,
    MoEActivation::Gelu,
    MoEActivation::GeluTanh,
    MoEActivation::Swigluoai,
    MoEActivation::SwigluoaiUninterleave,
    MoEActivation::Swiglustep,
];

const FLOAT_IO: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// How Python prints a torch dtype (`torch.float32`).
pub(crate) fn torch_repr(d: DType) -> String {
    format!("torch.{}", d.torch_name())
}

impl KernelId {
    fn is_gpu_stub(self) -> bool {
        matches!(
            self,
            KernelId::VllmTritonExperts
                | KernelId::VllmBatchedHummingGroupedExperts
                | KernelId::VllmHummingGroupedExperts
                | KernelId::VllmHummingIndexedExperts
        )
    }

    /// Monolithic experts take router logits and route themselves; modular ones take
    /// precomputed top-k weights and ids.
    pub fn is_monolithic(self) -> bool {
        matches!(
            self,
            KernelId::VllmCpuExpertsInt4
                | KernelId::VllmCpuExpertsInt8
                | KernelId::VllmArmCpuExpertsInt8
                | KernelId::CpuInt4W4A8
                | KernelId::CpuInt8W8A8
        )
    }

    /// The activation format the kernel consumes.
    pub fn activation_format(self) -> ActivationFormat {
        match self {
            KernelId::VllmBatchedMarlinExperts | KernelId::VllmBatchedHummingGroupedExperts => {
                ActivationFormat::BatchedExperts
            }
            _ => ActivationFormat::Standard,
        }
    }

    /// Checks a kernel class makes before the common ones (its `is_supported_config`
    /// override). `CPUExpertsInt4`: Arm CPU, float in/out dtype. The PyTorch-version check has
    /// no equivalent here.
    pub fn pre_check(self, q: &SupportQuery<'_>) -> Result<(), Unsupported> {
        match self {
            KernelId::VllmCpuExpertsInt4 => {
                if !q.platform.is_cpu() || q.platform.arch() != CpuArch::Aarch64 {
                    return Err(Unsupported::new("kernel only supports Arm CPU"));
                }
                if !FLOAT_IO.contains(&q.config.in_dtype) {
                    return Err(Unsupported::kernel_does_not_support(format!(
                        "{} input/output dtype",
                        torch_repr(q.config.in_dtype)
                    )));
                }
                Ok(())
            }
            // Ours accepts every architecture (the scalar rung runs anywhere).
            KernelId::CpuInt4W4A8
            | KernelId::CpuMarlin
            | KernelId::CpuWna16
            | KernelId::CpuUnquantized => {
                if !FLOAT_IO.contains(&q.config.in_dtype) {
                    return Err(Unsupported::kernel_does_not_support(format!(
                        "{} input/output dtype",
                        q.config.in_dtype
                    )));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Check 1: the current device.
    pub fn supports_current_device(self, platform: &Platform) -> Result<(), Unsupported> {
        let ok = match self {
            KernelId::VllmCpuExpertsInt4 => platform.is_cpu(),
            KernelId::VllmCpuExpertsInt8 => {
                platform.is_cpu() && platform.arch() == CpuArch::X86_64 && platform.has(Isa::Amx)
            }
            KernelId::VllmArmCpuExpertsInt8 => {
                platform.is_cpu() && platform.arch() == CpuArch::Aarch64
            }
            KernelId::VllmMarlinExperts | KernelId::VllmBatchedMarlinExperts => {
                platform.gpu().is_some_and(|g| g.capability >= (7, 5))
            }
            k if k.is_gpu_stub() => platform.gpu().is_some(),
            _ => platform.is_cpu(),
        };
        if ok {
            Ok(())
        } else {
            Err(Unsupported::kernel_does_not_support(format!(
                "current device {}",
                platform.device_name()
            )))
        }
    }

    /// Whether non-gated (`*_no_mul`) MLPs are supported. None of ours: the fused pipeline
    /// implements gated activations only, so a non-gated model is refused rather than
    /// computed as something else.
    pub fn supports_no_act_and_mul(self) -> bool {
        matches!(
            self,
            KernelId::VllmMarlinExperts | KernelId::VllmBatchedMarlinExperts
        ) || self.is_gpu_stub()
    }

    /// Check 2: `is_act_and_mul || supports_no_act_and_mul`.
    pub fn supports_act_and_mul(self, is_act_and_mul: bool) -> Result<(), Unsupported> {
        if is_act_and_mul || self.supports_no_act_and_mul() {
            Ok(())
        } else {
            Err(Unsupported::kernel_does_not_support(
                "no act_and_mul MLP layer",
            ))
        }
    }

    /// Check 3: the activation function.
    pub fn supports_activation(self, act: MoEActivation) -> Result<(), Unsupported> {
        use MoEActivation as A;
        let ok = match self {
            KernelId::VllmCpuExpertsInt4 => matches!(act, A::Silu | A::Swigluoai | A::Swiglustep),
            KernelId::VllmCpuExpertsInt8 => act == A::Silu,
            KernelId::VllmArmCpuExpertsInt8 => {
                matches!(act, A::Silu | A::Swigluoai | A::Gelu | A::GeluTanh)
            }
            KernelId::VllmMarlinExperts | KernelId::VllmBatchedMarlinExperts => matches!(
                act,
                A::Silu
                    | A::Gelu
                    | A::Swigluoai
                    | A::Swiglustep
                    | A::SiluNoMul
                    | A::GeluNoMul
                    | A::Relu2NoMul
            ),
            KernelId::CpuInt4W4A8
            | KernelId::CpuInt8W8A8
            | KernelId::CpuMarlin
            | KernelId::CpuWna16
            | KernelId::CpuUnquantized => OUR_GATED.contains(&act),
            _ => true,
        };
        if ok {
            Ok(())
        } else if self.is_ours() {
            Err(Unsupported::kernel_does_not_support(format!(
                "{act} activation"
            )))
        } else {
            Err(Unsupported::kernel_does_not_support(format!(
                "{} activation",
                act.python_str()
            )))
        }
    }

    /// Check 4: the quantization scheme (weight key × activation key).
    pub fn supports_quant_scheme(
        self,
        w: Option<&WeightKey>,
        a: Option<&QuantKey>,
    ) -> Result<(), Unsupported> {
        let wq = match w {
            Some(WeightKey::Quant(k)) => Some(*k),
            _ => None,
        };
        let ok = match self {
            KernelId::VllmCpuExpertsInt4 => {
                a.is_none()
                    && wq.is_some_and(|k| {
                        [
                            QuantKey::INT4_W4A8_STATIC_CHANNEL_SYM,
                            QuantKey::INT4_W4A8_STATIC_GROUP128_SYM,
                            QuantKey::INT4_W4A8_STATIC_GROUP64_SYM,
                            QuantKey::INT4_W4A8_STATIC_GROUP32_SYM,
                        ]
                        .contains(&k)
                    })
            }
            KernelId::CpuInt4W4A8 => a.is_none() && wq.is_some_and(our_w4a8_key),
            KernelId::VllmCpuExpertsInt8
            | KernelId::VllmArmCpuExpertsInt8
            | KernelId::CpuInt8W8A8 => {
                wq == Some(QuantKey::INT8_STATIC_CHANNEL_SYM)
                    && a == Some(&QuantKey::INT8_DYNAMIC_TOKEN_SYM)
            }
            KernelId::VllmMarlinExperts | KernelId::VllmBatchedMarlinExperts => match w {
                Some(WeightKey::Scalar(k)) => {
                    *k == ScalarQuantKey::INT4_STATIC || *k == ScalarQuantKey::INT8_STATIC
                }
                Some(WeightKey::Quant(k)) => [
                    QuantKey::FP8_STATIC_128_BLOCK_SYM,
                    QuantKey::FP8_STATIC_CHANNEL_SYM,
                    QuantKey::FP8_STATIC_TENSOR_SYM,
                ]
                .contains(k),
                None => false,
            },
            KernelId::CpuMarlin => match w {
                Some(WeightKey::Scalar(k)) => our_wna16_key(k),
                _ => false,
            },
            // MXFP4 and FP8 run on the WNA16 kernels (e2m1 and e4m3 codes through their value
            // decoders); the Marlin executor decodes integers only.
            KernelId::CpuWna16 => match w {
                Some(WeightKey::Scalar(k)) => {
                    our_wna16_key(k) || *k == ScalarQuantKey::MXFP4_STATIC
                }
                Some(WeightKey::Quant(k)) => [
                    QuantKey::FP8_STATIC_128_BLOCK_SYM,
                    QuantKey::FP8_STATIC_CHANNEL_SYM,
                    QuantKey::FP8_STATIC_TENSOR_SYM,
                ]
                .contains(k),
                None => false,
            },
            KernelId::CpuUnquantized => w.is_none() && a.is_none(),
            _ => true,
        };
        if ok {
            Ok(())
        } else {
            Err(Unsupported::kernel_does_not_support(format!(
                "quantization scheme {}x{}",
                PyOpt(w),
                PyOpt(a)
            )))
        }
    }

    /// Check 5: the parallel configuration.
    pub fn supports_parallel_config(self, p: &ParallelConfig) -> Result<(), Unsupported> {
        let ok = match self {
            KernelId::VllmCpuExpertsInt4 => p.ep_size == 1,
            KernelId::VllmArmCpuExpertsInt8 => !p.use_ep,
            KernelId::VllmMarlinExperts | KernelId::VllmBatchedMarlinExperts => {
                !FLASHINFER_NVLINK_BACKENDS.contains(&p.all2all_backend.as_str())
            }
            // Ours: any TP; EP through the expert map.
            _ => true,
        };
        if ok {
            Ok(())
        } else {
            Err(Unsupported::kernel_does_not_support(format!(
                "parallel config {p}"
            )))
        }
    }

    /// Whether the kernel takes an expert map (vLLM's `supports_expert_map`). Not part of
    /// `is_supported_config`; the layer asks it before passing the map.
    pub fn supports_expert_map(self) -> Result<(), Unsupported> {
        match self {
            KernelId::VllmCpuExpertsInt4 | KernelId::VllmCpuExpertsInt8 => {
                Err(Unsupported::kernel_does_not_support("expert map"))
            }
            _ => Ok(()),
        }
    }

    /// Check 6: the routing method. `by_moe_router`: a validated moe-router configuration
    /// computes the routing ([`crate::MoeConfig::routing_by_moe_router`]), which our kernels
    /// take whatever its label.
    pub fn supports_routing_method(
        self,
        rm: RoutingMethodType,
        by_moe_router: bool,
    ) -> Result<(), Unsupported> {
        let ok = match self {
            KernelId::VllmCpuExpertsInt4
            | KernelId::VllmCpuExpertsInt8
            | KernelId::VllmArmCpuExpertsInt8 => crate::routing::VLLM_CPU_METHODS.contains(&rm),
            k if k.is_ours() => by_moe_router || crate::routing::MOE_ROUTER_METHODS.contains(&rm),
            _ => true,
        };
        if ok {
            Ok(())
        } else if self.is_ours() {
            Err(Unsupported::kernel_does_not_support(format!(
                "routing method {rm}"
            )))
        } else {
            // vLLM's RoutingMethodType is an IntEnum, which f-strings print as its integer.
            Err(Unsupported::kernel_does_not_support(format!(
                "routing method {}",
                rm.value()
            )))
        }
    }

    /// Check 7: the router logits dtype (vLLM's kernels accept any; moe-router takes floats).
    pub fn supports_router_logits_dtype(self, dt: DType) -> Result<(), Unsupported> {
        if !self.is_ours() || FLOAT_IO.contains(&dt) {
            Ok(())
        } else {
            Err(Unsupported::kernel_does_not_support(format!(
                "router logits dtype {dt}"
            )))
        }
    }

    /// Check 8: the hidden size (no kernel here restricts it through this hook; shape rules
    /// with their own messages are in [`Self::post_check`]).
    pub fn supports_shape(self, _hidden_dim: usize) -> Result<(), Unsupported> {
        Ok(())
    }

    /// Check 9: the activation format.
    pub fn supports_activation_format(self, fmt: ActivationFormat) -> Result<(), Unsupported> {
        if fmt == self.activation_format() {
            Ok(())
        } else {
            Err(Unsupported::kernel_does_not_support(format!(
                "{} activation format",
                fmt.value()
            )))
        }
    }

    /// Check 10: batch invariance, asked only when it is required. Our kernels reduce in a
    /// fixed order, so their results do not depend on the batch.
    pub fn supports_batch_invariance(self) -> Result<(), Unsupported> {
        if self.is_ours() {
            Ok(())
        } else {
            Err(Unsupported::kernel_does_not_support("batch invariance"))
        }
    }

    /// Check 11: LoRA, asked only when LoRA is enabled.
    pub fn supports_lora(self) -> Result<(), Unsupported> {
        if matches!(
            self,
            KernelId::VllmMarlinExperts | KernelId::VllmTritonExperts
        ) {
            Ok(())
        } else {
            Err(Unsupported::kernel_does_not_support("LoRA"))
        }
    }

    /// Checks made after the common ones: the int8 kernels' dtype and 32-divisibility, and the
    /// shape rules of our W4A8 kernel (spec 4.4).
    pub fn post_check(self, q: &SupportQuery<'_>) -> Result<(), Unsupported> {
        let h = q.config.hidden_dim();
        let i = q.config.intermediate_size_per_partition();
        match self {
            KernelId::VllmArmCpuExpertsInt8 | KernelId::CpuInt8W8A8 => {
                if !FLOAT_IO.contains(&q.config.in_dtype) {
                    return Err(Unsupported::new(
                        "kernel requires float32, float16, or bfloat16 activations",
                    ));
                }
                div32(h, i)
            }
            KernelId::VllmCpuExpertsInt8 => div32(h, i),
            KernelId::CpuInt4W4A8 => {
                // Grouped scales need whole groups; channelwise ones (and keys without a
                // grouping) an even K, for the nibble pairs.
                let g = q
                    .weight_groups()
                    .and_then(WeightGroups::group_size)
                    .unwrap_or(2);
                if !h.is_multiple_of(g) {
                    return Err(Unsupported::new(format!(
                        "kernel requires hidden dim divisible by {g}"
                    )));
                }
                if !i.is_multiple_of(g) {
                    return Err(Unsupported::new(format!(
                        "kernel requires intermediate dim divisible by {g}"
                    )));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

fn div32(h: usize, i: usize) -> Result<(), Unsupported> {
    if !h.is_multiple_of(32) {
        return Err(Unsupported::new(
            "kernel requires hidden dim divisible by 32",
        ));
    }
    if !i.is_multiple_of(32) {
        return Err(Unsupported::new(
            "kernel requires intermediate dim divisible by 32",
        ));
    }
    Ok(())
}

/// Our W4A8 weight keys: int8-stored int4, static f32 or bf16 scales, symmetric, channelwise
/// or grouped by a multiple of 32.
fn our_w4a8_key(k: QuantKey) -> bool {
    let shape_ok = match WeightGroups::from_group_shape(k.scale.group_shape) {
        Ok(WeightGroups::Channelwise) => true,
        Ok(WeightGroups::Groups(g)) => g.get().is_multiple_of(32),
        Err(_) => false,
    };
    k.dtype == DType::I8
        && k.symmetric
        && k.scale2.is_none()
        && k.scale.is_static
        && matches!(k.scale.dtype, DType::F32 | DType::BF16)
        && shape_ok
}

/// Our WNA16 weight keys: `uint4b8` / `uint8b128` with static f16 or bf16 group scales.
fn our_wna16_key(k: &ScalarQuantKey) -> bool {
    let base = ScalarQuantKey {
        scale: moe_quant::ScaleDesc {
            dtype: DType::F16,
            ..k.scale
        },
        ..*k
    };
    matches!(k.scale.dtype, DType::F16 | DType::BF16)
        && (base == ScalarQuantKey::INT4_STATIC || base == ScalarQuantKey::INT8_STATIC)
}
