//! [`SharedArena`]: the same arena behind a `parking_lot::ReentrantMutex`.

use crate::arena::Arena;
use crate::budget::{Budget, Reclaim};
use crate::config::ArenaConfig;
use crate::freemap::SpanId;
use crate::memory::{Budgeted, DefaultMemory, Heap, HostMemory};
use crate::stats::Stats;
use crate::ArenaError;
use allocator_api2::alloc::{AllocError, Allocator, Layout};
use core::fmt;
use core::ops::{Deref, DerefMut};
use core::panic::Location;
use core::ptr::NonNull;
use parking_lot::{ReentrantMutex, ReentrantMutexGuard};
use std::sync::Arc;

/// An [`Arena`] shared by several threads: every call takes one lock.
///
/// Blocks ([`SharedBlock`]) are `Send`: one thread may allocate a block and
/// another free it. For a thread that allocates a lot, prefer an `Arena` of
/// its own (no lock at all).
///
/// # Re-entry
/// The lock is re-entrant: a thread that holds it ([`SharedArena::lock`])
/// may call any method of the same `SharedArena` and drop its
/// [`SharedBlock`]s, and each works as a call on the locked [`Arena`]
/// would, instead of waiting forever for itself. (The lock only ever gives
/// `&Arena`, whose methods may interleave on one thread.) Other threads
/// wait until the holder's last guard is dropped.
///
/// One call is outside this promise: a budget member's
/// [`Reclaim::try_reclaim`] runs in the middle of a committing arena's
/// call, and may call only [`SharedArena::try_stats`] on that arena (the
/// trait's re-entry rule).
pub struct SharedArena<M: HostMemory = DefaultMemory> {
    inner: ReentrantMutex<Arena<M>>,
}

impl SharedArena<DefaultMemory> {
    /// A shared arena on the default memory layer.
    ///
    /// # Panics
    /// If `config` is inconsistent ([`ArenaConfig::validate`]).
    pub fn new(config: ArenaConfig) -> Self {
        Self::from_arena(Arena::new(config))
    }
}

impl SharedArena<Budgeted<DefaultMemory>> {
    /// A shared arena on the default memory layer whose commits are charged
    /// to `budget`, registered with it as a member that gives its cached
    /// memory back (never a live block, never waited for: the lock is only
    /// tried) when another member's commit needs room. See
    /// [`Budget`](crate::Budget).
    ///
    /// # Errors
    /// [`ArenaError::InvalidConfig`] for an inconsistent configuration.
    pub fn with_budget(config: ArenaConfig, budget: &Arc<Budget>) -> Result<Arc<Self>, ArenaError> {
        let shared = Arc::new(Self::from_arena(Arena::with_budget(config, budget)?));
        let member: Arc<dyn Reclaim> = shared.clone();
        budget.register(Arc::downgrade(&member));
        Ok(shared)
    }
}

impl<M: HostMemory + Send> Reclaim for SharedArena<M> {
    fn try_reclaim(&self, idle_only: bool) -> usize {
        match self.inner.try_lock() {
            Some(arena) => arena.try_release_cached(idle_only),
            None => 0,
        }
    }
}

impl<A: Allocator> SharedArena<Heap<A>> {
    /// A shared arena drawing its regions from `alloc`.
    ///
    /// # Panics
    /// If `config` is inconsistent ([`ArenaConfig::validate`]).
    pub fn with_backing(config: ArenaConfig, alloc: A) -> Self {
        Self::from_arena(Arena::with_backing(config, alloc))
    }
}

impl<M: HostMemory> SharedArena<M> {
    /// Wraps an existing arena.
    pub fn from_arena(arena: Arena<M>) -> Self {
        Self {
            inner: ReentrantMutex::new(arena),
        }
    }

    /// Unwraps the arena.
    pub fn into_inner(self) -> Arena<M> {
        self.inner.into_inner()
    }

