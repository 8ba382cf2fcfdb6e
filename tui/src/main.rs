//! The `allocview` command.

#![forbid(unsafe_code)]

fn main() {
    println!("allocview {}", env!("CARGO_PKG_VERSION"));
}
