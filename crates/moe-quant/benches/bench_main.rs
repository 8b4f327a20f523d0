//! Entry point of moe-quant's criterion benches; the benches themselves live in
//! `benchmarks/`, one file per area.

use criterion::criterion_main;

mod benchmarks;

criterion_main!(benchmarks::int8::benches, benchmarks::act::benches);
