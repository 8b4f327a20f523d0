//! libFuzzer entry point for `moe_fuzz::packers` (see that function for what is fuzzed).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| moe_fuzz::packers(data));
