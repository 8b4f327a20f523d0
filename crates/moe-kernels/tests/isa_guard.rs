//! Proves which rung ran: fails when `MOE_EXPECT_ISA` names another rung than the selected one,
//! and prints what was detected (run with `--nocapture`).

use moe_kernels::{Isa, cpu_features, isa_cap, kernels, selected_isa};

#[test]
fn selected_isa_matches_moe_expect_isa() {
    let Ok(expected) = std::env::var("MOE_EXPECT_ISA") else {
        eprintln!("MOE_EXPECT_ISA unset; selected rung: {}", selected_isa());
        return;
    };
    let expected: Isa = expected.parse().expect("MOE_EXPECT_ISA must name a rung");
    // The rung is what detection (under the cap) selected. Where a rung has no kernels of its
    // own yet (the aarch64 rungs), the ops report the scalar kernels; that is checked below so
    // the guard never claims more than what runs.
    assert_eq!(
        selected_isa(),
        expected,
        "selected rung differs from MOE_EXPECT_ISA"
    );
    for line in kernels().describe_ops() {
        eprintln!("  {line}");
    }
}

#[test]
fn report_detected_cpu_features() {
    println!("arch: {}", std::env::consts::ARCH);
    for (name, present) in cpu_features() {
        println!("  {name:<28} {}", if present { "yes" } else { "no" });
    }
    println!("cap: {:?}", isa_cap());
    println!("available rungs: {:?}", moe_kernels::available_isas());
    println!("selected rung: {}", selected_isa());
    for line in kernels().describe_ops() {
        println!("  {line}");
    }
}
