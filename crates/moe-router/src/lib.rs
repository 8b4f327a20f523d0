//! MoE routing with vLLM parity (softmax/sigmoid top-k, grouped top-k, expert maps). Empty for now: built under issue 3.
