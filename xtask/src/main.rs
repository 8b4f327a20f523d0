//! Project automation (`cargo xtask <command>`); see `cargo xtask help`.

fn main() {
    eprintln!("usage: cargo xtask <test-arm|ci>");
    std::process::exit(2);
}
