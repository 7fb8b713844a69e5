//! The strategies the arena is compared with: a general-purpose allocator
//! called once per tensor (`std::alloc::System`, `mimalloc::MiMalloc`,
//! `tikv_jemallocator::Jemalloc`, used explicitly through [`GlobalAlloc`],
//! not installed as the global allocator), `bumpalo::Bump` reset after
//! each run, and two constant-time allocators over one pool mapped for the
//! workload (`rlsf`'s TLSF and `talc`, [`PoolAlloc`]).
//!
//! Calling a [`GlobalAlloc`] and writing to the raw memory it returns needs
//! `unsafe`; this module is the only place in the CLI (with `os.rs`'s two C
//! calls) that has any (here also the pools' `mmap` and `munmap`). Each backend owns the pointers it hands out, so its
//! safe interface cannot free a pointer twice or into the wrong allocator.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::RefCell;
use std::ptr::NonNull;

use bumpalo::Bump;

use crate::os::Rss;
use crate::replay::{page_offsets, Backend, EndOfRun, Touch, ALIGN};

/// Writes the `len` bytes at `ptr` as `touch` says.
///
/// # Safety
/// - `ptr` is valid for writes of `len` bytes.
unsafe fn touch_raw(ptr: NonNull<u8>, len: usize, touch: Touch) {
    match touch {
        Touch::None => {}
        Touch::Pages => {
            for off in page_offsets(ptr.as_ptr() as usize, len) {
                // SAFETY: `off < len` (page_offsets yields offsets inside the
                // buffer) and the caller guarantees `ptr..ptr+len` writable.
                unsafe { ptr.as_ptr().add(off).write(1) };
            }
        }
        // SAFETY: the caller guarantees `ptr..ptr+len` is writable.
        Touch::Full => unsafe { ptr.as_ptr().write_bytes(0xA5, len) },
    }
    // The writes must happen even though nothing reads them before the
    // buffer is freed (compilers remove stores followed by `free`).
    std::hint::black_box(ptr);
}

/// The layout every baseline allocation uses: `bytes` at [`ALIGN`].
fn layout_for(bytes: usize) -> Result<Layout, String> {
    Layout::from_size_align(bytes.max(1), ALIGN)
        .map_err(|_| format!("cannot allocate {bytes} bytes: size overflows a layout"))
}

/// A buffer from a [`GlobalAlloc`]: the pointer and the layout it was
/// allocated with.
#[derive(Debug)]
struct RawBuf {
    /// Returned by `alloc(layout)` of the owning backend's allocator, not yet
    /// deallocated.
    ptr: NonNull<u8>,
    layout: Layout,
}

/// One allocation per tensor from a [`GlobalAlloc`], freed when the tensor
/// dies. `reserved` is the growth of the process's resident memory since the
/// backend was made, since these allocators do not say what they hold.
#[derive(Debug)]
pub struct GlobalAllocBackend<G: GlobalAlloc> {
    alloc: G,
    /// Live buffers by id; every `Some` was allocated by `alloc`.
    bufs: Vec<Option<RawBuf>>,
    /// alloc + dealloc calls made so far.
    calls: u64,
    /// `calls` when the run began.
    calls_at_run_start: u64,
    /// Bytes requested by live buffers.
    in_use: u64,
    /// Highest `in_use` in the current run.
    peak: u64,
    rss: Rss,
    /// Resident bytes when the backend was made.
    rss_start: Option<u64>,
}

impl<G: GlobalAlloc> GlobalAllocBackend<G> {
    /// A backend calling `alloc`, with room for runs of up to `max_ids`
    /// buffers; the resident memory is measured from now.
    pub fn new(alloc: G, max_ids: usize) -> Self {
        let rss = Rss::new();
        let rss_start = rss.bytes();
        Self {
            alloc,
            bufs: Vec::with_capacity(max_ids),
            calls: 0,
            calls_at_run_start: 0,
            in_use: 0,
            peak: 0,
            rss,
            rss_start,
        }
    }

