//! Placeholder: the ymm kernels arrive in the next commit.
