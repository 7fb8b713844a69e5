//! [`Heap`]: regions from an `allocator_api2` allocator.

use super::{HostMemory, Memory, MemoryError, MemoryOp, MemoryProps};
use allocator_api2::alloc::{Allocator, Layout};
use core::ptr::NonNull;

/// Regions from an [`Allocator`] (the global allocator, or any other): the
/// portable memory layer, and the way to put an arena on a custom
/// allocator.
///
/// Each reservation is one allocation, committed at once and zeroed
/// ([`Allocator::allocate_zeroed`]; for large regions the global allocator
/// gets zeroed pages from the system without touching them). Regions cannot
/// grow in place or decommit: the arena grows by adding regions (sized by
/// [`Growth`](crate::Growth)) and shrinks by returning whole free ones.
#[derive(Debug, Default, Clone)]
pub struct Heap<A: Allocator> {
    alloc: A,
}

impl<A: Allocator> Heap<A> {
    /// Regions from `alloc`.
    pub const fn new(alloc: A) -> Self {
        Self { alloc }
    }

    /// The allocator.
    pub fn allocator(&self) -> &A {
        &self.alloc
    }
}

impl<A: Allocator> Memory for Heap<A> {
    type Ptr = NonNull<u8>;

    fn props(&self) -> MemoryProps {
        MemoryProps {
            // Regions are sized to the arena's alignment; nothing is
            // committed separately.
            granule: 1,
            huge: 0,
            zeroed: true,
            host_accessible: true,
            committed_on_reserve: true,
        }
    }

    fn reservation_size(&self, min: usize, _cap: usize) -> usize {
        min
    }

    fn reserve(&mut self, len: usize, align: usize) -> Result<NonNull<u8>, MemoryError> {
        let refused = MemoryError {
            op: MemoryOp::Reserve,
            bytes: len,
            code: None,
        };
        let layout = Layout::from_size_align(len, align).map_err(|_| refused)?;
        if layout.size() == 0 {
            return Err(refused);
        }
        let ptr = self.alloc.allocate_zeroed(layout).map_err(|_| refused)?;
        Ok(ptr.cast())
    }

    fn commit(&mut self, _base: NonNull<u8>, _off: usize, _len: usize) -> Result<(), MemoryError> {
        // Committed on reserve; the arena never asks.
        Ok(())
    }

    fn decommit(
        &mut self,
        _base: NonNull<u8>,
        _off: usize,
        _len: usize,
    ) -> Result<(), MemoryError> {
        // Regions are returned whole; the arena never asks.
        Ok(())
    }

    fn release(&mut self, base: NonNull<u8>, len: usize, align: usize) {
        let Ok(layout) = Layout::from_size_align(len, align) else {
            debug_assert!(false, "release of a range reserve never returned");
            return;
        };
        // SAFETY: the arena calls `release` once per range `reserve`
        // returned, with the same length and alignment (the `Memory`
        // contract), so `base` was allocated by `self.alloc` with `layout`.
        unsafe { self.alloc.deallocate(base, layout) };
    }

    fn at(base: NonNull<u8>, offset: usize) -> NonNull<u8> {
        // `wrapping_add` keeps `base`'s provenance; the result is not null
        // for offsets inside (or one past) an allocation.
        NonNull::new(base.as_ptr().wrapping_add(offset)).unwrap_or(base)
    }

    fn address(ptr: NonNull<u8>) -> usize {
        ptr.as_ptr() as usize
    }
}

// SAFETY: 1. each range is an allocation of `self.alloc`, which no other
// allocation overlaps, and allocations do not move; 2. it is usable and
// zeroed from `reserve` on (`allocate_zeroed`) until `release` deallocates
// it, and `Allocator` memory has no thread affinity; 3. `at` offsets
// `base` with its provenance.
unsafe impl<A: Allocator> HostMemory for Heap<A> {}
