//! Placeholder: the avx2 kernels arrive in the next commit.
