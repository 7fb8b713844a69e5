//! The header in front of every block handed to ONNX Runtime.
//!
//! ```text
//! base (64-aligned)        base + HEADER = the pointer ONNX Runtime sees
//! | owner | size | magic | ... | tensor bytes ...                      |
//! ```
//! `owner` is the address of the [`Slot`](crate::slot::Slot) whose arena
//! holds the block (an `Arc` reference owned by the block), or 0 for a block
//! from the system allocator (an allocation on a thread with no worker
//! running); `size` is the whole block's length, header included.

use std::ptr::NonNull;

/// Bytes in front of every block handed to ONNX Runtime. A multiple of
/// [`ALIGN`], so the pointer after it keeps the block's alignment.
pub(crate) const HEADER: usize = 64;
/// Alignment of every pointer handed to ONNX Runtime (what its CPU kernels
/// prefer: a cache line, enough for AVX-512).
pub(crate) const ALIGN: usize = 64;
pub(crate) const MAGIC: usize = 0x7465_6e73_6172_656e; // "tensaren"
const _: () = assert!(HEADER % ALIGN == 0 && HEADER >= 3 * size_of::<usize>());

/// What a block's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// Address of the owning slot (an `Arc<Slot>` reference held by the
    /// block), 0 for a system-allocator block.
    pub owner: usize,
    /// Length of the whole block, header included.
    pub size: usize,
}

impl Header {
    /// The header as bytes, to write into the first [`HEADER`] bytes of a
    /// block.
    pub(crate) fn to_bytes(self) -> [u8; 3 * size_of::<usize>()] {
        let mut out = [0u8; 3 * size_of::<usize>()];
        let w = size_of::<usize>();
        out[..w].copy_from_slice(&self.owner.to_ne_bytes());
        out[w..2 * w].copy_from_slice(&self.size.to_ne_bytes());
        out[2 * w..].copy_from_slice(&MAGIC.to_ne_bytes());
        out
    }
}

/// Reads the header in front of `user`.
///
/// # Safety
/// - `user` was returned by [`tensor_arena_alloc`] (so the [`HEADER`] bytes
///   before it are a header this module wrote) and its block is still live.
pub(crate) unsafe fn read_header(user: NonNull<u8>) -> Option<Header> {
    // SAFETY: by the caller's obligation, `user - HEADER` is the start of the
    // same live block, so the subtraction stays inside it.
    let base = unsafe { user.as_ptr().sub(HEADER) };
    let mut words = [0usize; 3];
    for (i, w) in words.iter_mut().enumerate() {
        // SAFETY: the first three words of the block were written by
        // `Header::to_bytes` and are readable; the block is 64-aligned, so
        // each word is aligned.
        *w = unsafe { base.cast::<usize>().add(i).read() };
    }
    (words[2] == MAGIC).then_some(Header {
        owner: words[0],
        size: words[1],
    })
}
