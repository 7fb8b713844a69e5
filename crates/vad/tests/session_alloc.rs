//! Heap allocations of a steady-state session run (a key seen before): the
//! client (weights lookup, kernels, the 13 intermediate tensors) makes none;
//! what the arena itself allocates while handing tensors out and taking them
//! back (its run recording: at this writing none for a planned run, 7 per
//! run with plans disabled) is counted apart and only printed.

mod common;
mod counting;

use counting::allocations;
use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use tensor_arena::{ArenaError, TypedBlock};
use tensor_session::{LoadMode, MmapAck, RunContext, Session, SessionConfig};
use tensor_vad::{
    key, load_weights, Detector, Intermediate, LstmState, Model, Scratch, CONTEXT, WINDOW,
};

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

/// The run's context as a scratch, counting the heap allocations the
/// arena makes while it hands out or takes back a tensor.
struct Counted<'c, 'r> {
    ctx: &'c RunContext<'r>,
    arena: &'c Cell<usize>,
}

/// A tensor of [`Counted`]: counts what its free allocates.
struct CountedBuf<'c, 'r> {
    buf: Option<TypedBlock<'r, f32>>,
    arena: &'c Cell<usize>,
}

impl Deref for CountedBuf<'_, '_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        self.buf.as_deref().unwrap()
    }
}

impl DerefMut for CountedBuf<'_, '_> {
    fn deref_mut(&mut self) -> &mut [f32] {
        self.buf.as_deref_mut().unwrap()
    }
}

impl Drop for CountedBuf<'_, '_> {
    fn drop(&mut self) {
        let before = allocations();
        drop(self.buf.take());
        self.arena.set(self.arena.get() + allocations() - before);
    }
}

impl<'c, 'r> Scratch for Counted<'c, 'r> {
    type Buf = CountedBuf<'c, 'r>;
    type Error = ArenaError;
    fn take(&mut self, tensor: Intermediate, len: usize) -> Result<Self::Buf, ArenaError> {
        let before = allocations();
        let buf = self.ctx.take(tensor, len);
        self.arena.set(self.arena.get() + allocations() - before);
        Ok(CountedBuf {
            buf: Some(buf?),
            arena: self.arena,
        })
    }
}

#[test]
fn steady_state_runs_allocate_no_tensor_on_the_heap() {
    // SAFETY: the committed model file is only read, never written, by the test suite.
    let mmap = LoadMode::Mmap(unsafe { MmapAck::new() });
    let weights = load_weights(common::data_path("silero_vad_16k_v6.safetensors"), mmap).unwrap();
    let audio = &tensor_vad::wav::read(common::data_path("speech.wav"))
        .unwrap()
        .samples[..8 * WINDOW];
    for plans in [true, false] {
        let mut config = SessionConfig::default();
        config.plans.enabled = plans;
        let mut s = Session::new(Arc::new(weights.clone()), config);
        let mut det = Detector::new();
        let mut probs = [0.0f32; 8];
        for _ in 0..3 {
            det.process(&mut s, audio, &mut probs).unwrap();
        }

        // Inside the run: the model, its 13 intermediate tensors, the
        // kernels. Heap allocations made by the arena while handing out a
        // tensor (its run recording) are counted apart.
        let (mut state, mut context) = (LstmState::default(), [0.0; CONTEXT]);
        let (client, arena) = s.run(&key(8), |ctx| {
            let arena = Cell::new(0);
            let scratch = Counted { ctx, arena: &arena };
            let before = allocations();
            let model = Model::from_weights(ctx.weights()).unwrap();
            model
                .forward_samples(audio, &mut context, &mut state, &mut probs, scratch)
                .unwrap();
            let all = allocations() - before;
            (all - arena.get(), arena.get())
        });
        println!(
            "plans {plans}: one steady-state run: {client} heap allocations by the client, \
             {arena} by the arena's tensor allocs and frees"
        );
        assert_eq!(client, 0, "plans {plans}: the inference path allocated");
        assert_eq!(s.stats().arena.in_use, 0);

        // The whole call, session bookkeeping included.
        let before = allocations();
        let runs = 10;
        for _ in 0..runs {
            det.process(&mut s, audio, &mut probs).unwrap();
        }
        let per_run = (allocations() - before) as f64 / runs as f64;
        println!("plans {plans}: {per_run} heap allocations per steady-state Detector::process");
        assert!(
            per_run < Intermediate::ALL.len() as f64,
            "a heap allocation per tensor?"
        );
    }
}
