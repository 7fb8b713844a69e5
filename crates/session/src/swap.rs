//! [`ModelHandle`]: the current weights, replaceable while workers run.

use crate::weights::Weights;
use arc_swap::ArcSwap;
use std::fmt;
use std::sync::Arc;

/// Holds the weights new runs use; [`ModelHandle::swap`] replaces them while
/// runs are in flight.
///
/// A run takes its own reference to the weights when it starts, so runs in
/// flight finish on the weights they started with; the old weights (and
/// their memory map, if any) are freed when the last run using them ends.
/// That is the production update: load the new model, swap, and the old one
/// goes away on its own.
///
/// Cloning a handle gives another handle to the same slot: a swap through
/// any of them is seen by all (and by every [`Session`](crate::Session)
/// made from them).
#[derive(Clone)]
pub struct ModelHandle {
    current: Arc<ArcSwap<Weights>>,
}

impl ModelHandle {
    /// A handle holding `weights`.
    pub fn new(weights: Arc<Weights>) -> Self {
        Self {
            current: Arc::new(ArcSwap::new(weights)),
        }
    }

    /// The current weights (a new reference; lock-free).
    pub fn load(&self) -> Arc<Weights> {
        self.current.load_full()
    }

    /// Makes `new` the weights of every run that starts from now on;
    /// returns the previous ones. Dropping the returned `Arc` releases them
    /// as soon as no run uses them any more.
    pub fn swap(&self, new: Arc<Weights>) -> Arc<Weights> {
        self.current.swap(new)
    }
}

impl fmt::Debug for ModelHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.load();
        f.debug_struct("ModelHandle")
            .field("tensors", &w.len())
            .field("bytes", &w.total_bytes())
            .field("mapped", &w.is_mapped())
            .finish()
    }
}
