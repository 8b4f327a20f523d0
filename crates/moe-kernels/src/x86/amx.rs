//! Placeholder: the amx kernels arrive in the next commit.
