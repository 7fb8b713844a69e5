//! Integration tests of `tensor-arena-cuda` against the simulated driver
//! (no GPU needed).

mod common;
mod driver;
mod memory;
mod ops;

mod streams;
