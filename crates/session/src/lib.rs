#![doc = include_str!("../README.md")]
#![deny(unsafe_code)]
#![deny(missing_docs)]

mod pool;
mod session;
mod swap;
mod weights;

pub use pool::{PoolGuard, SessionPool};
pub use session::{
    BudgetedMemory, BudgetedSession, PlanConfig, RunContext, Session, SessionConfig, SessionStats,
};
pub use swap::ModelHandle;
pub use tensor_arena;

pub use weights::{
    Dtype, Element, LoadMode, MmapAck, TensorView, Weights, WeightsError, MAX_HEADER_LEN,
    OWNED_ALIGN,
};

// Thread-safety, as "Guarantees and limits" states it; all derived by the compiler (the
// crate has no `unsafe impl`). `Session: !Sync` is pinned by a `compile_fail` doctest.
const _: () = {
    const fn send<T: Send>() {}
    const fn send_sync<T: Send + Sync>() {}
    send::<Session>();
    send::<BudgetedSession>();
    send_sync::<SessionPool<BudgetedMemory>>();
    send::<PoolGuard<'static>>();
    send_sync::<SessionPool>();
    send_sync::<ModelHandle>();
    send_sync::<Weights>();
};
