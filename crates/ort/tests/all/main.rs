//! Integration tests of tensor-arena-ort on real models.

mod common;
mod explore;
