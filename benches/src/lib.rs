//! End-to-end criterion benchmarks across the moe-rs crates live in `benches/`; this library is empty.
