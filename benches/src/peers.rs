//! The constant-time general allocators the arena's hot path is measured
//! against: `rlsf` (TLSF) and `talc`, each over one pool of its own.
//!
//! A pool is an anonymous private mapping, reserved with `MAP_NORESERVE`
//! and not touched here: its pages fault in as the allocator and the
//! benchmark write them, as an arena's do, so page faults count fairly.

use core::alloc::Layout;
use core::ptr::NonNull;

/// A heap over one pool: [`TlsfHeap`] and [`TalcHeap`] alike.
pub trait PoolHeap: Send {
    /// Allocates `layout`, or `None` when the pool is exhausted.
    fn alloc(&mut self, layout: Layout) -> Option<NonNull<u8>>;

    /// Frees `ptr`.
    ///
    /// # Safety
    /// `ptr` must come from [`alloc`](Self::alloc) of this heap with
    /// `layout`, and not be freed yet.
    unsafe fn free(&mut self, ptr: NonNull<u8>, layout: Layout);
}

/// Bytes of the pool of the hot-path pairs (one block live at a time, up
/// to 50 MiB).
pub const PAIRS_POOL: usize = 128 << 20;

/// An anonymous private mapping of `len` bytes, untouched when made;
/// unmapped on drop.
pub struct MapPool {
    /// Start of the mapping; valid for reads and writes of `len` bytes
    /// until drop, page-aligned.
    ptr: NonNull<u8>,
    len: usize,
}

impl MapPool {
    /// Maps `len` bytes (rounded up to a page).
    ///
    /// # Panics
    /// If `len` is zero or the mapping fails.
    pub fn new(len: usize) -> Self {
        assert!(len > 0, "an empty pool");
        let len = len.next_multiple_of(crate::PAGE);
        // SAFETY: a fresh anonymous mapping at an address of the kernel's
        // choosing aliases nothing; the arguments are valid.
        let ptr = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert!(ptr != libc::MAP_FAILED, "mmap of {len} bytes failed");
        let ptr = NonNull::new(ptr.cast::<u8>()).expect("mmap never returns null on success");
        Self { ptr, len }
    }

    /// The whole mapping.
    fn as_slice_ptr(&self) -> NonNull<[u8]> {
        NonNull::slice_from_raw_parts(self.ptr, self.len)
    }
}

impl Drop for MapPool {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is the mapping made in `new`, unmapped once
        // (here); whoever allocated from it is dropped before it (field
        // order of the heaps below).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the pool owns its mapping exclusively, like a `Box<[u8]>`.
unsafe impl Send for MapPool {}

/// The TLSF configuration: blocks up to `32 << 28` bytes (8 GiB), 32
/// second-level classes per power of two.
type RawTlsf = rlsf::Tlsf<'static, u32, u32, 28, 32>;

/// `rlsf`'s TLSF over one [`MapPool`].
pub struct TlsfHeap {
    /// Declared before `pool`, so dropped before the memory it manages.
    tlsf: RawTlsf,
    pool: MapPool,
}

impl TlsfHeap {
    /// A TLSF heap over a fresh pool of `len` bytes.
    pub fn new(len: usize) -> Self {
        let pool = MapPool::new(len);
        let mut tlsf = RawTlsf::new();
        // SAFETY: the pool's memory is valid, used by nothing else, and
        // outlives `tlsf` (both live in the returned value, `tlsf` dropped
        // first).
        unsafe { tlsf.insert_free_block_ptr(pool.as_slice_ptr()) };
        Self { tlsf, pool }
    }

    /// Bytes of the pool.
    pub fn pool_len(&self) -> usize {
        self.pool.len
    }
}

impl PoolHeap for TlsfHeap {
    #[inline]
    fn alloc(&mut self, layout: Layout) -> Option<NonNull<u8>> {
        self.tlsf.allocate(layout)
    }

    #[inline]
    unsafe fn free(&mut self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller's obligations are `deallocate`'s.
        unsafe { self.tlsf.deallocate(ptr, layout.align()) };
    }
}

/// `talc` over one [`MapPool`] (claimed whole; no source behind it).
pub struct TalcHeap {
    /// Declared before `pool`, so dropped before the memory it manages.
    talc: talc::base::Talc<talc::source::Manual, talc::DefaultBinning>,
    pool: MapPool,
}

impl TalcHeap {
    /// A talc heap over a fresh pool of `len` bytes.
    ///
    /// # Panics
    /// If talc cannot claim the pool (it is too small for its metadata).
    pub fn new(len: usize) -> Self {
        let pool = MapPool::new(len);
        let mut talc = talc::base::Talc::new(talc::source::Manual);
        // SAFETY: the pool's memory is valid, used by nothing else, and
        // outlives `talc` (both live in the returned value, `talc` dropped
        // first); `Manual` allows manual heap management.
        let claimed = unsafe { talc.claim(pool.ptr.as_ptr(), pool.len) };
        assert!(claimed.is_some(), "talc could not claim the pool");
        Self { talc, pool }
    }

    /// Bytes of the pool.
    pub fn pool_len(&self) -> usize {
        self.pool.len
    }
}

impl PoolHeap for TalcHeap {
    /// Allocates `layout` (of non-zero size: talc needs one; panics on a
    /// zero size), or `None` when the pool is exhausted.
    #[inline]
    fn alloc(&mut self, layout: Layout) -> Option<NonNull<u8>> {
        assert!(layout.size() > 0, "talc needs a non-zero size");
        // SAFETY: the size is non-zero (checked above).
        unsafe { self.talc.allocate(layout) }
    }

    #[inline]
    unsafe fn free(&mut self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller's obligations are `deallocate`'s.
        unsafe { self.talc.deallocate(ptr.as_ptr(), layout) };
    }
}

// SAFETY: a `TlsfHeap` owns its pool and the TLSF state over it exclusively;
// no pointer into it is shared with another value, so moving the whole to
// another thread is sound.
unsafe impl Send for TlsfHeap {}
// SAFETY: as for `TlsfHeap`: talc's state and its pool move together.
unsafe impl Send for TalcHeap {}

/// A pool size for replaying runs whose largest naive footprint (nothing
/// reused) is `naive` bytes: enough for any placement, since address space
/// is only reserved.
pub fn replay_pool_len(naive: usize) -> usize {
    naive.saturating_add(64 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heaps_allocate_and_free() {
        let layout = Layout::from_size_align(50 << 20, 64).unwrap();
        let mut t = TlsfHeap::new(PAIRS_POOL);
        let mut c = TalcHeap::new(PAIRS_POOL);
        for _ in 0..3 {
            let p = t.alloc(layout).unwrap();
            assert_eq!(p.as_ptr() as usize % 64, 0);
            // SAFETY: allocated just above with `layout`, freed once.
            unsafe { t.free(p, layout) };
            let p = c.alloc(layout).unwrap();
            assert_eq!(p.as_ptr() as usize % 64, 0);
            // SAFETY: as above.
            unsafe { c.free(p, layout) };
        }
        assert!(t.pool_len() >= PAIRS_POOL && c.pool_len() >= PAIRS_POOL);
    }
}
