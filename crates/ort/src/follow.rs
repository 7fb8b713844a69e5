//! When a worker gives cached memory back: each model's need follows its
//! input down, and the worker holds the largest model's need.

use std::collections::VecDeque;

/// When a [`Worker`](crate::Worker) gives cached memory back, at the end of
/// a run.
///
/// A model's *need* for a run is its plan's block (or, unplanned, the run's
/// high water). The worker keeps, for every model it runs, the needs of
/// that model's last runs, and after each run shrinks its arena to the
/// largest of them over all models. So a model's memory follows its input
/// down while the other models of a pipeline keep theirs: a worker running
/// an OCR pipeline's det, cls and rec holds the largest of the three, and
/// after a small image det's share comes down. The next larger run commits
/// again, in place (huge pages where the system gives them), and pays for
/// the kernel zeroing the pages it gets back: about 0.2-0.3 ms per 2 MiB
/// measured (`BENCHMARKS.md`, issue 20), 1-4% of PP-OCR rec's large run
/// and up to a third of a 1280x1280 PP-OCR det run when sizes strictly
/// alternate. Where that latency matters, give memory back lazily
/// ([`WorkerOptions::pages`](crate::WorkerOptions::pages) with
/// [`GiveBack::Lazily`](crate::GiveBack::Lazily)): the large run then
/// costs what it costs on held memory while the kernel has not needed the
/// pages, which stay in the process's RSS (as `LazyFree`) until it does.
/// Or hold more runs (`FollowInput { runs: 2 }` or more) or
/// [`Shrink::KeepLargest`].
///
/// A model that has not run in the worker's last 64 runs is forgotten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shrink {
    /// Hold the largest of each model's last `runs` needs (at least 1).
    /// With 1 (the default), memory comes down after a single smaller run;
    /// with `n`, after `n` smaller runs in a row, so inputs that alternate
    /// within `n` runs keep their memory.
    FollowInput {
        /// Runs of a model remembered.
        runs: u32,
    },
    /// Hold the largest need each model ever had (the behaviour before
    /// memory followed the input): a repeated large input never commits
    /// again, and a one-off large input holds its memory for good.
    KeepLargest,
    /// Give nothing back after runs (only the arena's own
    /// `shrink_policy`, and [`Worker::shrink`](crate::Worker::shrink)).
    Never,
}

impl Default for Shrink {
    /// [`Shrink::FollowInput`] after 1 run: chosen from the measurements
    /// in `BENCHMARKS.md` (issue 20).
    fn default() -> Self {
        Shrink::FollowInput { runs: 1 }
    }
}

/// Runs after which a model that has not run is forgotten.
const FORGET_AFTER: u64 = 64;

struct Model {
    id: u64,
    /// The last needs (FollowInput), or the largest (KeepLargest: one).
    needs: VecDeque<usize>,
    last_run: u64,
}

/// The policy's state.
pub(crate) struct Follow {
    policy: Shrink,
    models: Vec<Model>,
    runs: u64,
}

impl Follow {
    pub(crate) fn new(policy: Shrink) -> Self {
        Self {
            policy,
            models: Vec::new(),
            runs: 0,
        }
    }

    /// Notes a successful run of `model` that needed `need` bytes; returns
    /// the bytes to hold now (`None`: give nothing back).
    pub(crate) fn after_run(&mut self, model: u64, need: usize) -> Option<usize> {
        self.runs += 1;
        let keep = match self.policy {
            Shrink::Never => return None,
            Shrink::FollowInput { runs } => runs.max(1) as usize,
            Shrink::KeepLargest => 1,
        };
        let now = self.runs;
        self.models
            .retain(|m| m.id == model || now - m.last_run <= FORGET_AFTER);
        let i = match self.models.iter().position(|m| m.id == model) {
            Some(i) => i,
            None => {
                self.models.push(Model {
                    id: model,
                    needs: VecDeque::with_capacity(keep),
                    last_run: now,
                });
                self.models.len() - 1
            }
        };
        let m = &mut self.models[i];
        m.last_run = now;
        if self.policy == Shrink::KeepLargest {
            let largest = m.needs.pop_front().unwrap_or(0).max(need);
            m.needs.push_back(largest);
        } else {
            if m.needs.len() == keep {
                m.needs.pop_front();
            }
            m.needs.push_back(need);
        }
        self.held()
    }

    /// The bytes the models need now (`None` under [`Shrink::Never`]).
    pub(crate) fn held(&self) -> Option<usize> {
        if self.policy == Shrink::Never {
            return None;
        }
        Some(
            self.models
                .iter()
                .flat_map(|m| m.needs.iter().copied())
                .max()
                .unwrap_or(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_model_follows_its_input_down_after_n_runs() {
        let mut f = Follow::new(Shrink::FollowInput { runs: 2 });
        assert_eq!(f.after_run(1, 100), Some(100));
        assert_eq!(f.after_run(1, 10), Some(100));
        assert_eq!(f.after_run(1, 10), Some(10));
        assert_eq!(f.after_run(1, 50), Some(50));
        let mut f = Follow::new(Shrink::default());
        assert_eq!(f.after_run(1, 100), Some(100));
        assert_eq!(f.after_run(1, 10), Some(10));
    }

    #[test]
    fn the_worker_holds_the_largest_model() {
        let mut f = Follow::new(Shrink::default());
        f.after_run(1, 300); // det, large image
        f.after_run(2, 20); // cls
        assert_eq!(f.after_run(3, 80), Some(300)); // rec
        assert_eq!(f.after_run(1, 50), Some(80)); // det, small image
        assert_eq!(f.after_run(2, 20), Some(80));
    }

    #[test]
    fn keep_largest_and_never() {
        let mut f = Follow::new(Shrink::KeepLargest);
        f.after_run(1, 300);
        assert_eq!(f.after_run(1, 10), Some(300));
        assert_eq!(f.after_run(2, 400), Some(400));
        let mut f = Follow::new(Shrink::Never);
        assert_eq!(f.after_run(1, 300), None);
        assert_eq!(f.held(), None);
    }

    #[test]
    fn a_model_not_run_for_long_is_forgotten() {
        let mut f = Follow::new(Shrink::default());
        f.after_run(1, 1000);
        for _ in 0..FORGET_AFTER {
            f.after_run(2, 10);
        }
        assert_eq!(f.held(), Some(1000));
        assert_eq!(f.after_run(2, 10), Some(10));
    }
}
