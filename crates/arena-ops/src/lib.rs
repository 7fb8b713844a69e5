//! The operation language shared by the arena's property tests and fuzz
//! targets, and the model checker that runs it.
//!
//! - [`Op`]: allocate (size and alignment), free by index, begin and end
//!   runs (plain or planned), shrink and shrink_to, inject backing failures, collections
//!   through `&Arena: Allocator`, session clone, drop and run, and
//!   `SharedArena` steps on two threads. [`decode`] turns fuzz bytes into
//!   operations deterministically (no randomness inside `Arbitrary`).
//! - [`run_pages`]: the same operations on the `Pages` memory layer
//!   through [`Faulty`], which checks and counts every reserve, commit and
//!   decommit and fails them on demand.
//! - [`run`]: applies operations to real arenas and checks them against a
//!   model after every step (no overlap, alignment, fill patterns survive,
//!   `in_use` is the sum of live sizes, `in_use <= reserved <= cap`, backing
//!   calls balanced and nothing outstanding at the end).
//! - [`run_budget`]: [`BudgetOp`]s on several arenas sharing one
//!   `Budget`, checked against the budget's arithmetic after every step
//!   (committed is the sum of the arenas', never over the limit; a refusal
//!   changes nothing and only happens when no member can give more).
//! - [`weights_load`]: arbitrary bytes through both `Weights::open` modes.
//! - [`plans`]: arbitrary recordings and plans (built from bytes or
//!   deserialized from arbitrary JSON) through planned runs.
//! - [`plan_store`]: arbitrary bytes as a plan store file, loaded into a
//!   fresh cache; what loads serves planned runs.
//! - [`fuzz_arena_ops`], [`fuzz_budget`], [`fuzz_plans`], [`fuzz_plan_store`] and [`fuzz_weights_load`]: exactly what the fuzz
//!   targets in `fuzz/` call, so `tests/corpus.rs` replays their corpus as a
//!   plain test.
//!
//! Planned runs: every run that ends with no block live is recorded and
//! becomes a plan; `BeginPlannedRun` opens a run served by one, and the
//! operations that follow either repeat the recording or deviate from it.
//! Sessions plan their runs by key too (`SessionRun` buckets sizes under
//! one key, so later runs of a key deviate from its plan).
//!
//! With the `check-invariants` feature (on for this crate's tests) or under
//! `cfg(fuzzing)`, every step also calls the arena's own `check_invariants`.

mod checks;
mod counting;
mod families;
mod faulty;
mod model;
mod op;
mod pages;
mod pattern;
mod plans;
mod raw_handles;
mod slots;
mod store;
mod weights;

pub use counting::Counting;
pub use families::FamilyRuns;
pub use faulty::{Faulty, Ledger};
pub use model::{config, run, run_budget, BudgetReport};
pub use op::{
    align_from_log2, budget_size, decode, decode_budget, BudgetOp, Op, RawOp, SharedOp, Size,
    BUDGET_ARENAS, BUDGET_LIMIT, BUDGET_MEMBERS, CAP, GRANULE, MAX_ALIGN, MAX_OPS, MAX_PLANS,
    MAX_REQUEST, MAX_SESSIONS, MAX_SHARED_OPS,
};
pub use pages::run_pages;
pub use plans::{plans, plans_reported};
pub use store::{plan_store, plan_store_file, plan_store_load_and_save};
pub use weights::weights_load;

/// What the `arena_ops` fuzz target runs: [`decode`], then [`run`] (the
/// `Heap` layer, shared arenas, sessions) and [`run_pages`] (the `Pages`
/// layer, with failures injected into reserve and commit).
pub fn fuzz_arena_ops(data: &[u8]) {
    let ops = decode(data);
    run(&ops);
    run_pages(&ops);
}

/// What the `budget` fuzz target runs: [`decode_budget`], then
/// [`run_budget`] (several arenas under one budget).
pub fn fuzz_budget(data: &[u8]) {
    run_budget(&decode_budget(data));
}

/// What the `plans` fuzz target runs: [`plans`].
pub fn fuzz_plans(data: &[u8]) {
    plans(data);
}

/// What the `plan_store` fuzz target runs: [`plan_store`].
pub fn fuzz_plan_store(data: &[u8]) {
    plan_store(data);
}

/// What the `weights_load` fuzz target runs: [`weights_load`].
pub fn fuzz_weights_load(data: &[u8]) {
    weights_load(data);
}
