//! The `moe` command. For now it only reports the CPU it runs on; the layer commands arrive with
//! issue 6.

fn main() {
    println!("moe {}", env!("CARGO_PKG_VERSION"));
}
