//! Backend selection: which kernel serves a MoE configuration, and why the others were refused. Empty for now: built under issue 5.
