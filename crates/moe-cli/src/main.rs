//! The `moe` command. For now it only reports the CPU it runs on (`moe cpu`, also the default):
//! the detected features and, per rung of the ISA ladder, whether it is available and which
//! kernels the dispatcher would run; the layer commands arrive with issue 6.

use moe_kernels::{Isa, IsaCap, KernelSet, available_isas, cpu_features, isa_cap, kernels};

// Temporary wiring of `moe run` until the clap restructuring (branch `cli`) lands.
mod cmd {
    pub mod run;
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("run") => {
            #[derive(clap::Parser)]
            struct Cli {
                #[command(flatten)]
                args: cmd::run::RunArgs,
            }
            let cli = <Cli as clap::Parser>::parse_from(&args);
            if let Err(e) = cmd::run::run(&cli.args) {
                eprintln!("moe run: {e}");
                std::process::exit(1);
            }
        }
        None | Some("cpu") => print_cpu_report(),
        Some("--version" | "-V") => println!("moe {}", env!("CARGO_PKG_VERSION")),
        Some(other) => {
            eprintln!("moe: unknown command {other:?}; available: cpu");
            std::process::exit(2);
        }
    }
}

/// Prints the detected features, every rung with its availability and kernels, and the choice.
fn print_cpu_report() {
    println!(
        "moe {} on {}",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    );
    println!("CPU features:");
    for (name, present) in cpu_features() {
        println!("  {name:<28} {}", if present { "yes" } else { "no" });
    }
    let available = available_isas();
    let cap = isa_cap();
    println!("ISA ladder (kernels each rung would run):");
    for isa in Isa::native_ladder() {
        let status = match KernelSet::for_isa(isa) {
            Some(ks) if available.contains(&isa) => {
                let capped = if cap.allows(isa) {
                    ""
                } else {
                    " [above the cap]"
                };
                format!("available{capped}: {}", ks.describe_ops().join(", "))
            }
            _ => "not available".to_string(),
        };
        println!("  {:<12} {status}", isa.name());
    }
    match cap {
        IsaCap::None => println!("cap: none (MOE_KERNELS_MAX_ISA unset)"),
        IsaCap::Capped(isa) => println!("cap: {isa} (MOE_KERNELS_MAX_ISA)"),
        IsaCap::Ignored { value, reason } => {
            println!("cap: MOE_KERNELS_MAX_ISA={value:?} ignored: {reason}")
        }
    }
    let chosen = kernels();
    println!(
        "selected: {} ({})",
        chosen.isa(),
        chosen.describe_ops().join(", ")
    );
}