    /// Locks the arena for a sequence of calls (a run, say). Blocks taken
    /// from the guard borrow it; [`SharedBlock`]s need not. The lock is
    /// re-entrant (see the type's docs): calling this, or any other method,
    /// on a thread that holds it already does not wait.
    ///
    /// The guard gives `&Arena` only, never `&mut Arena`: blocks of other
    /// threads may be live in the arena, so no safe code may replace, move
    /// or swap it while the lock is held.
    ///
    /// ```compile_fail
    /// use tensor_arena::{Arena, ArenaConfig, SharedArena};
    /// let shared = SharedArena::new(ArenaConfig::default());
    /// let block = shared.try_alloc(64).unwrap();
    /// // Would free `block`'s memory while it is live.
    /// *shared.lock() = Arena::new(ArenaConfig::default());
    /// ```
    ///
    /// ```compile_fail
    /// use tensor_arena::{Arena, ArenaConfig, SharedArena};
    /// let shared = SharedArena::new(ArenaConfig::default());
    /// let mut other = Arena::new(ArenaConfig::default());
    /// let block = shared.try_alloc(64).unwrap();
    /// std::mem::swap(&mut *shared.lock(), &mut other);
    /// ```
    pub fn lock(&self) -> SharedArenaGuard<'_, M> {
        SharedArenaGuard {
            guard: self.inner.lock(),
        }
    }

    /// A block of `len` bytes; see [`Arena::try_alloc`].
    ///
    /// # Errors
    /// As [`Arena::try_alloc`].
    #[track_caller]
    pub fn try_alloc(&self, len: usize) -> Result<SharedBlock<'_, M>, ArenaError> {
        self.alloc_inner(len, 1, Location::caller())
    }

    /// A block for `layout`; see [`Arena::try_alloc_layout`].
    ///
    /// # Errors
    /// As [`Arena::try_alloc_layout`].
    #[track_caller]
    pub fn try_alloc_layout(&self, layout: Layout) -> Result<SharedBlock<'_, M>, ArenaError> {
        self.alloc_inner(layout.size(), layout.align(), Location::caller())
    }

    fn alloc_inner(
        &self,
        len: usize,
        align: usize,
        location: &'static Location<'static>,
    ) -> Result<SharedBlock<'_, M>, ArenaError> {
        if len == 0 {
            if !align.is_power_of_two() {
                return Err(ArenaError::InvalidAlignment { align });
            }
            return Ok(SharedBlock {
                shared: self,
                ptr: crate::arena::dangling_for(align.max(self.inner.lock().config().alignment)),
                len: 0,
                at: None,
            });
        }
        let (ptr, span, _) = self.inner.lock().alloc_raw(len, align, location)?;
        Ok(SharedBlock {
            shared: self,
            ptr,
            len,
            at: Some(span),
        })
    }

    /// A snapshot of the counters.
    ///
    /// # Panics
    /// When called from a budget member's [`Reclaim`] while this arena's
    /// own commit asks for room (see the trait's re-entry rule); use
    /// [`SharedArena::try_stats`] there.
    pub fn stats(&self) -> Stats {
        self.inner.lock().stats()
    }

    /// The counters, or `None` when another thread holds the lock or this
    /// thread is in the middle of a call on the arena (a budget member's
    /// [`Reclaim`] during this arena's commit). Never waits, never panics.
    pub fn try_stats(&self) -> Option<Stats> {
        self.inner.try_lock()?.try_stats()
    }

    /// Shrinks to the watermark; see [`Arena::shrink`]. Live blocks (of any
    /// thread) pin their regions.
    pub fn shrink(&self) -> usize {
        self.inner.lock().shrink()
    }

    /// Shrinks towards `bytes`; see [`Arena::shrink_to`].
    pub fn shrink_to(&self, bytes: usize) -> usize {
        self.inner.lock().shrink_to(bytes)
    }

    /// Gives memory decommitted lazily back at once; see
    /// [`Arena::give_back_now`].
    pub fn give_back_now(&self) -> usize {
        self.inner.lock().give_back_now()
    }
}

impl<M: HostMemory> fmt::Debug for SharedArena<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedArena")
            .field("stats", &self.stats())
            .finish()
    }
}

// SAFETY: delegates to the `Arena` implementation under the lock, which
// upholds the contract; the lock adds no way to break it.
unsafe impl<M: HostMemory> Allocator for &SharedArena<M> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let arena = self.inner.lock();
        (&*arena).allocate(layout)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        let arena = self.inner.lock();
        // SAFETY: the caller's obligations for this call are those of
        // `Arena::deallocate`, and the block was allocated by this arena.
        unsafe { (&*arena).deallocate(ptr, layout) }
    }
}

/// The lock on a [`SharedArena`], from [`SharedArena::lock`]: derefs to
/// `&Arena` (not `&mut`), and unlocks when dropped.
pub struct SharedArenaGuard<'a, M: HostMemory = DefaultMemory> {
    guard: ReentrantMutexGuard<'a, Arena<M>>,
}

impl<M: HostMemory> Deref for SharedArenaGuard<'_, M> {
    type Target = Arena<M>;
    fn deref(&self) -> &Arena<M> {
        &self.guard
    }
}

impl<M: HostMemory> fmt::Debug for SharedArenaGuard<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.guard, f)
    }
}

/// A buffer from a [`SharedArena`]; may be sent to and freed on another thread.
pub struct SharedBlock<'a, M: HostMemory = DefaultMemory> {
    shared: &'a SharedArena<M>,
    /// Valid for `len` bytes, initialized, owned by this block alone.
    ptr: NonNull<u8>,
    len: usize,
    /// The span holding it, `None` for an empty block.
    at: Option<SpanId>,
}

// SAFETY: the block owns its bytes exclusively (no other block overlaps
// them), and giving it back goes through the arena's mutex, so moving it to
// another thread or sharing `&SharedBlock` (read-only bytes) is sound when the
// arena itself may be shared.
unsafe impl<M: HostMemory + Send> Send for SharedBlock<'_, M> {}
// SAFETY: `&SharedBlock` only gives `&[u8]`; see `Send`.
unsafe impl<M: HostMemory + Send> Sync for SharedBlock<'_, M> {}

impl<M: HostMemory> SharedBlock<'_, M> {
    /// Bytes requested.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<M: HostMemory> Deref for SharedBlock<'_, M> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialized bytes that no other
        // block overlaps, and the region stays allocated while the span is
        // live (or `len == 0` with a dangling pointer).
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<M: HostMemory> DerefMut for SharedBlock<'_, M> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only access.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<M: HostMemory> Drop for SharedBlock<'_, M> {
    fn drop(&mut self) {
        if let Some(span) = self.at {
            self.shared.inner.lock().release_span(span);
        }
    }
}

impl<M: HostMemory> fmt::Debug for SharedBlock<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBlock")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}
