//! The `tensor-arena` command (built in crates/cli; replay lands with issue 5).

fn main() {}