    /// Returns `buf` to the allocator.
    fn release(&mut self, buf: RawBuf) {
        self.calls += 1;
        self.in_use -= buf.layout.size() as u64;
        // SAFETY: `buf.ptr` came from `self.alloc.alloc(buf.layout)` (only
        // `alloc` below creates a `RawBuf`, and it is private to this
        // backend) and is deallocated once: `buf` was taken out of `bufs`.
        unsafe { self.alloc.dealloc(buf.ptr.as_ptr(), buf.layout) };
    }
}

impl<G: GlobalAlloc> Backend for GlobalAllocBackend<G> {
    fn begin_run(&mut self, ids: usize) {
        debug_assert!(self.bufs.iter().all(Option::is_none));
        self.bufs.clear();
        self.bufs.resize_with(ids, || None);
        self.calls_at_run_start = self.calls;
        self.peak = self.in_use;
    }

    fn alloc(&mut self, id: usize, bytes: usize, touch: Touch) -> Result<(), String> {
        let layout = layout_for(bytes)?;
        self.calls += 1;
        // SAFETY: `layout` has a non-zero size (`layout_for` asks for at
        // least one byte).
        let ptr = unsafe { self.alloc.alloc(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| format!("the allocator refused {bytes} bytes (out of memory)"))?;
        // SAFETY: `ptr` was just allocated for `layout.size() >= bytes` bytes.
        unsafe { touch_raw(ptr, bytes, touch) };
        let old = self.bufs[id].replace(RawBuf { ptr, layout });
        debug_assert!(old.is_none(), "id {id} allocated twice");
        if let Some(old) = old {
            self.release(old);
        }
        self.in_use += layout.size() as u64;
        self.peak = self.peak.max(self.in_use);
        Ok(())
    }

    fn free(&mut self, id: usize) {
        if let Some(buf) = self.bufs[id].take() {
            self.release(buf);
        }
    }

    fn abort_run(&mut self) {
        for id in 0..self.bufs.len() {
            self.free(id);
        }
    }

    fn end_run(&mut self, _smaller: bool) -> EndOfRun {
        EndOfRun {
            peak_in_use: self.peak,
            reserved: self.reserved(),
            backing_calls: Some(self.calls - self.calls_at_run_start),
            ..EndOfRun::default()
        }
    }

    fn in_use(&self) -> u64 {
        self.in_use
    }

    fn reserved(&self) -> Option<u64> {
        Some(self.rss.bytes()?.saturating_sub(self.rss_start?))
    }
}

impl<G: GlobalAlloc> Drop for GlobalAllocBackend<G> {
    fn drop(&mut self) {
        self.abort_run();
    }
}

/// `bumpalo::Bump`: every tensor bumped, nothing reused within a run, the
/// whole bump reset after the run (which keeps its last, largest chunk).
/// `reserved` is `allocated_bytes()`; backing calls are chunks allocated
/// and freed.
#[derive(Debug)]
pub struct BumpBackend {
    bump: Bump,
    /// Bytes bumped since the last reset.
    in_use: u64,
    /// Chunks held when the run began.
    chunks_at_run_start: u64,
}

impl BumpBackend {
    /// An empty bump (no chunk yet).
    pub fn new() -> Self {
        Self {
            bump: Bump::new(),
            in_use: 0,
            chunks_at_run_start: 0,
        }
    }

    /// Chunks the bump holds.
    fn chunks(&mut self) -> u64 {
        self.bump.iter_allocated_chunks().count() as u64
    }
}

impl Backend for BumpBackend {
    fn begin_run(&mut self, _ids: usize) {
        self.chunks_at_run_start = self.chunks();
        self.in_use = 0;
    }

    fn alloc(&mut self, _id: usize, bytes: usize, touch: Touch) -> Result<(), String> {
        let layout = layout_for(bytes)?;
        let ptr = self
            .bump
            .try_alloc_layout(layout)
            .map_err(|_| format!("bumpalo refused {bytes} bytes (out of memory)"))?;
        // SAFETY: `ptr` is a fresh bump allocation of `layout.size() >= bytes`
        // bytes, valid until the next reset, which needs `&mut self.bump`.
        unsafe { touch_raw(ptr, bytes, touch) };
        self.in_use += layout.size() as u64;
        Ok(())
    }

    fn free(&mut self, _id: usize) {}

    fn abort_run(&mut self) {}

