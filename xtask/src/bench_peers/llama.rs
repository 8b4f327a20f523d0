//! The llama.cpp peer of `bench-peers`: ggml's MUL_MAT_ID on the CPU backend, timed by our own
//! small C program (`xtask/peers/llama_mul_mat_id.c`) compiled against a ggml built from source.
//!
//! The source is the llama.cpp tree vendored in the llama-cpp-python sdist from the package
//! index (pinned, so every machine times the same ggml). Everything lands in one directory
//! outside the repository (`--llama-dir`, default under the peers directory): the sdist, its unpacked
//! tree, a venv holding pinned cmake and ninja when the machine has no cmake, and the ggml
//! build. Each step is skipped when its result is already there, so only the first run pays
//! the ~5 minutes of compiling ggml on 2 cores. Only the `ggml` target is built (with the
//! top-level llama.cpp project: the sdist lacks `ggml/ggml.pc.in`, which ggml's own project
//! needs when configured on its own).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::json::{self, Value};
use crate::project_root;
use crate::util::{Cmd, banner};

/// The llama-cpp-python release whose vendored llama.cpp is built.
pub const SDIST_VERSION: &str = "0.3.36";

/// cmake and ninja from the package index, for machines without cmake.
const CMAKE_PIN: &str = "cmake==4.4.5";
const NINJA_PIN: &str = "ninja==1.13.2";

/// Upper bound for fetching, configuring and building ggml.
const BUILD_LIMIT: Duration = Duration::from_secs(40 * 60);

/// The timing program, relative to the workspace root.
const PROGRAM_SOURCE: &str = "xtask/peers/llama_mul_mat_id.c";

/// Where the peer's files go.
struct Layout {
    dir: PathBuf,
}

impl Layout {
    fn sdist(&self) -> PathBuf {
        self.dir
            .join(format!("llama_cpp_python-{SDIST_VERSION}.tar.gz"))
    }
    fn llama_cpp(&self) -> PathBuf {
        self.dir
            .join(format!("llama_cpp_python-{SDIST_VERSION}"))
            .join("vendor")
            .join("llama.cpp")
    }
    fn tools(&self) -> PathBuf {
        self.dir.join("cmake-venv")
    }
    fn build(&self) -> PathBuf {
        self.dir.join(format!("build-ggml-{SDIST_VERSION}"))
    }
    fn libs(&self) -> [PathBuf; 3] {
        let src = self.build().join("ggml").join("src");
        [
            src.join("libggml.a"),
            src.join("libggml-cpu.a"),
            src.join("libggml-base.a"),
        ]
    }
}

