//! `cargo xtask codegen`: regenerates the committed generated files, today the C header
//! `crates/moe-capi/include/moe.h` (cbindgen over moe-capi's exported functions, configured by
//! `crates/moe-capi/cbindgen.toml`). `--check` compares instead of writing, and the
//! `generated_files_are_fresh` test runs that check, so a stale header fails `cargo test`.

use std::path::{Path, PathBuf};

use crate::util::Result;

/// The crate the header describes, relative to the workspace root.
const CAPI_CRATE: &str = "crates/moe-capi";
/// The header, relative to [`CAPI_CRATE`].
const HEADER: &str = "include/moe.h";

/// Writes every generated file, or with `check` only reports those that differ.
pub fn run(check: bool) -> Result<()> {
    let root = crate::project_root();
    let header = generate_header(&root)?;
    ensure_file_contents(&root.join(CAPI_CRATE).join(HEADER), &header, check)
}

/// The C header of moe-capi, as cbindgen writes it.
fn generate_header(root: &Path) -> Result<String> {
    let crate_dir = root.join(CAPI_CRATE);
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .map_err(|e| format!("{CAPI_CRATE}/cbindgen.toml: {e}"))?;
    let bindings = cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .map_err(|e| format!("cbindgen on {CAPI_CRATE}: {e}"))?;
    let mut bytes = Vec::new();
    bindings.write(&mut bytes);
    Ok(String::from_utf8(bytes)?)
}

/// Makes `path` hold `contents`; in check mode, fails when it does not.
fn ensure_file_contents(path: &PathBuf, contents: &str, check: bool) -> Result<()> {
    let current = std::fs::read_to_string(path).unwrap_or_default();
    if current == contents {
        println!("{} is up to date", path.display());
        return Ok(());
    }
    if check {
        return Err(format!(
            "{} is stale: run `cargo xtask codegen` and commit the result",
            path.display()
        )
        .into());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, contents)?;
    println!("{} updated", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn generated_files_are_fresh() {
        if let Err(e) = super::run(true) {
            panic!("{e}");
        }
    }
}
