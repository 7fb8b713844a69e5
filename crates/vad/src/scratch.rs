//! Where [`Model::forward`](crate::Model::forward) gets its intermediate tensors.
//!
//! The forward pass asks a [`Scratch`] for each intermediate tensor right
//! before the kernel that writes it, and drops the buffer right after the
//! last kernel that reads it, in the fixed order of [`SCHEDULE`]. A scratch
//! backed by an arena therefore sees the true sizes and lifetimes of one run,
//! which is what its planner needs; a run with the same `L` repeats the same
//! sequence exactly.

use std::convert::Infallible;
use std::fmt;
use std::ops::DerefMut;

use crate::shapes::Intermediate;

/// A source of `f32` buffers for intermediate tensors.
///
/// `take` returns a buffer of exactly `len` elements; its contents are
/// unspecified (the kernels overwrite every element). Dropping the buffer
/// gives it back.
pub trait Scratch {
    /// An owned buffer; dropping it frees it.
    type Buf: DerefMut<Target = [f32]>;
    /// Why a buffer could not be had (for example an arena out of memory).
    type Error;

    /// A buffer of `len` elements for `tensor`.
    fn take(&mut self, tensor: Intermediate, len: usize) -> Result<Self::Buf, Self::Error>;
}

/// A scratch borrowed mutably is a scratch: `model.forward(.., &mut s)`
/// keeps `s` for the next call.
impl<S: Scratch + ?Sized> Scratch for &mut S {
    type Buf = S::Buf;
    type Error = S::Error;

    fn take(&mut self, tensor: Intermediate, len: usize) -> Result<S::Buf, S::Error> {
        (**self).take(tensor, len)
    }
}

/// One step of the forward pass as a scratch sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// [`Scratch::take`] of this tensor.
    Take(Intermediate),
    /// The buffer of this tensor is dropped.
    Release(Intermediate),
}

/// The exact order in which [`Model::forward`](crate::Model::forward) takes and
/// releases its intermediate tensors (the same for every `L`).
pub const SCHEDULE: [Event; 26] = {
    use Event::{Release as R, Take as T};
    use Intermediate::*;
    [
        T(Padded),
        T(Stft),
        R(Padded),
        T(Magnitude),
        R(Stft),
        T(Cols0),
        T(Enc0),
        R(Cols0),
        R(Magnitude),
        T(Cols1),
        T(Enc1),
        R(Cols1),
        R(Enc0),
        T(Cols2),
        T(Enc2),
        R(Cols2),
        R(Enc1),
        T(Cols3),
        T(Enc3),
        R(Cols3),
        R(Enc2),
        T(Gates),
        T(Lstm),
        R(Gates),
        R(Enc3),
        R(Lstm),
    ]
};

/// Sum of the sizes of all intermediate tensors for `l` windows (in `f32`s):
/// what a scratch without reuse (such as [`SliceScratch`]) needs.
pub fn total_len(l: usize) -> usize {
    Intermediate::ALL.iter().map(|t| t.len(l)).sum()
}

/// The most `f32`s live at once during a forward pass over `l` windows,
/// following [`SCHEDULE`]: the lower bound for a scratch that reuses memory.
pub fn peak_len(l: usize) -> usize {
    let (mut live, mut peak) = (0usize, 0usize);
    for e in SCHEDULE {
        match e {
            Event::Take(t) => {
                live += t.len(l);
                peak = peak.max(live);
            }
            Event::Release(t) => live -= t.len(l),
        }
    }
    peak
}

/// A scratch that allocates a fresh `Vec<f32>` per tensor. Simple, and
/// allocates on every call: for tests and as a baseline.
#[derive(Debug, Default, Clone, Copy)]
pub struct HeapScratch;

impl Scratch for HeapScratch {
    type Buf = Vec<f32>;
    type Error = Infallible;

    fn take(&mut self, _tensor: Intermediate, len: usize) -> Result<Vec<f32>, Infallible> {
        Ok(vec![0.0; len])
    }
}

/// A bump scratch over one caller-provided slice: no allocation at all, no
/// reuse (each tensor gets the next `len` elements). Make a new one for each
/// forward call; [`total_len`] tells the size needed.
#[derive(Debug)]
pub struct SliceScratch<'a> {
    rest: &'a mut [f32],
}

impl<'a> SliceScratch<'a> {
    /// Hands out consecutive pieces of `buf`.
    pub fn new(buf: &'a mut [f32]) -> Self {
        SliceScratch { rest: buf }
    }

    /// Elements not handed out yet.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }
}

/// [`SliceScratch`] ran out of room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScratchTooSmall {
    /// The tensor asked for.
    pub tensor: Intermediate,
    /// Elements asked for.
    pub needed: usize,
    /// Elements left.
    pub available: usize,
}

impl fmt::Display for ScratchTooSmall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "scratch too small for {}: {} f32 needed, {} left",
            self.tensor.name(),
            self.needed,
            self.available
        )
    }
}

impl std::error::Error for ScratchTooSmall {}

impl<'a> Scratch for SliceScratch<'a> {
    type Buf = &'a mut [f32];
    type Error = ScratchTooSmall;

    fn take(&mut self, tensor: Intermediate, len: usize) -> Result<&'a mut [f32], ScratchTooSmall> {
        if len > self.rest.len() {
            return Err(ScratchTooSmall {
                tensor,
                needed: len,
                available: self.rest.len(),
            });
        }
        let (head, tail) = std::mem::take(&mut self.rest).split_at_mut(len);
        self.rest = tail;
        Ok(head)
    }
}
