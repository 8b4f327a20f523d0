//! `moe cpu`: the detected CPU features and, per rung of the ISA ladder, whether it is
//! available and which kernels the dispatcher would run, then the rung it selected; with
//! `--measure`, what the multiply units and memory deliver now.

use clap::Args;
use moe_kernels::{Isa, IsaCap, KernelSet, available_isas, cpu_features, isa_cap, kernels};
use serde::Serialize;

use super::{CliError, Output};

/// Options of `moe cpu`.
#[derive(Debug, Default, Args)]
pub struct CpuArgs {
    /// Also measure what each multiply unit (AVX-512 FMA and VNNI, AMX-INT8, AMX-BF16, where
    /// present) and a streaming read from memory deliver now, on `--threads` threads at once:
    /// on a shared machine a unit's rate moves with its co-tenants, so read benchmark figures
    /// next to a measurement taken in the same minutes
    #[arg(long)]
    pub measure: bool,
    /// Threads for `--measure` (default: the available parallelism)
    #[arg(long)]
    pub threads: Option<usize>,
    /// Milliseconds each unit's loop runs for `--measure` (default 500)
    #[arg(long)]
    pub probe_ms: Option<u64>,
}

/// The report, as printed with `--json`.
#[derive(Debug, Serialize)]
pub struct CpuReport {
    /// Crate version.
    pub version: &'static str,
    /// Target architecture (`x86_64`, `aarch64`).
    pub arch: &'static str,
    /// Feature name → detected.
    pub features: Vec<Feature>,
    /// Every rung of this architecture's ladder.
    pub ladder: Vec<Rung>,
    /// The `MOE_KERNELS_MAX_ISA` cap, as text.
    pub cap: String,
    /// The selected rung.
    pub selected_isa: &'static str,
    /// What the selected kernel set runs per operation.
    pub selected_ops: Vec<String>,
    /// With `--measure`: what each unit and the memory delivered, on `threads` threads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured: Option<Measured>,
}

/// What `--measure` found.
#[derive(Debug, Serialize)]
pub struct Measured {
    /// Threads that ran each loop at once.
    pub threads: usize,
    /// One entry per unit.
    pub units: Vec<UnitRate>,
    /// A streaming read of 1 GiB, best of three, in GB/s (1e9 bytes).
    pub dram_read_gb_s: f64,
}

/// One unit's measured rate.
#[derive(Debug, Serialize)]
pub struct UnitRate {
    /// The unit and instruction, e.g. `amx-int8 tdpbusd`.
    pub unit: &'static str,
    /// What one operation is, e.g. `int8-MAC`.
    pub op: &'static str,
    /// Operations per second on all threads together, in units of 1e9.
    pub g_ops_per_s: f64,
}

/// One CPU feature.
#[derive(Debug, Serialize)]
pub struct Feature {
    /// Feature name.
    pub name: &'static str,
    /// Whether the CPU has it.
    pub present: bool,
}

/// One ISA rung.
#[derive(Debug, Serialize)]
pub struct Rung {
    /// Rung name.
    pub isa: &'static str,
    /// Whether this CPU can run it.
    pub available: bool,
    /// Whether `MOE_KERNELS_MAX_ISA` allows it.
    pub allowed: bool,
    /// The kernels the rung would run (empty when unavailable).
    pub ops: Vec<String>,
}

/// Builds the report.
pub fn report() -> CpuReport {
    let available = available_isas();
    let cap = isa_cap();
    let ladder = Isa::native_ladder()
        .into_iter()
        .map(|isa| {
            let ks = KernelSet::for_isa(isa).filter(|_| available.contains(&isa));
            Rung {
                isa: isa.name(),
                available: ks.is_some(),
                allowed: cap.allows(isa),
                ops: ks.map(|k| k.describe_ops()).unwrap_or_default(),
            }
        })
        .collect();
    let cap_text = match cap {
        IsaCap::None => "none (MOE_KERNELS_MAX_ISA unset)".to_string(),
        IsaCap::Capped(isa) => format!("{isa} (MOE_KERNELS_MAX_ISA)"),
        IsaCap::Ignored { value, reason } => {
            format!("MOE_KERNELS_MAX_ISA={value:?} ignored: {reason}")
        }
        other => format!("{other:?}"),
    };
    let chosen = kernels();
    CpuReport {
        version: env!("CARGO_PKG_VERSION"),
        arch: std::env::consts::ARCH,
        features: cpu_features()
            .into_iter()
            .map(|(name, present)| Feature { name, present })
            .collect(),
        ladder,
        cap: cap_text,
        selected_isa: chosen.isa().name(),
        selected_ops: chosen.describe_ops(),
        measured: None,
    }
}

/// Runs every unit probe on `threads` threads at once for `probe` each, then the memory read.
fn measure(threads: usize, probe: std::time::Duration) -> Result<Measured, CliError> {
    let units = moe_kernels::probe::unit_probes()
        .into_iter()
        .map(|p| {
            let rates: Vec<Option<f64>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads).map(|_| s.spawn(|| (p.run)(probe))).collect();
                handles.into_iter().map(|h| h.join().ok()).collect()
            });
            let total: Option<f64> = rates.into_iter().sum();
            let total = total.ok_or_else(|| CliError(format!("the {} probe failed", p.name)))?;
            Ok(UnitRate {
                unit: p.name,
                op: p.op,
                g_ops_per_s: total / 1e9,
            })
        })
        .collect::<Result<_, CliError>>()?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| CliError(format!("a pool of {threads} threads: {e}")))?;
    let dram = super::bench::measure_dram(&pool, 1 << 30) / 1e9;
    Ok(Measured {
        threads,
        units,
        dram_read_gb_s: dram,
    })
}

/// Runs `moe cpu`.
pub fn run(args: &CpuArgs, out: Output) -> Result<(), CliError> {
    let mut r = report();
    if args.measure {
        let threads = args.threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        if threads == 0 {
            return Err(CliError("--threads: must be at least 1".to_string()));
        }
        r.measured = Some(measure(
            threads,
            std::time::Duration::from_millis(args.probe_ms.unwrap_or(500).max(1)),
        )?);
    }
    if out.json {
        return out.print_json(&r);
    }
    println!("moe {} on {}", r.version, r.arch);
    println!("CPU features:");
    for f in &r.features {
        println!("  {:<28} {}", f.name, if f.present { "yes" } else { "no" });
    }
    println!("ISA ladder (kernels each rung would run):");
    for rung in &r.ladder {
        let status = if rung.available {
            let capped = if rung.allowed { "" } else { " [above the cap]" };
            format!("available{capped}: {}", rung.ops.join(", "))
        } else {
            "not available".to_string()
        };
        println!("  {:<12} {status}", rung.isa);
    }
    println!("cap: {}", r.cap);
    println!(
        "selected: {} ({})",
        r.selected_isa,
        r.selected_ops.join(", ")
    );
    if let Some(m) = &r.measured {
        println!("measured now, {} threads at once:", m.threads);
        for u in &m.units {
            println!("  {:<28} {:>8.0} G {}/s", u.unit, u.g_ops_per_s, u.op);
        }
        println!(
            "  {:<28} {:>8.1} GB/s",
            "memory read (1 GiB)", m.dram_read_gb_s
        );
    }
    Ok(())
}
