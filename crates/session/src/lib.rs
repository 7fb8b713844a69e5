#![doc = include_str!("../README.md")]
#![deny(unsafe_code)]
#![deny(missing_docs)]

mod pool;
mod session;
mod swap;
mod weights;

pub use pool::{PoolGuard, SessionPool};
pub use session::{PlanConfig, RunContext, Session, SessionConfig, SessionStats};
pub use swap::ModelHandle;
pub use tensor_arena;

pub use weights::{
    Dtype, Element, LoadMode, MmapAck, TensorView, Weights, WeightsError, MAX_HEADER_LEN,
    OWNED_ALIGN,
};
