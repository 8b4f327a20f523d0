//! The MoE layer lifecycle: create, load, process, apply. Empty for now: built under issue 6.
