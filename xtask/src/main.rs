//! Project automation for moe-rs, run as `cargo xtask <command>`; `cargo xtask help` lists the
//! commands.
//!
//! xtask is the single front door for anything beyond a plain `cargo` call: the aarch64 test
//! ladder under QEMU, the static cost model of the aarch64 tile loops (`arm-cost`), the capped x86 ISA ladder, fuzzing and Miri, the generated C header
//! (`codegen`), the CI sequence that `.ci/run` executes, and the side-by-side benchmark against
//! the CPU MoE kernels of vLLM, KT-Kernel and llama.cpp. Its dependencies are cbindgen (for the
//! header) and the workspace's moe-plot (for `bench-peers --plot`); otherwise it uses std,
//! shells out through `$CARGO` (the cargo that launched it), and always works from the
//! workspace root, so it behaves the same from any directory.

mod arm_cost;
mod bench_peers;
mod ci;
mod codegen;
mod flags;
mod fuzz;
mod json;
mod miri;
mod test_arm;
mod test_binaries;
mod test_x86;
mod util;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use flags::Command;

fn main() -> ExitCode {
    let command = match flags::parse(std::env::args().skip(1)) {
        Ok(command) => command,
        Err(message) => {
            eprintln!("error: {message}\n\n{}", flags::HELP);
            return ExitCode::from(2);
        }
    };
    if let Err(e) = std::env::set_current_dir(project_root()) {
        eprintln!("error: cannot enter the workspace root: {e}");
        return ExitCode::FAILURE;
    }
    let outcome = match command {
        Command::Help => {
            println!("{}", flags::HELP);
            Ok(())
        }
        Command::TestArm(opts) => test_arm::run(&opts),
        Command::TestX86Ladder(opts) => test_x86::run(&opts),
        Command::Codegen { check } => codegen::run(check),
        Command::Fuzz(opts) => fuzz::run(&opts),
        Command::Miri => miri::run(),
        Command::Ci => ci::run(),
        Command::BenchPeers(opts) => bench_peers::run(&opts),
        Command::ArmCost(opts) => arm_cost::run(&opts),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: the parent of this crate's directory.
pub fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}
