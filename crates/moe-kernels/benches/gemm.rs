//! W4A8 / W8A8 GEMM throughput per ISA rung (filled in with the SIMD rungs).

fn main() {}
