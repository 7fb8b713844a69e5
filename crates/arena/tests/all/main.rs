//! Integration tests of the arena, one module per topic.

mod bad_input;
mod basics;
mod budget;
mod common;
mod cxx_panic;
mod families;
mod first_sight;
mod footprint;
mod give_back;
mod gpu_traces;
mod grown_block;
mod learning;
mod model;
mod never_a_loss;
mod planner;
mod plans;
mod pressure;
mod reentry;
mod reliability;
mod review;
mod rules;
mod scoped;
mod scoped_dynamic;
mod shared;
mod soundness;
mod trace;
