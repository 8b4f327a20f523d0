//! `moe cpu`: the detected CPU features and, per rung of the ISA ladder, whether it is
//! available and which kernels the dispatcher would run, then the rung it selected.

use clap::Args;
use moe_kernels::{Isa, IsaCap, KernelSet, available_isas, cpu_features, isa_cap, kernels};
use serde::Serialize;

use super::{CliError, Output};

/// Options of `moe cpu` (none besides `--json`).
#[derive(Debug, Args)]
pub struct CpuArgs {}

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
    }
}

/// Runs `moe cpu`.
pub fn run(_args: &CpuArgs, out: Output) -> Result<(), CliError> {
    let r = report();
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
    Ok(())
}
