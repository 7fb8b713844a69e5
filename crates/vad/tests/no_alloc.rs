//! With a `SliceScratch`, a forward pass (whole-file and streaming) makes no
//! heap allocation at all.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tensor_vad::{frame_rows, total_len, LstmState, SliceScratch, Stream, CONTEXT, ROW, WINDOW};

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, counting allocations made by the current thread.
struct Counting;

// SAFETY: every call is forwarded unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counter is a const-initialised thread-local
// `Cell`, whose access never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(|c| c.get())
}

#[test]
fn forward_does_not_allocate() {
    let weights = common::OwnedWeights::load();
    let model = weights.model();
    let audio = common::speech();
    let l = 40;
    let audio = &audio[..l * WINDOW];
    let mut rows = vec![0.0; l * ROW];
    let mut probs = vec![0.0; l];
    let mut buf = vec![0.0; total_len(l)];
    let mut buf1 = vec![0.0; total_len(1)];
    let mut stream = Stream::new();
    let mut streamed = vec![0.0; l];

    let before = allocations();
    frame_rows(audio, &mut [0.0; CONTEXT], &mut rows);
    let mut state = LstmState::default();
    model
        .forward(
            &rows,
            &mut state,
            &mut probs,
            &mut SliceScratch::new(&mut buf),
        )
        .unwrap();
    for (w, p) in audio.chunks_exact(WINDOW).zip(&mut streamed) {
        *p = stream
            .process(&model, w, &mut SliceScratch::new(&mut buf1))
            .unwrap();
    }
    let made = allocations() - before;

    assert_eq!(made, 0, "the forward pass allocated {made} times");
    assert!(common::max_abs_diff(&probs, &streamed) < 1e-5);

    // The counter works: a HeapScratch allocates one Vec per tensor.
    let before = allocations();
    model
        .forward(&rows, &mut state, &mut probs, &mut tensor_vad::HeapScratch)
        .unwrap();
    assert_eq!(allocations() - before, tensor_vad::Intermediate::ALL.len());
}
