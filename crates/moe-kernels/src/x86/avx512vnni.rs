//! Placeholder: the avx512vnni kernels arrive in the next commit.
