//! Placeholder: the avxvnni kernels arrive in the next commit.
