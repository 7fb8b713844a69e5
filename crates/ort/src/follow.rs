//! When a worker gives cached memory back: each model's need follows its
//! input down, and the worker holds the largest model's need.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// When a [`Worker`](crate::Worker) gives cached memory back: at the end
/// of a run, and before a run whose key's own plan says it needs less than
/// the worker holds ([`Worker::prepare`](crate::Worker::prepare)).
///
/// A model's *need* for a run is its plan's block (or, unplanned, the run's
/// high water). The worker keeps, for every model it runs, the needs of
/// that model's last runs, and after each run shrinks its arena to the
/// largest of them over all models; a run whose plan is its key's own is
/// given that bound before it starts, so a smaller run after a larger one
/// runs on its own memory. So a model's memory follows its input
/// down while the other models of a pipeline keep theirs: a worker running
/// an OCR pipeline's det, cls and rec holds the largest of the three, and
/// after a small image det's share comes down. The next larger run commits
/// again, in place (huge pages where the system gives them), and pays for
/// the kernel zeroing the pages it gets back: about 0.2-0.3 ms per 2 MiB
/// measured (`BENCHMARKS.md`, "ONNX Runtime"), 1-4% of PP-OCR rec's large run
/// and up to a third of a 1280x1280 PP-OCR det run when sizes strictly
/// alternate. Where that latency matters, give memory back lazily
/// ([`WorkerOptions::pages`](crate::WorkerOptions::pages) with
/// [`GiveBack::Lazily`](crate::GiveBack::Lazily)): the large run then
/// costs what it costs on held memory while the kernel has not needed the
/// pages, which stay in the process's RSS (as `LazyFree`) until it does.
/// Or hold more: the default, [`Shrink::Window`] of 1 s, holds the largest
/// need of the last second, so sizes that alternate at a server's rate
/// keep their memory (a 1280x1280 det run after a 320x320 one: 0.974x
/// ONNX Runtime's arena's time, `BENCHMARKS.md`, "Servers"), and idle decay
/// ([`WorkerOptions::decay`](crate::WorkerOptions::decay)) gives it all
/// back when traffic stops.
///
/// A model that has not run in the worker's last 64 runs is forgotten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shrink {
    /// Hold the largest of each model's last `runs` needs (at least 1).
    /// With 1 (the default before [`Shrink::Window`]), memory comes down after a
    /// single smaller run;
    /// with `n`, after `n` smaller runs in a row, so inputs that alternate
    /// within `n` runs keep their memory.
    FollowInput {
        /// Runs of a model remembered.
        runs: u32,
    },
    /// Hold the largest of each model's needs over the last `time` (and
    /// at least its last run's): inputs that alternate within `time` keep
    /// their memory, and memory comes down at the first run after `time`
    /// of smaller runs (before it, when its key has its own plan). Traffic that stops is left to idle decay
    /// ([`WorkerOptions::decay`](crate::WorkerOptions::decay)), which gives
    /// everything back after its idle time without a run.
    Window {
        /// How long a need is remembered.
        time: Duration,
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
    /// [`Shrink::Window`] of 1 s, with idle decay after
    /// [`DEFAULT_DECAY`](crate::DEFAULT_DECAY): a server whose input sizes
    /// alternate keeps the memory of its largest recent input (no page
    /// faults when a large run follows a small one), memory follows the
    /// input down 1 s after the large inputs stop, and all of it goes back
    /// when traffic stops. Chosen from the measurements in
    /// `BENCHMARKS.md` ("Servers"; `docs/decisions.md`); the previous default,
    /// `FollowInput { runs: 1 }`, stays available.
    fn default() -> Self {
        Shrink::Window {
            time: Duration::from_secs(1),
        }
    }
}

/// Runs after which a model that has not run is forgotten.
const FORGET_AFTER: u64 = 64;

