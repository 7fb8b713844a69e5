//! The `allocator_api2::alloc::Allocator` interface of `&Arena`.

use super::Arena;
use crate::memory::HostMemory;
use allocator_api2::alloc::{AllocError, Allocator, Layout};
use core::panic::Location;
use core::ptr::NonNull;

// SAFETY: the trait's contract holds: 1. a returned block stays valid until it
// is deallocated or the arena is dropped: the memory layer keeps committed
// memory in place (`HostMemory`), a span is decommitted or released only
// when free, and moving the `Arena` value does not move its memory;
// 2. blocks never overlap (the free map tiles each region); 3. zero-size
// layouts get a dangling, aligned pointer and are never passed to the pool;
// 4. failures return `Err`, never panic; 5. the size returned is the real
// span size, which `deallocate` does not need.
unsafe impl<M: HostMemory> Allocator for &Arena<M> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            let ptr = dangling_for(layout.align());
            return Ok(NonNull::slice_from_raw_parts(ptr, 0));
        }
        let (ptr, span, size) = self
            .alloc_raw(layout.size(), layout.align(), Location::caller())
            .map_err(|_| AllocError)?;
        self.state
            .borrow_mut()
            .by_addr
            .insert(ptr.as_ptr() as usize, span);
        Ok(NonNull::slice_from_raw_parts(ptr, size))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        let mut st = self.state.borrow_mut();
        let Some(span) = st.by_addr.remove(&(ptr.as_ptr() as usize)) else {
            debug_assert!(
                false,
                "deallocate: {ptr:p} is not a live block of this arena (foreign pointer or double free)"
            );
            return;
        };
        if let Some((at, size)) = st.raw.span_address(span) {
            // Bytes a typed user left uninitialized (padding) must never
            // reach a later `&[u8]` view: zero the block on its way back.
            // SAFETY: the span is live, `size` committed bytes at `at`
            // (`HostMemory`); the caller owns it and is giving it back, so
            // nothing else reads or writes it.
            unsafe { at.as_ptr().write_bytes(0, size) };
        }
        let result = st.raw.free_span(span);
        debug_assert!(
            result.is_ok(),
            "deallocate: {ptr:p} is not a live block of this arena (double free?): {result:?}"
        );
    }
}

/// A non-null pointer aligned to `align`, for zero-size allocations.
pub(crate) fn dangling_for(align: usize) -> NonNull<u8> {
    // A zero-size allocation may use any non-null, aligned address; the
    // alignment itself is one (the same trick as `NonNull::dangling`).
    NonNull::new(core::ptr::without_provenance_mut(align)).unwrap_or(NonNull::dangling())
}