/// Fetches, unpacks and builds ggml where needed, then compiles the timing program into
/// `scratch`. Returns the program, or why the peer is not installed.
pub fn prepare(dir: &Path, scratch: &Path) -> Result<PathBuf, String> {
    let layout = Layout {
        dir: dir.to_path_buf(),
    };
    for tool in ["cc", "c++", "tar"] {
        if find_program(tool).is_none() {
            return Err(format!("no `{tool}` on PATH"));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    if !layout.libs().iter().all(|lib| lib.is_file()) {
        banner("building ggml for the llama.cpp peer");
        build_ggml(&layout)?;
    }
    let program = scratch.join("llama_mul_mat_id");
    let include = layout.llama_cpp().join("ggml").join("include");
    let [ggml, cpu, base] = layout.libs();
    // OpenMP: ggml's CPU backend is built with it when the compiler has it, as here.
    Cmd::new("cc")
        .args(["-O2", "-std=c11", "-Wall", "-o"])
        .arg(&program)
        .arg(project_root().join(PROGRAM_SOURCE))
        .arg("-I")
        .arg(&include)
        .arg(&ggml)
        .arg(&cpu)
        .arg(&base)
        .args(["-fopenmp", "-lstdc++", "-lm", "-lpthread"])
        .timeout(Duration::from_secs(300))
        .run()
        .map_err(|e| format!("compiling {PROGRAM_SOURCE}: {e}"))?;
    Ok(program)
}

/// The sdist, unpacked, configured and built (target `ggml` only), each step where missing.
fn build_ggml(layout: &Layout) -> Result<(), String> {
    let step = |cmd: Cmd, what: &str| {
        cmd.timeout(BUILD_LIMIT)
            .run()
            .map_err(|e| format!("{what}: {e}"))
    };
    if !layout.sdist().is_file() {
        // `--no-binary` names only llama-cpp-python: with `:all:`, pip would also build the
        // sdist's build requirements (cmake among them) from source just to read its metadata.
        step(
            Cmd::new("python3")
                .args(["-m", "pip", "download", "--no-deps", "--no-binary"])
                .arg("llama-cpp-python")
                .arg(format!("llama-cpp-python=={SDIST_VERSION}"))
                .arg("-d")
                .arg(&layout.dir),
            "fetching the llama-cpp-python sdist",
        )?;
    }
    if !layout.llama_cpp().join("CMakeLists.txt").is_file() {
        step(
            Cmd::new("tar")
                .arg("xzf")
                .arg(layout.sdist())
                .arg("-C")
                .arg(&layout.dir),
            "unpacking the sdist",
        )?;
    }
    let (cmake, ninja) = cmake_and_ninja(layout, &step)?;
    let mut configure = Cmd::new(&cmake)
        .arg("-S")
        .arg(layout.llama_cpp())
        .arg("-B")
        .arg(layout.build())
        .args([
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON",
            "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_BUILD_COMMON=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_TOOLS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
        ]);
    if let Some(ninja) = &ninja {
        configure = configure
            .args(["-G", "Ninja"])
            .arg(format!("-DCMAKE_MAKE_PROGRAM={}", ninja.display()));
    }
    step(configure, "configuring ggml")?;
    // Niced: the machine is shared, and this is the heavy part.
    step(
        Cmd::new("nice")
            .args(["-n", "10"])
            .arg(&cmake)
            .arg("--build")
            .arg(layout.build())
            .args(["--target", "ggml", "--parallel"])
            .arg(
                std::thread::available_parallelism()
                    .map_or(2, |n| n.get())
                    .to_string(),
            ),
        "building ggml",
    )
}

/// cmake (and ninja, when at hand) from PATH, else from a venv in the peer directory with both
/// installed from the package index.
fn cmake_and_ninja(
    layout: &Layout,
    step: &impl Fn(Cmd, &str) -> Result<(), String>,
) -> Result<(PathBuf, Option<PathBuf>), String> {
    if let Some(cmake) = find_program("cmake") {
        return Ok((cmake, find_program("ninja")));
    }
    let bin = layout.tools().join("bin");
    if !bin.join("cmake").is_file() {
        step(
            Cmd::new("python3").args(["-m", "venv"]).arg(layout.tools()),
            "creating a venv for cmake",
        )?;
        step(
            Cmd::new(bin.join("python"))
                .args(["-m", "pip", "install", "--quiet", CMAKE_PIN, NINJA_PIN]),
            "installing cmake",
        )?;
    }
    let ninja = Some(bin.join("ninja")).filter(|n| n.is_file());
    Ok((bin.join("cmake"), ninja))
}

/// The first `name` on PATH.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The experts, top-k, hidden and intermediate sizes of a `moe bench` shape name: the three
/// standard shapes (as in `moe bench`), or `eE-kK-hH-iI`.
pub fn shape_dims(shape: &str) -> Option<[usize; 4]> {
    match shape {
        "qwen3-30b-a3b" => return Some([128, 8, 2048, 768]),
        "mixtral-8x7b" => return Some([8, 2, 4096, 14336]),
        "deepseek-v2-lite" => return Some([64, 6, 2048, 1408]),
        _ => {}
    }
    let mut dims = [0; 4];
    let mut parts = shape.split('-');
    for (dim, tag) in dims.iter_mut().zip(['e', 'k', 'h', 'i']) {
        *dim = parts.next()?.strip_prefix(tag)?.parse().ok()?;
    }
    parts.next().is_none().then_some(dims)
}

/// The timing program's lines (one JSON object per M) as a report in the shape the other peers
/// write: `{"meta": ..., "results": [{"path", "M", "status", "ms_median", ...}]}`.
pub fn report_from_lines(text: &str, path: &str) -> Result<Value, String> {
    let mut results = Vec::new();
    let mut meta = Value::Null;
    for line in text.lines().filter(|l| l.trim_start().starts_with('{')) {
        let Value::Obj(mut members) = json::parse(line)? else {
            return Err(format!("not an object: {line}"));
        };
        if meta == Value::Null {
            let keep = [
                "peer",
                "ggml_version",
                "ggml_commit",
                "type",
                "layout",
                "copies",
            ];
            meta = Value::obj(
                members
                    .iter()
                    .filter(|(k, _)| keep.contains(&k.as_str()))
                    .cloned(),
            );
        }
        members.push(("path".into(), Value::str(path)));
        results.push(Value::Obj(members));
    }
    if results.is_empty() {
        return Err("the timing program printed no result".into());
    }
    Ok(Value::obj([
        ("meta", meta),
        ("results", Value::Arr(results)),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_by_name_and_custom() {
        assert_eq!(shape_dims("mixtral-8x7b"), Some([8, 2, 4096, 14336]));
        assert_eq!(shape_dims("e16-k2-h512-i256"), Some([16, 2, 512, 256]));
        assert_eq!(shape_dims("e16-k2-h512"), None);
        assert_eq!(shape_dims("llama"), None);
    }

    #[test]
    fn program_lines_become_a_report() {
        let text = "{\"peer\": \"llama.cpp\", \"type\": \"q4_0\", \"layout\": \"CPU_REPACK\", \
                    \"M\": 1, \"status\": \"ok\", \"ms_median\": 3.5, \"ms_min\": 3.1}\n\
                    {\"peer\": \"llama.cpp\", \"M\": 1024, \"status\": \"skipped\", \
                    \"reason\": \"one call took 30.0 s\"}\n";
        let report = report_from_lines(text, "q4_0").expect("parses");
        let results = report.get("results").expect("results").items();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0].get("path").and_then(Value::as_str), Some("q4_0"));
        assert_eq!(
            report
                .get("meta")
                .and_then(|m| m.get("layout"))
                .and_then(Value::as_str),
            Some("CPU_REPACK")
        );
        assert!(report_from_lines("nothing\n", "q4_0").is_err());
    }
}