    fn end_run(&mut self, _smaller: bool) -> EndOfRun {
        let peak = self.in_use;
        let chunks = self.chunks();
        self.bump.reset();
        self.in_use = 0;
        let kept = self.chunks();
        let allocated = chunks.saturating_sub(self.chunks_at_run_start);
        let freed = chunks.saturating_sub(kept);
        EndOfRun {
            peak_in_use: peak,
            reserved: Some(self.bump.allocated_bytes() as u64),
            backing_calls: Some(allocated + freed),
            ..EndOfRun::default()
        }
    }

    fn in_use(&self) -> u64 {
        self.in_use
    }

    fn reserved(&self) -> Option<u64> {
        Some(self.bump.allocated_bytes() as u64)
    }
}

/// An anonymous private mapping of `len` bytes (rounded up to a page),
/// reserved with `MAP_NORESERVE` and untouched when made, so that its pages
/// fault in as they are written, as an arena's do; unmapped on drop.
#[derive(Debug)]
struct MapPool {
    /// Start of the mapping: valid for reads and writes of `len` bytes
    /// until drop.
    ptr: NonNull<u8>,
    len: usize,
}

impl MapPool {
    fn new(len: usize) -> Result<Self, String> {
        let len = len.max(1).next_multiple_of(1 << 12);
        // SAFETY: a fresh anonymous mapping at an address of the kernel's
        // choosing aliases nothing; the arguments are valid.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!("cannot map a pool of {len} bytes"));
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or("mmap returned null")?;
        Ok(Self { ptr, len })
    }
}

impl Drop for MapPool {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once (here); the heap
        // over it is dropped first (field order of `PoolAlloc`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A general allocator over one caller-given pool: rlsf's TLSF or talc.
pub trait PoolHeap {
    /// A heap over `pool` (valid, unused by anything else, for `len` bytes).
    ///
    /// # Safety
    /// `pool..pool+len` must be valid for reads and writes, used by nothing
    /// else, and outlive the heap.
    unsafe fn over(pool: NonNull<u8>, len: usize) -> Self;
    /// Allocates `layout` (non-zero size), or `None`.
    fn alloc(&mut self, layout: Layout) -> Option<NonNull<u8>>;
    /// Frees `ptr`.
    ///
    /// # Safety
    /// `ptr` comes from `alloc(layout)` of this heap and is not freed yet.
    unsafe fn free(&mut self, ptr: NonNull<u8>, layout: Layout);
}

/// rlsf's TLSF: blocks up to `32 << 28` bytes (8 GiB), 32 second-level
/// classes per power of two.
pub type Tlsf = rlsf::Tlsf<'static, u32, u32, 28, 32>;

impl PoolHeap for Tlsf {
    unsafe fn over(pool: NonNull<u8>, len: usize) -> Self {
        let mut tlsf = Tlsf::new();
        // SAFETY: the caller guarantees the pool is valid, unshared and
        // outlives the heap.
        unsafe { tlsf.insert_free_block_ptr(NonNull::slice_from_raw_parts(pool, len)) };
        tlsf
    }

    fn alloc(&mut self, layout: Layout) -> Option<NonNull<u8>> {
        self.allocate(layout)
    }

    unsafe fn free(&mut self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller's obligations are `deallocate`'s.
        unsafe { self.deallocate(ptr, layout.align()) };
    }
}

/// talc with no source behind it: the pool is claimed whole.
pub type Talc = talc::base::Talc<talc::source::Manual, talc::DefaultBinning>;

impl PoolHeap for Talc {
    unsafe fn over(pool: NonNull<u8>, len: usize) -> Self {
        let mut talc = Talc::new(talc::source::Manual);
        // SAFETY: the caller guarantees the pool is valid, unshared and
        // outlives the heap; `Manual` allows manual heap management.
        unsafe { talc.claim(pool.as_ptr(), len) };
        talc
    }

    fn alloc(&mut self, layout: Layout) -> Option<NonNull<u8>> {
        // SAFETY: `layout_for` sizes every request at one byte or more.
        unsafe { self.allocate(layout) }
    }

