//! The tile products of [`crate::probe`]: the 2 × 2 step's four products on tiles that stay
//! loaded, so the unit's issue rate (one product per 16 cycles at best) is all that is timed.

use std::time::Duration;

use super::common::{dpbf16_live, dpbusd_live, tile_config, zero_live};
use super::tiles::{HwTiles, TileUnit};
use crate::probe::best_rate;
use crate::x86::Amx;

/// Four products per step, this many steps per batch.
const STEPS: usize = 64;

/// Whether the CPU has AMX-BF16, all the `tdpbf16ps` probe needs besides AMX.
pub(crate) fn has_amx_bf16() -> bool {
    crate::x86::detect().amx_bf16
}

/// `tdpbusd` int8 multiply-adds per second (16 × 16 × 64 per product).
pub(crate) fn int8_rate(duration: Duration) -> f64 {
    match Amx::try_new() {
        Some(token) => resident_rate::<false>(token, duration),
        None => 0.0,
    }
}

/// `tdpbf16ps` bf16 multiply-adds per second (16 × 16 × 32 per product).
pub(crate) fn bf16_rate(duration: Duration) -> f64 {
    match Amx::try_new().filter(|_| has_amx_bf16()) {
        Some(token) => resident_rate::<true>(token, duration),
        None => 0.0,
    }
}

/// The 2 × 2 step's products (`tdpbf16ps` when `BF16`, which the caller has checked the CPU
/// runs, else `tdpbusd`) on zeroed tiles that stay loaded, per second.
fn resident_rate<const BF16: bool>(token: Amx, duration: Duration) -> f64 {
    let k = if BF16 { 32 } else { 64 };
    let ops = (STEPS * 4 * 16 * 16 * k) as f64;
    let mut unit = HwTiles::new(token);
    // SAFETY: `tile_config` shapes are legal.
    unsafe { unit.configure(&tile_config(64)) };
    // SAFETY: the unit is configured.
    unsafe { zero_live::<HwTiles, 2, 2>(&mut unit) };
    // SAFETY: the unit is configured.
    unsafe { zero_operands(&mut unit) };
    let rate = best_rate(duration, ops, || {
        for _ in 0..STEPS {
            if BF16 {
                // SAFETY: configured and every tile zeroed; the 2 × 2 step's shapes agree, and
                // the CPU has AMX-BF16 (our caller checked).
                unsafe { dpbf16_live::<HwTiles, 2, 2>(&mut unit) };
            } else {
                // SAFETY: configured and every tile zeroed; the 2 × 2 step's shapes agree.
                unsafe { dpbusd_live::<HwTiles, 2, 2>(&mut unit) };
            }
        }
    });
    unit.release();
    rate
}

/// Zeroes the A and B tiles.
///
/// # Safety
/// - The unit is configured with `tile_config`.
unsafe fn zero_operands(unit: &mut HwTiles) {
    use super::common::{A0, A1, B0, B1};
    // SAFETY: configured tiles (our contract); likewise below.
    unsafe { unit.zero::<A0>() };
    // SAFETY: as above.
    unsafe { unit.zero::<A1>() };
    // SAFETY: as above.
    unsafe { unit.zero::<B0>() };
    // SAFETY: as above.
    unsafe { unit.zero::<B1>() };
}
