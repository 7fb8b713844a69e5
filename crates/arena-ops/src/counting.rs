//! [`Counting`]: a backing allocator that counts every call and fails on demand.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tensor_arena::allocator_api2::alloc::{AllocError, Allocator, Global, Layout};

/// A backing allocator for arenas under test: forwards to [`Global`], counts
/// allocations, frees and outstanding bytes, and can be told to fail.
///
/// Atomic counters, so `&Counting` is `Send + Sync` and can back a
/// [`SharedArena`](tensor_arena::SharedArena) used from several threads.
#[derive(Debug, Default)]
pub struct Counting {
    /// Successful allocations.
    allocs: AtomicU64,
    /// Deallocations.
    frees: AtomicU64,
    /// Bytes allocated and not yet freed.
    outstanding: AtomicUsize,
    /// Allocation calls so far, failed ones included.
    calls: AtomicU64,
    /// The next this many allocation calls fail.
    fail_next: AtomicU64,
    /// Calls that fail once, by index (counted from 0): bit `i` for call `i`,
    /// over the first 64 calls.
    fail_mask: AtomicU64,
    /// Every call from this index on fails (`u64::MAX`: never).
    fail_from: AtomicU64,
}

impl Counting {
    /// A backing allocator that never fails.
    pub fn new() -> Self {
        Self {
            fail_from: AtomicU64::new(u64::MAX),
            ..Self::default()
        }
    }

    /// Fails only allocation call number `n` (counted from 0), for `n < 64`.
    pub fn failing_at(n: u32) -> Self {
        let c = Self::new();
        c.fail_mask.store(1u64 << n.min(63), Ordering::Relaxed);
        c
    }

    /// Fails every allocation call from number `n` (counted from 0) on.
    pub fn failing_from(n: u64) -> Self {
        let c = Self::new();
        c.fail_from.store(n, Ordering::Relaxed);
        c
    }

    /// Makes the next `n` allocation calls fail (on top of any already pending).
    pub fn fail_next(&self, n: u64) {
        self.fail_next.fetch_add(n, Ordering::Relaxed);
    }

    /// Whether the next allocation call may fail (a failure is pending or
    /// scheduled).
    pub fn may_fail(&self) -> bool {
        self.fail_next.load(Ordering::Relaxed) > 0
            || self.fail_mask.load(Ordering::Relaxed) != 0
            || self.fail_from.load(Ordering::Relaxed) != u64::MAX
    }

    /// Successful allocations so far.
    pub fn allocs(&self) -> u64 {
        self.allocs.load(Ordering::Relaxed)
    }

    /// Deallocations so far.
    pub fn frees(&self) -> u64 {
        self.frees.load(Ordering::Relaxed)
    }

    /// Allocation calls so far, failed ones included.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Bytes allocated and not freed.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Whether this call (number `call`) must fail; consumes a pending failure.
    fn should_fail(&self, call: u64) -> bool {
        if call >= self.fail_from.load(Ordering::Relaxed) {
            return true;
        }
        if call < 64 && self.fail_mask.load(Ordering::Relaxed) & (1u64 << call) != 0 {
            self.fail_mask.fetch_and(!(1u64 << call), Ordering::Relaxed);
            return true;
        }
        self.fail_next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

// SAFETY: every block handed out comes from `Global.allocate` with the same
// layout and stays a live `Global` block until `deallocate` passes it back to
// `Global`; refusing a request (returning `Err`) is always allowed. Moving
// `&Counting` does not move the blocks.
unsafe impl Allocator for &Counting {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        if self.should_fail(call) {
            return Err(AllocError);
        }
        let block = Global.allocate(layout)?;
        self.allocs.fetch_add(1, Ordering::Relaxed);
        self.outstanding.fetch_add(layout.size(), Ordering::Relaxed);
        Ok(block)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        self.frees.fetch_add(1, Ordering::Relaxed);
        let before = self.outstanding.fetch_sub(layout.size(), Ordering::Relaxed);
        assert!(
            before >= layout.size(),
            "deallocate of {} bytes with only {before} outstanding",
            layout.size()
        );
        // SAFETY: the caller passes a block this allocator handed out with
        // this layout, which `allocate` got from `Global.allocate(layout)`.
        unsafe { Global.deallocate(ptr, layout) }
    }
}
