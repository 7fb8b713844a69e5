//! Integration tests of `tensor-arena-cuda` against the simulated driver
//! (no GPU needed).

mod common;
mod driver;
mod forged_handles;
mod memory;
mod ops;
mod plan_store;

mod streams;
