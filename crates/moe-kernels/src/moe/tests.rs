//! Unit tests of the fused pipeline.
