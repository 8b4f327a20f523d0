//! The portable rung, always compiled: the reference algorithm of spec §4.5 on unpacked
//! operands (the oracle every other rung is tested against) and scalar microkernels over the
//! packed formats (the last fallback of the dispatcher).

pub mod w4a8;
pub mod w4a8_channel;
pub mod w8a8;

/// The scalar rung needs no CPU feature, so its token is free to make.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scalar;
