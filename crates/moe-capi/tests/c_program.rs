//! The C ABI from C: compiles `tests/c/fixture_run.c` against the committed header and the
//! cdylib cargo built next to this test, runs it on the supported fixture checkpoint, and
//! expects it to reproduce the fixture's output within tolerance and to get the right status
//! codes for bad input (see the C file). Skipped, with a message, when no C compiler is found
//! (`$CC`, else `cc`), unless `MOE_REQUIRE_TEST_TOOLS` is set (as CI sets it), or when the
//! library was built for another target than this host.

use std::path::PathBuf;
use std::process::Command;

/// The directory holding the `libmoe_capi.so` built for this test run: the test executable's
/// own directory (`target/<profile>/deps`). The copy one level up is only refreshed by plain
/// `cargo build`, so it can be older than the sources this test was built from.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().expect("target/<profile>/deps").to_path_buf()
}

#[test]
fn a_c_program_reproduces_the_fixture_through_the_c_abi() {
    if !cfg!(target_os = "linux") {
        eprintln!("skipped: the C test links a Linux shared library");
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc).arg("--version").output().is_err() {
        assert!(
            std::env::var_os("MOE_REQUIRE_TEST_TOOLS").is_none(),
            "no C compiler ({cc}), and MOE_REQUIRE_TEST_TOOLS forbids skipping the C ABI test"
        );
        eprintln!("skipped: no C compiler ({cc}); set CC to run the C ABI test");
        return;
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib_dir = library_dir();
    let lib = lib_dir.join("libmoe_capi.so");
    assert!(
        lib.is_file(),
        "{} is missing: cargo builds it with this test (crate-type cdylib)",
        lib.display()
    );
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("moe_capi_fixture_run");
    let compile = Command::new(&cc)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(manifest.join("tests/c/fixture_run.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib_dir)
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .args(["-lmoe_capi", "-lm"])
        .output()
        .expect("run the C compiler");
    assert!(
        compile.status.success(),
        "{cc} failed:\n{}",
        String::from_utf8_lossy(&compile.stderr)
    );
    let fixture = moe_testutil::fixtures_dir().join("qwen3moe-w4a8-g32");
    // The library this test was built with, not another copy that the inherited
    // LD_LIBRARY_PATH (cargo puts target/<profile> on it) would find before the rpath.
    let run = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib_dir)
        .arg(&fixture)
        .output()
        .expect("run the C program");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    println!("{stdout}");
    assert!(
        run.status.success(),
        "the C program failed ({}):\n{stdout}\n{stderr}",
        run.status
    );
}
