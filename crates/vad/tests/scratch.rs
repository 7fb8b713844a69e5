//! The forward pass takes and releases exactly the documented tensors.

mod common;

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::rc::Rc;

use common::OwnedWeights;
use tensor_vad::{
    peak_len, total_len, Event, Intermediate, LstmState, Scratch, ScratchTooSmall, SliceScratch,
    ROW, SCHEDULE,
};

type Log = Rc<RefCell<Vec<(Event, usize)>>>;

/// A scratch that logs every take and release, and poisons buffers with NaN
/// so that a kernel reading an element it did not write would show.
struct Recorder {
    log: Log,
}

struct Logged {
    data: Vec<f32>,
    tensor: Intermediate,
    log: Log,
}

impl Deref for Logged {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.data
    }
}

impl DerefMut for Logged {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        self.log
            .borrow_mut()
            .push((Event::Release(self.tensor), self.data.len()));
    }
}

impl Scratch for Recorder {
    type Buf = Logged;
    type Error = std::convert::Infallible;
    fn take(&mut self, tensor: Intermediate, len: usize) -> Result<Logged, Self::Error> {
        self.log.borrow_mut().push((Event::Take(tensor), len));
        Ok(Logged {
            data: vec![f32::NAN; len],
            tensor,
            log: self.log.clone(),
        })
    }
}

fn input(l: usize) -> Vec<f32> {
    (0..l * ROW)
        .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

#[test]
fn forward_follows_the_schedule_with_documented_sizes() {
    let weights = OwnedWeights::load();
    let model = weights.model();
    for l in [1, 2, 5, 33] {
        let log: Log = Rc::default();
        let mut probs = vec![f32::NAN; l];
        model
            .forward(
                &input(l),
                &mut LstmState::default(),
                &mut probs,
                &mut Recorder { log: log.clone() },
            )
            .unwrap();
        assert!(probs.iter().all(|p| (0.0..=1.0).contains(p)), "{probs:?}");
        let log = log.borrow();
        let events: Vec<Event> = log.iter().map(|e| e.0).collect();
        assert_eq!(events, SCHEDULE, "L = {l}");
        for &(e, len) in log.iter() {
            let (Event::Take(t) | Event::Release(t)) = e;
            assert_eq!(len, t.len(l), "{t:?} at L = {l}");
            assert_eq!(t.shape(l).iter().product::<usize>(), len);
        }
        // Every tensor once, so the sum is total_len.
        assert_eq!(
            log.iter()
                .filter(|e| matches!(e.0, Event::Take(_)))
                .map(|e| e.1)
                .sum::<usize>(),
            total_len(l)
        );
    }
}

#[test]
fn sizes_are_linear_in_l() {
    // Per window: 832 + 1032 + 516 + 1548 + 512 + 768 + 128 + 192 + 64 + 192 + 128 + 512 + 128.
    assert_eq!(total_len(1), 6552);
    assert_eq!(total_len(10), 65520);
    // Peak: Cols0 + Enc0 + Magnitude live together.
    assert_eq!(peak_len(1), 516 + 1548 + 512);
    assert_eq!(peak_len(7), 7 * peak_len(1));
    assert_eq!(Intermediate::Stft.shape(3), vec![3, 258, 4]);
    assert_eq!(Intermediate::Cols0.shape(3), vec![12, 387]);
    assert_eq!(Intermediate::Enc3.shape(3), vec![3, 128, 1]);
}

#[test]
fn im2col_scratch_is_one_tile_for_long_inputs() {
    // Up to 40 output frames per convolution, the im2col scratch is the
    // whole lowered input; beyond, one tile of 40 frames.
    assert_eq!(Intermediate::Cols0.shape(10), vec![40, 387]);
    assert_eq!(Intermediate::Cols0.shape(1875), vec![40, 387]);
    assert_eq!(Intermediate::Cols1.shape(1875), vec![40, 384]);
    assert_eq!(Intermediate::Cols3.shape(39), vec![39, 192]);
    assert_eq!(Intermediate::Cols3.shape(41), vec![40, 192]);
    for t in Intermediate::ALL {
        assert_eq!(t.shape(1875).iter().product::<usize>(), t.len(1875));
    }
    // The peak moves to the STFT (padded rows + its output): 1864 floats
    // per window, 7456 bytes, against 9804 for ONNX Runtime's intermediate
    // tensors (traces/REFERENCE.md).
    for l in [31, 313, 938, 1875] {
        assert_eq!(peak_len(l), l * (832 + 1032), "L = {l}");
    }
    assert_eq!(peak_len(5), 5 * (516 + 512) + 20 * 387);
}

#[test]
fn slice_scratch_reports_running_out() {
    let weights = OwnedWeights::load();
    let model = weights.model();
    let mut buf = vec![0.0; total_len(2) - 1];
    let err = model
        .forward(
            &input(2),
            &mut LstmState::default(),
            &mut [0.0; 2],
            &mut SliceScratch::new(&mut buf),
        )
        .unwrap_err();
    assert_eq!(
        err,
        ScratchTooSmall {
            tensor: Intermediate::Lstm,
            needed: 256,
            available: 255
        }
    );
    assert!(err.to_string().contains("Relu_4"));
}

#[test]
fn zero_windows_is_a_no_op() {
    let weights = OwnedWeights::load();
    let mut state = LstmState::default();
    state.h[0] = 1.0;
    let before = state.clone();
    let mut buf: [f32; 0] = [];
    weights
        .model()
        .forward(&[], &mut state, &mut [], &mut SliceScratch::new(&mut buf))
        .unwrap();
    assert_eq!(state, before);
}