    unsafe fn free(&mut self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller's obligations are `deallocate`'s.
        unsafe { self.deallocate(ptr.as_ptr(), layout) };
    }
}

/// A [`PoolHeap`] over its own [`MapPool`], as a [`GlobalAlloc`] (one
/// thread: the heap sits in a `RefCell`), so that [`GlobalAllocBackend`]
/// does the bookkeeping.
#[derive(Debug)]
pub struct PoolAlloc<H> {
    /// Declared before `pool`, so dropped before the memory it manages.
    heap: RefCell<H>,
    /// Held for its drop (the unmapping) only.
    _pool: MapPool,
}

impl<H: PoolHeap> PoolAlloc<H> {
    /// A heap over a fresh pool of `len` bytes.
    ///
    /// # Errors
    /// A message when the pool cannot be mapped.
    pub fn new(len: usize) -> Result<Self, String> {
        let pool = MapPool::new(len)?;
        // SAFETY: the mapping is valid for `pool.len` bytes, used by nothing
        // else, and outlives the heap (dropped after it, field order).
        let heap = unsafe { H::over(pool.ptr, pool.len) };
        Ok(Self {
            heap: RefCell::new(heap),
            _pool: pool,
        })
    }
}

// SAFETY: `alloc` returns memory from the pool that the heap hands out once
// until freed (or null); `dealloc` receives only pointers `alloc` returned
// with their layout (GlobalAlloc's contract). The `RefCell` makes a
// reentrant or shared use panic instead of corrupting the heap; the type is
// not `Sync`, so it is only ever used from one thread.
unsafe impl<H: PoolHeap> GlobalAlloc for PoolAlloc<H> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.heap
            .borrow_mut()
            .alloc(layout)
            .map_or(std::ptr::null_mut(), NonNull::as_ptr)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(ptr) = NonNull::new(ptr) {
            // SAFETY: GlobalAlloc's caller passes a pointer from `alloc`
            // with its layout, freed once.
            unsafe { self.heap.borrow_mut().free(ptr, layout) };
        }
    }
}

/// The pool for a workload whose largest run allocates `naive` bytes in
/// all over `ids` buffers: room for the run with nothing reused (address
/// space only; pages fault in as written).
pub fn pool_len(naive: usize, ids: usize) -> usize {
    naive
        .saturating_add(ids.saturating_mul(2 * ALIGN))
        .saturating_add(64 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_counts_calls_and_frees_everything() {
        let mut b = GlobalAllocBackend::new(std::alloc::System, 4);
        b.begin_run(3);
        b.alloc(0, 100, Touch::Full).unwrap();
        b.alloc(1, 10_000, Touch::Pages).unwrap();
        b.free(0);
        b.alloc(2, 5, Touch::None).unwrap();
        b.abort_run();
        let end = b.end_run(false);
        assert_eq!(end.backing_calls, Some(6));
        assert_eq!(end.peak_in_use, 100 + 10_000);
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn pool_heaps_serve_and_free_everything() {
        let mut t =
            GlobalAllocBackend::new(PoolAlloc::<Tlsf>::new(pool_len(20_000, 4)).unwrap(), 4);
        let mut c =
            GlobalAllocBackend::new(PoolAlloc::<Talc>::new(pool_len(20_000, 4)).unwrap(), 4);
        for b in [&mut t as &mut dyn Backend, &mut c] {
            b.begin_run(3);
            b.alloc(0, 100, Touch::Full).unwrap();
            b.alloc(1, 10_000, Touch::Pages).unwrap();
            b.free(0);
            b.alloc(2, 5, Touch::Full).unwrap();
            b.abort_run();
            assert_eq!(b.end_run(false).backing_calls, Some(6));
            assert_eq!(b.in_use(), 0);
        }
    }

    #[test]
    fn bump_resets_and_counts_chunks() {
        let mut b = BumpBackend::new();
        b.begin_run(2);
        b.alloc(0, 1 << 20, Touch::Pages).unwrap();
        b.alloc(1, 4 << 20, Touch::Pages).unwrap();
        let end = b.end_run(false);
        assert!(end.peak_in_use >= 5 << 20);
        // Two chunks drawn, one freed at the reset.
        assert_eq!(end.backing_calls, Some(3));
        assert!(end.reserved.unwrap() >= 4 << 20);
        b.begin_run(1);
        b.alloc(0, 1 << 20, Touch::Pages).unwrap();
        assert_eq!(b.end_run(false).backing_calls, Some(0));
    }
}
