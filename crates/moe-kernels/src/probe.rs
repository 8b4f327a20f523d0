//! What the CPU's multiply units deliver now, measured on the calling thread: a short loop of
//! one instruction whose operands stay in registers (or tiles), with enough independent
//! accumulators that only the unit's issue rate bounds it.
//!
//! A benchmark's ratio to a nominal peak says little on a shared machine, where a co-tenant on
//! the same core can halve a unit's rate for seconds at a time; a probe taken in the same
//! minutes as the benchmark (`moe cpu --measure`) says what the unit gave then.

use std::time::{Duration, Instant};

/// One loop the probes can time.
#[derive(Debug, Clone, Copy)]
pub struct UnitProbe {
    /// The unit and its instruction, e.g. `"amx-int8 tdpbusd"`.
    pub name: &'static str,
    /// What one counted operation is, e.g. `"int8-MAC"`.
    pub op: &'static str,
    /// Runs the loop on the calling thread for about the given time; operations per second.
    pub run: fn(Duration) -> f64,
}

/// The probes this CPU can run: the vector units, then the tile unit.
pub fn unit_probes() -> Vec<UnitProbe> {
    #[cfg(target_arch = "x86_64")]
    {
        crate::x86::probe::unit_probes()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

/// Repeats `batch` (which performs `ops_per_batch` operations) for about `duration` and
/// returns the best rate of its rounds: each round runs the batch enough times to last about
/// a tenth of the duration, so one slow round (an interrupt, a migration) does not count.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn best_rate(duration: Duration, ops_per_batch: f64, mut batch: impl FnMut()) -> f64 {
    let start = Instant::now();
    let round = duration / 10;
    let mut best = 0f64;
    loop {
        let t0 = Instant::now();
        let mut batches = 0u64;
        while t0.elapsed() < round {
            batch();
            batches += 1;
        }
        let secs = t0.elapsed().as_secs_f64().max(1e-9);
        best = best.max(batches as f64 * ops_per_batch / secs);
        if start.elapsed() >= duration {
            return best;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every probe offered runs its loop and reports a positive, finite rate (the rates
    /// themselves are measurements, for `moe cpu --measure`, not for tests to judge).
    #[test]
    fn probes_report_positive_rates() {
        for p in unit_probes() {
            let rate = (p.run)(Duration::from_millis(20));
            assert!(rate.is_finite() && rate > 0.0, "{}: {rate}", p.name);
        }
    }
}
