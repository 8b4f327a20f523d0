//! Table-driven selection tests: each row is a configuration (family, platform, rule set,
//! activation, routing method, group size and scale dtype, TP/EP/DP layout, user override,
//! deny-list) walked through selection, with the chosen backend and kernel or the exact error
//! message and every candidate's refusal reason.

use moe_oracle::*;
use moe_quant::{DType, GroupShape, QuantKey, ScaleDesc, WeightGroups};

use MoEActivation as A;
use RoutingMethodType as R;

/// What a row expects.
enum Expect {
    /// Backend value and kernel display name.
    Chosen(&'static str, &'static str),
    /// The error's `Display` and the reason of every refused candidate, in order.
    Refused(&'static str, &'static [&'static str]),
}

struct Row {
    name: &'static str,
    family: Family,
    platform: Platform,
    mode: Strictness,
    config: MoeConfig,
    wkey: Option<WeightKey>,
    akey: Option<QuantKey>,
    disabled: &'static str,
    batch_invariant: bool,
    expect: Expect,
}

fn x86(isas: &[Isa]) -> Platform {
    Platform::cpu(CpuArch::X86_64, isas).unwrap()
}
fn vnni() -> Platform {
    x86(&[Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni])
}
fn amx() -> Platform {
    x86(&[Isa::Avx2, Isa::Avx512Vnni, Isa::Amx])
}
fn arm() -> Platform {
    Platform::cpu(CpuArch::Aarch64, &[Isa::Neon, Isa::NeonDot, Isa::NeonI8mm]).unwrap()
}
fn gpu(cc: (u32, u32)) -> Platform {
    x86(&[Isa::Avx2]).with_gpu(Gpu {
        name: "cuda".into(),
        capability: cc,
    })
}

const SHAPE: MoeShape = MoeShape {
    num_experts: 8,
    experts_per_token: 2,
    hidden_dim: 512,
    intermediate_size: 256,
};

fn cfg_full(
    shape: MoeShape,
    act: MoEActivation,
    rm: RoutingMethodType,
    dtype: DType,
    par: ParallelRequest,
) -> MoeConfig {
    MoeConfig::new(shape, act, rm, dtype, ParallelConfig::make(&par).unwrap()).unwrap()
}
fn cfg(act: MoEActivation, rm: RoutingMethodType) -> MoeConfig {
    cfg_full(SHAPE, act, rm, DType::BF16, ParallelRequest::tp(1, 0))
}
fn silu() -> MoeConfig {
    cfg(A::Silu, R::Default)
}
fn par(p: ParallelRequest) -> MoeConfig {
    cfg_full(SHAPE, A::Silu, R::Default, DType::BF16, p)
}
fn dims(h: usize, i: usize) -> MoeConfig {
    let shape = MoeShape {
        hidden_dim: h,
        intermediate_size: i,
        ..SHAPE
    };
    cfg_full(
        shape,
        A::Silu,
        R::Default,
        DType::BF16,
        ParallelRequest::tp(1, 0),
    )
}
fn dtype(d: DType) -> MoeConfig {
    cfg_full(SHAPE, A::Silu, R::Default, d, ParallelRequest::tp(1, 0))
}
fn backend(c: MoeConfig, name: &str) -> MoeConfig {
    c.with_backend(name)
}
fn lora(mut c: MoeConfig) -> MoeConfig {
    c.is_lora_enabled = true;
    c
}
fn logits(mut c: MoeConfig, d: DType) -> MoeConfig {
    c.router_logits_dtype = Some(d);
    c
}
fn ep2() -> ParallelRequest {
    ParallelRequest::tp(2, 0).with_ep()
}
fn batched() -> ParallelRequest {
    ParallelRequest::tp(1, 0)
        .with_dp(2, 0)
        .with_ep()
        .with_all2all("deepep_low_latency")
}

fn g(group: i64) -> Option<WeightKey> {
    Some(w4a8_weight_key(WeightGroups::from_config(group).unwrap()).into())
}
fn w4a8_key(scale: DType, shape: GroupShape, symmetric: bool) -> Option<WeightKey> {
    Some(QuantKey::new(DType::I8, ScaleDesc::new(scale, true, shape), symmetric).into())
}
fn int4_gptq() -> Option<WeightKey> {
    Some(ScalarQuantKey::INT4_STATIC.into())
}

const EP2_REASON: &str = "kernel does not support parallel config FusedMoEParallelConfig(tp_size=1, tp_rank=0, pcp_size=1, pcp_rank=0, \
    dp_size=1, dp_rank=0, ep_size=2, ep_rank=0, sp_size=1, use_ep=True, \
    all2all_backend='allgather_reducescatter', enable_eplb=False)";

const NO_W4A8: &str = "No W4A8 Int8 MoE backend supports the deployment configuration.";
const NO_INT8: &str = "No Int8 MoE backend supports the deployment configuration.";
const NO_WNA16: &str = "No WNA16 MoE backend supports the deployment configuration.";
const NO_ACT_AND_MUL: &str = "kernel does not support no act_and_mul MLP layer";
const DEV_CPU: &str = "kernel does not support current device cpu";
const ONLY_CPU: &str = "W4A8 Int8 MoE is only supported on CPU platforms";

#[allow(clippy::too_many_arguments)]
fn row(
    name: &'static str,
    family: Family,
    platform: Platform,
    mode: Strictness,
    config: MoeConfig,
    wkey: Option<WeightKey>,
    akey: Option<QuantKey>,
    expect: Expect,
) -> Row {
    Row {
        name,
        family,
        platform,
        mode,
        config,
        wkey,
        akey,
        disabled: "",
        batch_invariant: false,
        expect,
    }
}

fn w4a8(name: &'static str, p: Platform, mode: Strictness, c: MoeConfig, e: Expect) -> Row {
    row(name, Family::W4A8Int8, p, mode, c, g(128), None, e)
}
fn int8(name: &'static str, p: Platform, mode: Strictness, c: MoeConfig, e: Expect) -> Row {
    row(
        name,
        Family::Int8,
        p,
        mode,
        c,
        Some(QuantKey::INT8_STATIC_CHANNEL_SYM.into()),
        Some(QuantKey::INT8_DYNAMIC_TOKEN_SYM),
        e,
    )
}
fn wna16(name: &'static str, p: Platform, mode: Strictness, c: MoeConfig, e: Expect) -> Row {
    row(name, Family::Wna16, p, mode, c, int4_gptq(), None, e)
}

use Expect::{Chosen, Refused};
use Strictness::{Native, VllmCompat as Compat};

fn rows() -> Vec<Row> {
    let int4 = "CPU_INT4";
    let mut rows = vec![
        // ---- W4A8: platform and ISA rung ----
        w4a8(
            "w4a8 compat arm",
            arm(),
            Compat,
            silu(),
            Chosen(int4, "CPUExpertsInt4"),
        ),
        w4a8(
            "w4a8 compat x86 is Arm-only upstream",
            vnni(),
            Compat,
            silu(),
            Refused(NO_W4A8, &["kernel only supports Arm CPU"]),
        ),
        w4a8(
            "w4a8 native x86 vnni",
            vnni(),
            Native,
            silu(),
            Chosen(int4, "cpu-int4-w4a8/avx512-vnni"),
        ),
        w4a8(
            "w4a8 native x86 amx",
            amx(),
            Native,
            silu(),
            Chosen(int4, "cpu-int4-w4a8/amx"),
        ),
        w4a8(
            "w4a8 native x86 avx2",
            x86(&[Isa::Avx2]),
            Native,
            silu(),
            Chosen(int4, "cpu-int4-w4a8/avx2"),
        ),
        w4a8(
            "w4a8 native arm i8mm",
            arm(),
            Native,
            silu(),
            Chosen(int4, "cpu-int4-w4a8/i8mm"),
        ),
        w4a8(
            "w4a8 native arm neon",
            Platform::cpu(CpuArch::Aarch64, &[Isa::Neon]).unwrap(),
            Native,
            silu(),
            Chosen(int4, "cpu-int4-w4a8/neon"),
        ),
        w4a8(
            "w4a8 native other arch",
            Platform::cpu(CpuArch::Other, &[]).unwrap(),
            Native,
            silu(),
            Chosen(int4, "cpu-int4-w4a8/scalar"),
        ),
        w4a8(
            "w4a8 compat gpu",
            gpu((9, 0)),
            Compat,
            silu(),
            Refused(ONLY_CPU, &[]),
        ),
        w4a8(
            "w4a8 native gpu",
            gpu((9, 0)),
            Native,
            silu(),
            Refused(ONLY_CPU, &[]),
        ),
        // ---- W4A8: activations ----
        w4a8(
            "w4a8 compat swigluoai",
            arm(),
            Compat,
            cfg(A::Swigluoai, R::Default),
            Chosen(int4, "CPUExpertsInt4"),
        ),
        w4a8(
            "w4a8 compat swiglustep",
            arm(),
            Compat,
            cfg(A::Swiglustep, R::Default),
            Chosen(int4, "CPUExpertsInt4"),
        ),
        w4a8(
            "w4a8 compat gelu",
            arm(),
            Compat,
            cfg(A::Gelu, R::Default),
            Refused(
                NO_W4A8,
                &["kernel does not support MoEActivation.GELU activation"],
            ),
        ),
        w4a8(
            "w4a8 compat swigluoai uninterleave",
            arm(),
            Compat,
            cfg(A::SwigluoaiUninterleave, R::Default),
            Refused(
                NO_W4A8,
                &["kernel does not support MoEActivation.SWIGLUOAI_UNINTERLEAVE activation"],
            ),
        ),
        w4a8(
            "w4a8 native gelu",
            arm(),
            Native,
            cfg(A::Gelu, R::Default),
            Chosen(int4, "cpu-int4-w4a8/i8mm"),
        ),
        w4a8(
            "w4a8 native gelu_tanh",
            vnni(),
            Native,
            cfg(A::GeluTanh, R::Default),
            Chosen(int4, "cpu-int4-w4a8/avx512-vnni"),
        ),
        w4a8(
            "w4a8 native swigluoai uninterleave",
            vnni(),
            Native,
            cfg(A::SwigluoaiUninterleave, R::Default),
            Chosen(int4, "cpu-int4-w4a8/avx512-vnni"),
        ),
        w4a8(
            "w4a8 native swiglustep",
            vnni(),
            Native,
            cfg(A::Swiglustep, R::Default),
            Chosen(int4, "cpu-int4-w4a8/avx512-vnni"),
        ),
        w4a8(
            "w4a8 native situ",
            vnni(),
            Native,
            cfg(A::Situ, R::Default),
            Refused(NO_W4A8, &["kernel does not support situ activation"]),
        ),
        w4a8(
            "w4a8 native gated relu2",
            vnni(),
            Native,
            cfg(A::Relu2, R::Default),
            Refused(NO_W4A8, &["kernel does not support relu2 activation"]),
        ),
        w4a8(
            "w4a8 compat silu_no_mul",
            arm(),
            Compat,
            cfg(A::SiluNoMul, R::Default),
            Refused(
                NO_W4A8,
                &["kernel does not support no act_and_mul MLP layer"],
            ),
        ),
        w4a8(
            "w4a8 native relu2_no_mul",
            vnni(),
            Native,
            cfg(A::Relu2NoMul, R::Default),
            Refused(
                NO_W4A8,
                &["kernel does not support no act_and_mul MLP layer"],
            ),
        ),
        // ---- W4A8: routing methods ----
        w4a8(
            "w4a8 compat renormalize",
            arm(),
            Compat,
            cfg(A::Silu, R::Renormalize),
            Chosen(int4, "CPUExpertsInt4"),
        ),
        w4a8(
            "w4a8 compat renormalize naive",
            arm(),
            Compat,
            cfg(A::Silu, R::RenormalizeNaive),
            Chosen(int4, "CPUExpertsInt4"),
        ),
        w4a8(
            "w4a8 compat deepseekv3",
            arm(),
            Compat,
            cfg(A::Silu, R::DeepSeekV3),
            Refused(NO_W4A8, &["kernel does not support routing method 2"]),
        ),
        w4a8(
            "w4a8 compat llama4",
            arm(),
            Compat,
            cfg(A::Silu, R::Llama4),
            Refused(NO_W4A8, &["kernel does not support routing method 3"]),
        ),
        w4a8(
            "w4a8 compat custom",
            arm(),
            Compat,
            cfg(A::Silu, R::Custom),
            Refused(NO_W4A8, &["kernel does not support routing method 101"]),
        ),
        w4a8(
            "w4a8 compat minimax2",
            arm(),
            Compat,
            cfg(A::Silu, R::MiniMax2),
            Refused(NO_W4A8, &["kernel does not support routing method 7"]),
        ),
    ];
    for rm in [
        R::DeepSeekV3,
        R::Llama4,
        R::SigmoidRenorm,
        R::Sigmoid,
        R::MiniMax2,
        R::TopK,
        R::Custom,
    ] {
        rows.push(w4a8(
            "w4a8 native moe-router method",
            arm(),
            Native,
            cfg(A::Silu, rm),
            Chosen(int4, "cpu-int4-w4a8/i8mm"),
        ));
    }
    rows.extend([
        w4a8(
            "w4a8 native unspecified routing",
            arm(),
            Native,
            cfg(A::Silu, R::Unspecified),
            Refused(NO_W4A8, &["kernel does not support routing method Unspecified"]),
        ),
        // The layer's own router computes it (softmax scores with a correction bias,
        // ERNIE-4.5's routing, which vLLM labels Unspecified).
        w4a8(
            "w4a8 native unspecified routing computed by moe-router",
            arm(),
            Native,
            cfg(A::Silu, R::Unspecified).with_routing_by_moe_router(),
            Chosen(int4, "cpu-int4-w4a8/i8mm"),
        ),
        w4a8(
            "w4a8 native deepseekv4 routing",
            arm(),
            Native,
            cfg(A::Silu, R::DeepseekV4),
            Refused(NO_W4A8, &["kernel does not support routing method DeepseekV4"]),
        ),
        // ---- W4A8: group sizes and scale dtypes ----
        row("w4a8 compat channelwise", Family::W4A8Int8, arm(), Compat, silu(), g(-1), None, Chosen(int4, "CPUExpertsInt4")),
        row("w4a8 compat g32", Family::W4A8Int8, arm(), Compat, silu(), g(32), None, Chosen(int4, "CPUExpertsInt4")),
        row("w4a8 compat g64", Family::W4A8Int8, arm(), Compat, silu(), g(64), None, Chosen(int4, "CPUExpertsInt4")),
        row(
            "w4a8 compat g256",
            Family::W4A8Int8,
            arm(),
            Compat,
            silu(),
            g(256),
            None,
            Refused(
                NO_W4A8,
                &["kernel does not support quantization scheme \
                   QuantKey(i8,scale(bf16,static,GroupShape(row=1, col=256)),symmetric)xNone"],
            ),
        ),
        row("w4a8 native g256", Family::W4A8Int8, arm(), Native, silu(), g(256), None, Chosen(int4, "cpu-int4-w4a8/i8mm")),
        row(
            "w4a8 native g96 does not divide H",
            Family::W4A8Int8,
            arm(),
            Native,
            silu(),
            g(96),
            None,
            Refused(NO_W4A8, &["kernel requires hidden dim divisible by 96"]),
        ),
        row(
            "w4a8 native g96 does not divide I",
            Family::W4A8Int8,
            arm(),
            Native,
            dims(576, 256),
            g(96),
            None,
            Refused(NO_W4A8, &["kernel requires intermediate dim divisible by 96"]),
        ),
        row(
            "w4a8 native g16",
            Family::W4A8Int8,
            arm(),
            Native,
            silu(),
            g(16),
            None,
            Refused(
                NO_W4A8,
                &["kernel does not support quantization scheme \
                   QuantKey(i8,scale(bf16,static,GroupShape(row=1, col=16)),symmetric)xNone"],
            ),
        ),
        row(
            "w4a8 compat bf16 channel scales",
            Family::W4A8Int8,
            arm(),
            Compat,
            silu(),
            w4a8_key(DType::BF16, GroupShape::PER_CHANNEL, true),
            None,
            Refused(
                NO_W4A8,
                &["kernel does not support quantization scheme \
                   QuantKey(i8,scale(bf16,static,per_channel),symmetric)xNone"],
            ),
        ),
        row(
            "w4a8 native bf16 channel scales",
            Family::W4A8Int8,
            arm(),
            Native,
            silu(),
            w4a8_key(DType::BF16, GroupShape::PER_CHANNEL, true),
            None,
            Chosen(int4, "cpu-int4-w4a8/i8mm"),
        ),
        row(
            "w4a8 compat f32 group scales",
            Family::W4A8Int8,
            arm(),
            Compat,
            silu(),
            w4a8_key(DType::F32, GroupShape::new(1, 128), true),
            None,
            Refused(
                NO_W4A8,
                &["kernel does not support quantization scheme \
                   QuantKey(i8,scale(f32,static,GroupShape(row=1, col=128)),symmetric)xNone"],
            ),
        ),
        row(
            "w4a8 native f32 group scales",
            Family::W4A8Int8,
            arm(),
            Native,
            silu(),
            w4a8_key(DType::F32, GroupShape::new(1, 128), true),
            None,
            Chosen(int4, "cpu-int4-w4a8/i8mm"),
        ),
        row(
            "w4a8 native f16 scales",
            Family::W4A8Int8,
            arm(),
            Native,
            silu(),
            w4a8_key(DType::F16, GroupShape::new(1, 128), true),
            None,
            Refused(
                NO_W4A8,
                &["kernel does not support quantization scheme \
                   QuantKey(i8,scale(f16,static,GroupShape(row=1, col=128)),symmetric)xNone"],
            ),
        ),
        row(
            "w4a8 native asymmetric weights",
            Family::W4A8Int8,
            arm(),
            Native,
            silu(),
            w4a8_key(DType::BF16, GroupShape::new(1, 128), false),
            None,
            Refused(
                NO_W4A8,
                &["kernel does not support quantization scheme \
                   QuantKey(i8,scale(bf16,static,GroupShape(row=1, col=128)),asymmetric)xNone"],
            ),
        ),
        row(
            "w4a8 compat with an activation key",
            Family::W4A8Int8,
            arm(),
            Compat,
            silu(),
            g(128),
            Some(QuantKey::INT8_DYNAMIC_TOKEN_SYM),
            Refused(
                NO_W4A8,
                &["kernel does not support quantization scheme \
                   QuantKey(i8,scale(bf16,static,GroupShape(row=1, col=128)),symmetric)x\
                   QuantKey(i8,scale(f32,dynamic,per_token),symmetric)"],
            ),
        ),
        row(
            "w4a8 compat no weight key",
            Family::W4A8Int8,
            arm(),
            Compat,
            silu(),
            None,
            None,
            Refused(NO_W4A8, &["kernel does not support quantization scheme NonexNone"]),
        ),
        // ---- W4A8: TP / EP / DP ----
        w4a8("w4a8 compat tp2", arm(), Compat, par(ParallelRequest::tp(2, 1)), Chosen(int4, "CPUExpertsInt4")),
        w4a8("w4a8 compat ep2", arm(), Compat, par(ep2()), Refused(NO_W4A8, &[EP2_REASON])),
        w4a8("w4a8 native ep2", vnni(), Native, par(ep2()), Chosen(int4, "cpu-int4-w4a8/avx512-vnni")),
        w4a8(
            "w4a8 native dp2 ep allgather",
            vnni(),
            Native,
            par(ParallelRequest::tp(1, 0).with_dp(2, 1).with_ep()),
            Chosen(int4, "cpu-int4-w4a8/avx512-vnni"),
        ),
        w4a8(
            "w4a8 native batched all2all",
            vnni(),
            Native,
            par(batched()),
            Refused(NO_W4A8, &["kernel does not support batched_experts activation format"]),
        ),
        // ---- W4A8: in/out and router-logits dtypes, LoRA ----
        w4a8(
            "w4a8 compat f64 io",
            arm(),
            Compat,
            dtype(DType::F64),
            Refused(NO_W4A8, &["kernel does not support torch.float64 input/output dtype"]),
        ),
        w4a8(
            "w4a8 native f64 io",
            arm(),
            Native,
            dtype(DType::F64),
            Refused(NO_W4A8, &["kernel does not support f64 input/output dtype"]),
        ),
        w4a8("w4a8 native f16 io", arm(), Native, dtype(DType::F16), Chosen(int4, "cpu-int4-w4a8/i8mm")),
        w4a8("w4a8 compat f64 router logits", arm(), Compat, logits(silu(), DType::F64), Chosen(int4, "CPUExpertsInt4")),
        w4a8(
            "w4a8 native f64 router logits",
            arm(),
            Native,
            logits(silu(), DType::F64),
            Refused(NO_W4A8, &["kernel does not support router logits dtype f64"]),
        ),
        w4a8(
            "w4a8 native lora",
            arm(),
            Native,
            lora(silu()),
            Refused(NO_W4A8, &["kernel does not support LoRA"]),
        ),
        // ---- W4A8: user override ----
        w4a8("w4a8 compat moe_backend cpu", arm(), Compat, backend(silu(), "cpu"), Chosen(int4, "CPUExpertsInt4")),
        w4a8(
            "w4a8 moe_backend triton",
            arm(),
            Native,
            backend(silu(), "triton"),
            Refused(
                "moe_backend='triton' is not supported for W4A8 Int8 MoE. Expected one of ['cpu'].",
                &[],
            ),
        ),
        w4a8(
            "w4a8 compat moe_backend cpu refuses gelu",
            arm(),
            Compat,
            backend(cfg(A::Gelu, R::Default), "cpu"),
            Refused(
                "W4A8 Int8 MoE backend CPU_INT4 does not support the deployment configuration \
                 since kernel does not support MoEActivation.GELU activation.",
                &["kernel does not support MoEActivation.GELU activation"],
            ),
        ),
        // ---- Int8 ----
        int8("int8 compat amx", amx(), Compat, silu(), Chosen("CPU", "CPUExpertsInt8")),
        int8(
            "int8 compat x86 without amx",
            vnni(),
            Compat,
            silu(),
            Refused(NO_INT8, &[DEV_CPU, DEV_CPU, DEV_CPU, DEV_CPU, DEV_CPU, DEV_CPU]),
        ),
        int8("int8 compat arm gelu", arm(), Compat, cfg(A::Gelu, R::Default), Chosen("CPU", "ArmCPUExpertsInt8")),
        int8(
            "int8 compat arm ep",
            arm(),
            Compat,
            par(ep2()),
            Refused(
                NO_INT8,
                &[
                    DEV_CPU,
                    EP2_REASON,
                    DEV_CPU,
                    DEV_CPU,
                    DEV_CPU,
                    DEV_CPU,
                ],
            ),
        ),
        int8(
            "int8 compat amx hidden 528",
            amx(),
            Compat,
            dims(528, 256),
            Refused(
                NO_INT8,
                &["kernel requires hidden dim divisible by 32", DEV_CPU, DEV_CPU, DEV_CPU, DEV_CPU, DEV_CPU],
            ),
        ),
        int8(
            "int8 compat amx gelu",
            amx(),
            Compat,
            cfg(A::Gelu, R::Default),
            Refused(
                NO_INT8,
                &[
                    "kernel does not support MoEActivation.GELU activation",
                    DEV_CPU,
                    DEV_CPU,
                    DEV_CPU,
                    DEV_CPU,
                    DEV_CPU,
                ],
            ),
        ),
        int8("int8 compat gpu", gpu((9, 0)), Compat, silu(), Chosen("TRITON", "TritonExperts")),
        int8("int8 native avx2", x86(&[Isa::Avx2]), Native, silu(), Chosen("CPU", "cpu-int8-w8a8/avx2")),
        int8("int8 native ep2 deepseekv3", arm(), Native, cfg_full(SHAPE, A::Silu, R::DeepSeekV3, DType::BF16, ep2()), Chosen("CPU", "cpu-int8-w8a8/i8mm")),
        int8(
            "int8 native intermediate 272",
            vnni(),
            Native,
            dims(512, 272),
            Refused(NO_INT8, &["kernel requires intermediate dim divisible by 32"]),
        ),
        int8(
            "int8 native tp2 splits intermediate below 32-multiple",
            vnni(),
            Native,
            cfg_full(
                MoeShape {
                    intermediate_size: 96,
                    ..SHAPE
                },
                A::Silu,
                R::Default,
                DType::BF16,
                ParallelRequest::tp(2, 0),
            ),
            Refused(NO_INT8, &["kernel requires intermediate dim divisible by 32"]),
        ),
        int8(
            "int8 native f64 io",
            vnni(),
            Native,
            logits(dtype(DType::F64), DType::F32),
            Refused(NO_INT8, &["kernel requires float32, float16, or bfloat16 activations"]),
        ),
        int8(
            "int8 compat moe_backend cpu quirk",
            amx(),
            Compat,
            backend(silu(), "cpu"),
            Refused(
                "moe_backend='cpu' is not supported for Int8 MoE. Expected one of ['triton', 'humming'].",
                &[],
            ),
        ),
        int8("int8 native moe_backend cpu", amx(), Native, backend(silu(), "cpu"), Chosen("CPU", "cpu-int8-w8a8/amx")),
        int8(
            "int8 native moe_backend triton",
            amx(),
            Native,
            backend(silu(), "triton"),
            Refused(
                "Int8 MoE backend TRITON does not support the deployment configuration since \
                 no moe-rs kernel implements it (upstream it runs on GPUs only).",
                &["no moe-rs kernel implements it (upstream it runs on GPUs only)"],
            ),
        ),
        // ---- WNA16 ----
        wna16("wna16 compat cpu", vnni(), Compat, silu(), Refused(NO_WNA16, &[DEV_CPU, DEV_CPU])),
        wna16("wna16 compat gpu", gpu((8, 0)), Compat, silu(), Chosen("MARLIN", "MarlinExperts")),
        wna16(
            "wna16 compat old gpu",
            gpu((7, 0)),
            Compat,
            silu(),
            Refused(
                NO_WNA16,
                &[
                    "kernel does not support current device cuda",
                    "kernel does not support current device cuda",
                ],
            ),
        ),
        wna16(
            "wna16 compat gpu batched all2all",
            gpu((9, 0)),
            Compat,
            par(batched()),
            Chosen("BATCHED_MARLIN", "BatchedMarlinExperts"),
        ),
        wna16("wna16 compat gpu lora", gpu((9, 0)), Compat, lora(silu()), Chosen("MARLIN", "MarlinExperts")),
        wna16(
            "wna16 compat ignores moe_backend",
            gpu((9, 0)),
            Compat,
            backend(silu(), "whatever"),
            Chosen("MARLIN", "MarlinExperts"),
        ),
        wna16("wna16 native cpu", vnni(), Native, silu(), Chosen("MARLIN", "cpu-wna16/avx512-vnni")),
        // The fused pipeline has gated activations only: non-gated models are refused.
        wna16(
            "wna16 native silu_no_mul",
            arm(),
            Native,
            cfg(A::SiluNoMul, R::Default),
            Refused(NO_WNA16, &[NO_ACT_AND_MUL, NO_ACT_AND_MUL]),
        ),
        row(
            "wna16 native 8-bit",
            Family::Wna16,
            arm(),
            Native,
            silu(),
            Some(ScalarQuantKey::INT8_STATIC.into()),
            None,
            Chosen("MARLIN", "cpu-wna16/i8mm"),
        ),
        row(
            "wna16 compat bf16 scales",
            Family::Wna16,
            gpu((9, 0)),
            Compat,
            silu(),
            Some(
                ScalarQuantKey {
                    scale: ScaleDesc::new(DType::BF16, true, GroupShape::PER_TOKEN),
                    ..ScalarQuantKey::INT4_STATIC
                }
                .into(),
            ),
            None,
            Refused(
                NO_WNA16,
                &[
                    "kernel does not support quantization scheme \
                     QuantKey(uint4b8,scale(bf16,static,per_token),symmetric)xNone",
                    "kernel does not support quantization scheme \
                     QuantKey(uint4b8,scale(bf16,static,per_token),symmetric)xNone",
                ],
            ),
        ),
        wna16(
            "wna16 native moe_backend batched_marlin",
            vnni(),
            Native,
            backend(silu(), "batched_marlin"),
            Refused(
                "WNA16 MoE backend 'BATCHED_MARLIN' does not support the deployment configuration \
                 since no moe-rs kernel implements it (upstream it runs on GPUs only).",
                &["no moe-rs kernel implements it (upstream it runs on GPUs only)"],
            ),
        ),
        wna16("wna16 native moe_backend cpu", vnni(), Native, backend(silu(), "cpu"), Chosen("MARLIN", "cpu-wna16/avx512-vnni")),
        // ---- Unquantized ----
        row("unquantized native", Family::Unquantized, x86(&[Isa::Avx2]), Native, silu(), None, None, Chosen("CPU", "cpu-unquantized/avx2")),
        row(
            "unquantized native relu2_no_mul",
            Family::Unquantized,
            arm(),
            Native,
            cfg(A::Relu2NoMul, R::Default),
            None,
            None,
            Refused(
                "No Unquantized MoE backend supports the deployment configuration.",
                &[NO_ACT_AND_MUL],
            ),
        ),
    ]);
    // Deny-list and batch invariance rows.
    let mut disabled = w4a8(
        "w4a8 native disabled kernel",
        vnni(),
        Native,
        silu(),
        Refused(
            NO_W4A8,
            &["kernel cpu-int4-w4a8/avx512-vnni is disabled by MOE_DISABLED_KERNELS"],
        ),
    );
    disabled.disabled = "CPUExpertsInt4, cpu-int4-w4a8";
    rows.push(disabled);
    let mut one_rung = w4a8(
        "w4a8 native other rung disabled",
        vnni(),
        Native,
        silu(),
        Chosen(int4, "cpu-int4-w4a8/avx512-vnni"),
    );
    one_rung.disabled = "cpu-int4-w4a8/avx2";
    rows.push(one_rung);
    let mut compat_disabled = int8(
        "int8 compat amx class disabled",
        amx(),
        Compat,
        silu(),
        Refused(
            NO_INT8,
            &[
                "kernel CPUExpertsInt8 is disabled by MOE_DISABLED_KERNELS",
                DEV_CPU,
                DEV_CPU,
                DEV_CPU,
                DEV_CPU,
                DEV_CPU,
            ],
        ),
    );
    compat_disabled.disabled = "CPUExpertsInt8";
    rows.push(compat_disabled);
    let mut bi = w4a8(
        "w4a8 compat batch invariance",
        arm(),
        Compat,
        silu(),
        Refused(NO_W4A8, &["kernel does not support batch invariance"]),
    );
    bi.batch_invariant = true;
    rows.push(bi);
    let mut bi = w4a8(
        "w4a8 native batch invariance",
        arm(),
        Native,
        silu(),
        Chosen(int4, "cpu-int4-w4a8/i8mm"),
    );
    bi.batch_invariant = true;
    rows.push(bi);
    rows
}

#[test]
fn selection_table() {
    let rows = rows();
    assert!(rows.len() >= 40, "table has {} rows", rows.len());
    let mut failures = Vec::new();
    for r in &rows {
        let opts = SelectOptions::native()
            .with_mode(r.mode)
            .with_disabled(DisabledKernels::parse(r.disabled))
            .with_batch_invariant(r.batch_invariant);
        let got = select_backend(
            r.family,
            &r.config,
            r.wkey.as_ref(),
            r.akey.as_ref(),
            &r.platform,
            &opts,
        );
        let ok = match (&r.expect, &got) {
            (Chosen(b, k), Ok(sel)) => sel.backend.value() == *b && sel.kernel.to_string() == *k,
            (Refused(msg, reasons), Err(e)) => {
                let got_reasons: Vec<&str> = e
                    .refusals()
                    .iter()
                    .map(|x| x.reason.reason.as_str())
                    .collect();
                e.to_string() == *msg && got_reasons == *reasons
            }
            _ => false,
        };
        if !ok {
            let shown = match &got {
                Ok(s) => format!("chose {} {}", s.backend, s.kernel),
                Err(e) => format!("error {:?}", e.detailed()),
            };
            failures.push(format!("{}: {shown}", r.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

#[test]
fn requested_backend_without_reason_is_quoted() {
    let e = moe_oracle::OracleError::RequestedBackendUnsupported {
        family: Family::W4A8Int8,
        backend: Backend::W4A8CpuInt4,
        reason: None,
        refusals: vec![],
    };
    assert_eq!(
        e.to_string(),
        "W4A8 Int8 MoE backend 'CPU_INT4' does not support the deployment configuration."
    );
}

#[test]
fn w4a8_kernel_must_be_monolithic() {
    check_w4a8_experts_monolithic(KernelId::CpuInt4W4A8).unwrap();
    check_w4a8_experts_monolithic(KernelId::VllmCpuExpertsInt4).unwrap();
    let e = check_w4a8_experts_monolithic(KernelId::VllmMarlinExperts).unwrap_err();
    assert_eq!(
        e.to_string(),
        "W4A8 Int8 MoE only supports monolithic experts, but got MarlinExperts"
    );
}

#[test]
fn detailed_error_lists_every_candidate() {
    let e = select_int8_moe_backend(&silu(), &vnni(), &SelectOptions::vllm_compat()).unwrap_err();
    let text = e.detailed();
    assert_eq!(e.refusals().len(), 6);
    for name in [
        "CPU (CPUExpertsInt8)",
        "CPU (ArmCPUExpertsInt8)",
        "TRITON (TritonExperts)",
        "HUMMING (BatchedHummingGroupedExperts)",
        "HUMMING (HummingGroupedExperts)",
        "HUMMING (HummingIndexedExperts)",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
}

#[test]
fn family_entry_points_agree_with_select_backend() {
    let key = w4a8_weight_key(WeightGroups::groups(128).unwrap());
    let s =
        select_w4a8_int8_moe_backend(&silu(), Some(&key), None, &arm(), &SelectOptions::native())
            .unwrap();
    assert_eq!(s.kernel.to_string(), "cpu-int4-w4a8/i8mm");
    assert_eq!(s.activation_format, ActivationFormat::Standard);
    let s = select_wna16_moe_backend(
        &silu(),
        &wna16_weight_key(4).unwrap(),
        &gpu((8, 6)),
        &SelectOptions::vllm_compat(),
    )
    .unwrap();
    assert_eq!(s.backend, Backend::Wna16Marlin);
    let s = select_unquantized_moe_backend(&silu(), &vnni(), &SelectOptions::native()).unwrap();
    assert_eq!(s.kernel.id, KernelId::CpuUnquantized);
}

#[test]
fn every_activation_and_routing_method_has_an_answer() {
    // Exhaustive sweep: no configuration panics, and every refusal names a reason.
    for mode in [Native, Compat] {
        for act in MoEActivation::ALL {
            for rm in RoutingMethodType::ALL {
                for family in [
                    Family::W4A8Int8,
                    Family::Int8,
                    Family::Wna16,
                    Family::Unquantized,
                ] {
                    let (w, a): (Option<WeightKey>, Option<QuantKey>) = match family {
                        Family::W4A8Int8 => (g(128), None),
                        Family::Int8 => (
                            Some(QuantKey::INT8_STATIC_CHANNEL_SYM.into()),
                            Some(QuantKey::INT8_DYNAMIC_TOKEN_SYM),
                        ),
                        Family::Wna16 => (int4_gptq(), None),
                        Family::Unquantized => (None, None),
                        other => panic!("no weight key for {other:?}"),
                    };
                    let opts = SelectOptions::native().with_mode(mode);
                    match select_backend(
                        family,
                        &cfg(act, rm),
                        w.as_ref(),
                        a.as_ref(),
                        &arm(),
                        &opts,
                    ) {
                        Ok(s) => assert_eq!(
                            s.kernel.id.is_ours(),
                            mode == Native || family == Family::Unquantized
                        ),
                        Err(e) => assert!(e.refusals().iter().all(|r| !r.reason.reason.is_empty())),
                    }
                }
            }
        }
    }
}

/// MXFP4 (gpt-oss) weights run on the native WNA16 kernel only: the Marlin executor refuses
/// the e2m1 key, so disabling `cpu-wna16` leaves no kernel, and every refusal is named.
#[test]
fn mxfp4_selects_cpu_wna16_and_nothing_else() {
    let key = mxfp4_weight_key();
    assert_eq!(
        key.to_string(),
        "QuantKey(float4_e2m1f,scale(u8,static,GroupShape(row=1, col=32)),symmetric)"
    );
    let c = cfg(A::Swigluoai, R::Renormalize);
    let s = select_wna16_moe_backend(&c, &key, &vnni(), &SelectOptions::native()).unwrap();
    assert_eq!(s.kernel.to_string(), "cpu-wna16/avx512-vnni");
    let opts = SelectOptions::native().with_disabled(DisabledKernels::parse("cpu-wna16"));
    let e = select_wna16_moe_backend(&c, &key, &vnni(), &opts).unwrap_err();
    let text = e.detailed();
    assert!(text.contains("cpu-wna16"), "{text}");
    assert!(text.contains("cpu-marlin"), "{text}");
    assert!(text.contains("float4_e2m1f"), "{text}");
}

/// FP8 weights (e4m3, f32 scales per 128 × 128 block, per channel or per tensor) run on the
/// native WNA16 kernel only: the Marlin executor refuses the keys, so disabling `cpu-wna16`
/// leaves no kernel, and every refusal is named. A key no FP8 checkpoint here has (dynamic
/// weight scales) is refused by every kernel.
#[test]
fn fp8_selects_cpu_wna16_and_nothing_else() {
    let c = cfg(A::Silu, R::Renormalize);
    for (key, shape) in [
        (
            QuantKey::FP8_STATIC_128_BLOCK_SYM,
            "GroupShape(row=128, col=128)",
        ),
        (QuantKey::FP8_STATIC_CHANNEL_SYM, "per_channel"),
        (QuantKey::FP8_STATIC_TENSOR_SYM, "per_tensor"),
    ] {
        let s = select_fp8_moe_backend(&key, &c, &vnni(), &SelectOptions::native()).unwrap();
        assert_eq!(s.kernel.to_string(), "cpu-wna16/avx512-vnni");
        let opts = SelectOptions::native().with_disabled(DisabledKernels::parse("cpu-wna16"));
        let e = select_fp8_moe_backend(&key, &c, &vnni(), &opts).unwrap_err();
        let text = e.detailed();
        assert!(text.contains("cpu-wna16"), "{text}");
        assert!(text.contains("cpu-marlin"), "{text}");
        assert!(text.contains(shape), "{text}");
    }
    let key = QuantKey::FP8_DYNAMIC_TENSOR_SYM;
    let e = select_fp8_moe_backend(&key, &c, &vnni(), &SelectOptions::native()).unwrap_err();
    let text = e.detailed();
    assert!(text.contains("cpu-wna16"), "{text}");
}
