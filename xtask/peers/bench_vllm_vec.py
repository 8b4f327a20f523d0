#!/usr/bin/env python3
"""Time vLLM CPU's bf16 MoE forward on its portable `vec` kernels, beside the paths of
`bench_vllm_cpu.py`.

vLLM's CPU build ships one extension per x86 level. On a CPU without AVX-512 it loads its
AVX2 build, which has no `fused_experts_cpu` (the SGLang-derived int8, int4, FP8 and bf16
kernels), so every path of `bench_vllm_cpu.py` fails there; the one MoE kernel it has is
`cpu_fused_moe` on weights prepacked for `vec` (what `X86CPUUnquantizedExperts` runs when the
CPU has no AMX). This script adds that path as `bf16_vec` and otherwise is
`bench_vllm_cpu.py`: the same options, routing, timing, correctness check and JSON report,
taken from the shared script itself (imported, not copied), so both report alike.

    /opt/peers/venv/bin/python bench_vllm_vec.py --peers-dir ../shared/peers \\
        --paths bf16_vec --shapes qwen3-30b-a3b --m 1,16 --out vec.json
"""

import os
import sys


def peers_dir():
    """The folder holding `bench_vllm_cpu.py`, from `--peers-dir DIR` (removed from argv
    before the shared script parses the rest) or `$MOE_PEERS_DIR`."""
    for i, arg in enumerate(sys.argv):
        if arg == "--peers-dir" and i + 1 < len(sys.argv):
            folder = sys.argv[i + 1]
            del sys.argv[i:i + 2]
            return folder
        if arg.startswith("--peers-dir="):
            del sys.argv[i]
            return arg.split("=", 1)[1]
    folder = os.environ.get("MOE_PEERS_DIR")
    if not folder:
        sys.exit("bench_vllm_vec.py: give --peers-dir DIR (the folder of bench_vllm_cpu.py)")
    return folder


sys.path.insert(0, os.path.abspath(peers_dir()))
import bench_vllm_cpu as base  # noqa: E402

VEC_PATH = "bf16_vec"


def build_bf16_vec(E, H, I, gen, n_src):
    """bf16 experts prepacked for vLLM's `vec` kernels and run by `cpu_fused_moe`, as vLLM's
    unquantized CPU experts do without AMX; random weights drawn as for the other bf16 paths."""
    import torch
    import vllm._custom_ops as ops
    w13 = (torch.randn(n_src, 2 * I, H, generator=gen) * 0.02).to(torch.bfloat16)
    w2 = (torch.randn(n_src, H, I, generator=gen) * 0.02).to(torch.bfloat16)
    deq13 = lambda e: w13[e % n_src].float()  # noqa: E731
    deq2 = lambda e: w2[e % n_src].float()  # noqa: E731
    p13 = base.rep(ops.cpu_prepack_moe_weight(w13, "vec"), E, n_src)
    p2 = base.rep(ops.cpu_prepack_moe_weight(w2, "vec"), E, n_src)

    def fwd(x, tw, ids):
        out = torch.empty_like(x)
        ops.cpu_fused_moe(out, x, p13, p2, None, None, tw, ids, "silu", "vec", False)
        return out

    info = dict(bytes_per_expert=3 * H * I * 2,
                packed_bytes_per_expert=(p13.nbytes + p2.nbytes) / E)
    return fwd, info, deq13, deq2, [p13, p2]


shared_build = base.build


def build(path, E, H, I, gen, n_src):
    if path == VEC_PATH:
        return build_bf16_vec(E, H, I, gen, n_src)
    return shared_build(path, E, H, I, gen, n_src)


base.build = build
if VEC_PATH not in base.PATHS:
    base.PATHS.append(VEC_PATH)

if __name__ == "__main__":
    base.main()
