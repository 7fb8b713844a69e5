//! With a `SliceScratch`, a forward pass (whole-file and streaming) makes no
//! heap allocation at all.

mod common;
mod counting;

use counting::allocations;

use tensor_vad::{frame_rows, total_len, LstmState, SliceScratch, Stream, CONTEXT, ROW, WINDOW};

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

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