struct Model {
    id: u64,
    /// The last needs (FollowInput), or the largest (KeepLargest: one).
    needs: VecDeque<usize>,
    /// Window: the needs of the window that no later need is at least as
    /// large as, oldest first (so the front is the largest), with when.
    timed: VecDeque<(usize, Instant)>,
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
        self.after_run_at(model, need, Instant::now())
    }

    /// [`Follow::after_run`] at a given time.
    fn after_run_at(&mut self, model: u64, need: usize, now_t: Instant) -> Option<usize> {
        self.runs += 1;
        let keep = match self.policy {
            Shrink::Never => return None,
            Shrink::FollowInput { runs } => runs.max(1) as usize,
            Shrink::KeepLargest | Shrink::Window { .. } => 1,
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
                    timed: VecDeque::new(),
                    last_run: now,
                });
                self.models.len() - 1
            }
        };
        let m = &mut self.models[i];
        m.last_run = now;
        if let Shrink::Window { time } = self.policy {
            // A max-queue: needs no larger than this one, and older, can
            // never be the largest again.
            while m.timed.back().is_some_and(|&(n, _)| n <= need) {
                m.timed.pop_back();
            }
            m.timed.push_back((need, now_t));
            while m.timed.len() > 1
                && m.timed
                    .front()
                    .is_some_and(|&(_, t)| now_t.saturating_duration_since(t) > time)
            {
                m.timed.pop_front();
            }
            m.needs.clear();
            m.needs.extend(m.timed.front().map(|&(n, _)| n));
        } else if self.policy == Shrink::KeepLargest {
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

    /// The bytes to hold *before* a run of `model` that is known to need
    /// `need` bytes (its key's own plan): what [`Follow::after_run`] will
    /// return if the run needs that, computed without noting the run. A
    /// worker that holds more gives the rest back before the run starts,
    /// so a smaller run's peak is its own, not the larger run's before it.
    /// `None` under [`Shrink::Never`].
    pub(crate) fn before_run(&self, model: u64, need: usize) -> Option<usize> {
        self.before_run_at(model, need, Instant::now())
    }

    /// [`Follow::before_run`] at a given time.
    fn before_run_at(&self, model: u64, need: usize, now_t: Instant) -> Option<usize> {
        let keep = match self.policy {
            Shrink::Never => return None,
            Shrink::FollowInput { runs } => runs.max(1) as usize,
            Shrink::KeepLargest | Shrink::Window { .. } => 1,
        };
        // The run's number once noted, as `after_run_at` counts it.
        let now = self.runs + 1;
        let mut held = need;
        for m in &self.models {
            if m.id != model {
                // Another model: its needs as they stand, unless forgotten
                // by the time this run is noted.
                if now - m.last_run <= FORGET_AFTER {
                    held = held.max(m.needs.iter().copied().max().unwrap_or(0));
                }
                continue;
            }
            let own = match self.policy {
                // The window's needs still inside it once this run is
                // noted (a need of at most `need` drops out either way).
                Shrink::Window { time } => m
                    .timed
                    .iter()
                    .filter(|&&(_, t)| now_t.saturating_duration_since(t) <= time)
                    .map(|&(n, _)| n)
                    .max(),
                // The largest so far.
                Shrink::KeepLargest => m.needs.front().copied(),
                // The last `keep - 1` needs, which stay beside this one.
                _ => m.needs.iter().rev().take(keep - 1).copied().max(),
            };
            held = held.max(own.unwrap_or(0));
        }
        Some(held)
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
        let mut f = Follow::new(Shrink::FollowInput { runs: 1 });
        assert_eq!(f.after_run(1, 100), Some(100));
        assert_eq!(f.after_run(1, 10), Some(10));
    }

    #[test]
    fn the_worker_holds_the_largest_model() {
        let mut f = Follow::new(Shrink::FollowInput { runs: 1 });
        f.after_run(1, 300); // det, large image
        f.after_run(2, 20); // cls
        assert_eq!(f.after_run(3, 80), Some(300)); // rec
        assert_eq!(f.after_run(1, 50), Some(80)); // det, small image
        assert_eq!(f.after_run(2, 20), Some(80));
    }

    #[test]
    fn a_window_holds_the_largest_recent_need() {
        let t0 = Instant::now();
        let s = |ms| t0 + Duration::from_millis(ms);
        let mut f = Follow::new(Shrink::Window {
            time: Duration::from_millis(100),
        });
        // Alternating sizes within the window hold the large one.
        assert_eq!(f.after_run_at(1, 300, s(0)), Some(300));
        assert_eq!(f.after_run_at(1, 50, s(10)), Some(300));
        assert_eq!(f.after_run_at(1, 300, s(20)), Some(300));
        assert_eq!(f.after_run_at(1, 50, s(90)), Some(300));
        // 100 ms after the last large run: down to the recent small ones.
        assert_eq!(f.after_run_at(1, 40, s(121)), Some(50));
        assert_eq!(f.after_run_at(1, 40, s(400)), Some(40));
        // Another model's large need is held beside.
        assert_eq!(f.after_run_at(2, 500, s(401)), Some(500));
        assert_eq!(f.after_run_at(1, 10, s(402)), Some(500));
    }

    /// `before_run` says what `after_run` will hold, under every policy,
    /// over a pseudo-random sequence of models, needs and times (models
    /// forgotten and windows expiring included).
    #[test]
    fn before_run_foretells_after_run() {
        let t0 = Instant::now();
        let policies = [
            Shrink::FollowInput { runs: 1 },
            Shrink::FollowInput { runs: 3 },
            Shrink::Window {
                time: Duration::from_millis(50),
            },
            Shrink::KeepLargest,
            Shrink::Never,
        ];
        for policy in policies {
            let mut f = Follow::new(policy);
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            let mut ms = 0;
            for _ in 0..2_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly model 1 and 2, now and then one of many others
                // (so that some are forgotten).
                let model = match x % 10 {
                    0 => 3 + (x >> 8) % 200,
                    1..=4 => 2,
                    _ => 1,
                };
                let need = ((x >> 16) % 1_000) as usize;
                ms += (x >> 32) % 30;
                let at = t0 + Duration::from_millis(ms);
                let foretold = f.before_run_at(model, need, at);
                assert_eq!(foretold, f.after_run_at(model, need, at), "{policy:?}");
            }
        }
    }

    /// The case the worker gives back early for: alternating sizes under
    /// `FollowInput { runs: 1 }` come down before the small run, and stay
    /// up under the default window.
    #[test]
    fn a_smaller_run_is_held_to_its_need_before_it_starts() {
        let mut f = Follow::new(Shrink::FollowInput { runs: 1 });
        f.after_run(1, 300);
        assert_eq!(f.before_run(1, 10), Some(10));
        assert_eq!(f.after_run(1, 10), Some(10));
        let mut f = Follow::new(Shrink::default());
        f.after_run(1, 300);
        assert_eq!(f.before_run(1, 10), Some(300));
        assert_eq!(Follow::new(Shrink::Never).before_run(1, 10), None);
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
        let mut f = Follow::new(Shrink::FollowInput { runs: 1 });
        f.after_run(1, 1000);
        for _ in 0..FORGET_AFTER {
            f.after_run(2, 10);
        }
        assert_eq!(f.held(), Some(1000));
        assert_eq!(f.after_run(2, 10), Some(10));
    }
}
