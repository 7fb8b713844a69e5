//! [`Block`] and [`TypedBlock`]: owned buffers of an [`Arena`].

use super::Arena;
use crate::memory::{DefaultMemory, HostMemory};
use crate::raw::Handle;
use crate::ArenaError;
use core::fmt;
use core::ops::{Deref, DerefMut};
use core::ptr::NonNull;

/// A buffer from an [`Arena`]; derefs to `[u8]` and goes back to the
/// arena's cache when dropped.
///
/// | state  | how it gets there |
/// |--------|-------------------|
/// | free   | in a region's free spans (or not yet carved) |
/// | live   | handed out by [`Arena::try_alloc`] as a `Block` |
/// | cached | the `Block` dropped: free again, kept by the arena until a shrink or drop |
pub struct Block<'a, M: HostMemory = DefaultMemory> {
    arena: &'a Arena<M>,
    /// Valid for `len` bytes, initialized, owned by this block alone.
    ptr: NonNull<u8>,
    len: usize,
    /// How to give it back; `None` for an empty block (no memory).
    handle: Option<Handle>,
}

impl<'a, M: HostMemory> Block<'a, M> {
    pub(crate) fn new(arena: &'a Arena<M>, ptr: NonNull<u8>, len: usize, handle: Handle) -> Self {
        Self {
            arena,
            ptr,
            len,
            handle: Some(handle),
        }
    }

    pub(crate) fn empty(arena: &'a Arena<M>, ptr: NonNull<u8>) -> Self {
        Self {
            arena,
            ptr,
            len: 0,
            handle: None,
        }
    }

    /// Bytes requested (the block may hold a few more, see [`Block::capacity`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block is empty (a zero-size request).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the block holds: the request rounded up to the alignment.
    pub fn capacity(&self) -> usize {
        self.handle.map_or(0, |h| self.arena.capacity_of(h))
    }

    /// Pointer to the first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Mutable pointer to the first byte.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes as a slice of `T`.
    ///
    /// # Errors
    /// When the length is not a multiple of `size_of::<T>()` or the block is
    /// not aligned enough for `T` (blocks are aligned to the arena's
    /// alignment, 64 by default).
    pub fn pod<T: bytemuck::Pod>(&self) -> Result<&[T], bytemuck::PodCastError> {
        bytemuck::try_cast_slice(self)
    }

    /// The bytes as a mutable slice of `T`.
    ///
    /// # Errors
    /// As [`Block::pod`].
    pub fn pod_mut<T: bytemuck::Pod>(&mut self) -> Result<&mut [T], bytemuck::PodCastError> {
        bytemuck::try_cast_slice_mut(self)
    }

    /// The block as a typed buffer of `len() / size_of::<T>()` elements.
    ///
    /// # Errors
    /// Gives the block back when `T` is zero-sized, needs more alignment
    /// than the block's address has, or the length is not a multiple of
    /// `size_of::<T>()`.
    pub fn into_typed<T: bytemuck::Pod>(self) -> Result<TypedBlock<'a, T, M>, Self> {
        let size = size_of::<T>();
        if size == 0 || self.len % size != 0 || self.ptr.as_ptr() as usize % align_of::<T>() != 0 {
            return Err(self);
        }
        Ok(TypedBlock {
            len: self.len / size,
            block: self,
            _elem: core::marker::PhantomData,
        })
    }
}

/// A [`Block`] viewed as a slice of `T`: derefs to `[T]`; from
/// [`Arena::try_alloc_slice`] or [`Block::into_typed`].
pub struct TypedBlock<'a, T, M: HostMemory = DefaultMemory> {
    block: Block<'a, M>,
    /// Elements; `len * size_of::<T>() == block.len()` (for a zero-sized
    /// `T`, any `len` over an empty block).
    len: usize,
    _elem: core::marker::PhantomData<T>,
}

impl<'a, T: bytemuck::Pod, M: HostMemory> TypedBlock<'a, T, M> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The untyped block.
    pub fn into_block(self) -> Block<'a, M> {
        self.block
    }
}

impl<T: bytemuck::Pod, M: HostMemory> Deref for TypedBlock<'_, T, M> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        if size_of::<T>() == 0 {
            return zst_slice_mut(self.len);
        }
        // Checked when the typed block was made (size and alignment), so
        // this cast cannot fail; bytemuck checks it again.
        bytemuck::cast_slice(&self.block)
    }
}

impl<T: bytemuck::Pod, M: HostMemory> DerefMut for TypedBlock<'_, T, M> {
    fn deref_mut(&mut self) -> &mut [T] {
        if size_of::<T>() == 0 {
            return zst_slice_mut(self.len);
        }
        bytemuck::cast_slice_mut(&mut self.block)
    }
}

/// A slice of `len` zero-sized elements (no memory behind it).
fn zst_slice_mut<'a, T>(len: usize) -> &'a mut [T] {
    assert!(size_of::<T>() == 0, "only for zero-sized elements");
    // SAFETY: `T` is zero-sized, so a slice of any length occupies no
    // bytes: a dangling, aligned, non-null pointer is valid for it, and no
    // two such slices overlap in memory. `T: Pod` elsewhere (the callers),
    // so any (empty) bit pattern is a valid `T`.
    unsafe { core::slice::from_raw_parts_mut(core::ptr::NonNull::<T>::dangling().as_ptr(), len) }
}

impl<T, M: HostMemory> fmt::Debug for TypedBlock<'_, T, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedBlock")
            .field("ptr", &self.block.ptr)
            .field("len", &self.len)
            .field("elem", &core::any::type_name::<T>())
            .finish()
    }
}

impl<M: HostMemory> Deref for Block<'_, M> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes (a live span, whose region stays while it lives,
        // or dangling with `len == 0`), initialized (the pool zeroes memory the first time it
        // hands it out), and no other block overlaps them.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<M: HostMemory> DerefMut for Block<'_, M> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only access.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<M: HostMemory> Drop for Block<'_, M> {
    fn drop(&mut self) {
        if let Some(handle) = self.handle {
            self.arena.release(handle);
        }
    }
}

impl<M: HostMemory> fmt::Debug for Block<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

/// Wraps a block just allocated for `T` (size and alignment already right).
pub(crate) fn typed<T: bytemuck::Pod, M: HostMemory>(
    block: Block<'_, M>,
    elems: usize,
) -> Result<TypedBlock<'_, T, M>, ArenaError> {
    if size_of::<T>() == 0 {
        // A slice of zero-sized elements needs no memory: the block is
        // empty and the slice has `elems` elements (see `Deref`).
        return Ok(TypedBlock {
            block,
            len: elems,
            _elem: core::marker::PhantomData,
        });
    }
    let len = block.len();
    block
        .into_typed()
        .map_err(|_| ArenaError::CapacityOverflow { requested: len })
}
