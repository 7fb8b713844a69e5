//! The only place the crate asks for memory: regions from an
//! [`Allocator`], each call counted.

use allocator_api2::alloc::{Allocator, Layout};
use core::ptr::NonNull;

/// Draws regions from `A` and counts every call.
#[derive(Debug)]
pub(crate) struct Backing<A: Allocator> {
    alloc: A,
    /// Successful region allocations.
    pub(crate) allocs: u64,
    /// Region deallocations.
    pub(crate) frees: u64,
}

impl<A: Allocator> Backing<A> {
    pub(crate) const fn new(alloc: A) -> Self {
        Self {
            alloc,
            allocs: 0,
            frees: 0,
        }
    }

    /// Allocates one region of `layout` (non-zero size). The memory is not
    /// initialized.
    pub(crate) fn allocate(&mut self, layout: Layout) -> Option<NonNull<u8>> {
        debug_assert!(layout.size() > 0);
        let ptr = self.alloc.allocate(layout).ok()?;
        self.allocs += 1;
        Some(ptr.cast())
    }

    /// Returns a region to the allocator.
    ///
    /// # Safety
    /// - `ptr` was returned by [`Backing::allocate`] on this backing with the
    ///   same `layout`, and has not been deallocated since.
    /// - Nothing refers to the region's memory any more.
    pub(crate) unsafe fn deallocate(&mut self, ptr: NonNull<u8>, layout: Layout) {
        self.frees += 1;
        // SAFETY: the caller guarantees `ptr` is a live allocation of
        // `self.alloc` with this exact layout.
        unsafe { self.alloc.deallocate(ptr, layout) };
    }
}
