//! The moe-rs quantization vocabulary and scalar quantization math.
