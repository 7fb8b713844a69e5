//! [`families`]: plan families under fuzzing. A decoded run structure,
//! sizes that follow the bytes' own functions of a two-dimensional key
//! (constant, proportional or affine in the batch, the width, their
//! product, strided widths), and a sequence of runs at keys from the bytes,
//! some of them twisted (a block larger than its slot, an extra block, a
//! free out of order), each served as the cache's
//! [`lookup`](tensor_arena::PlanCache::lookup) says (its key's plan, one
//! predicted from its family, or none) and taught back with
//! [`after_run`](tensor_arena::PlanCache::after_run). Live blocks never
//! overlap and keep their bytes, predicted or not, and every byte comes
//! back.

use crate::slots::{check, free_slot, recording, Live};
use crate::Counting;
use arbitrary::{Arbitrary, Unstructured};
use tensor_arena::plan::PlanEvent;
use tensor_arena::{Arena, ArenaConfig, PlanCache, PlanSource};

/// Most runs of one input.
const MAX_RUNS: usize = 8;

/// One block's size at key `[batch, width]`: `a + c * m`.
#[derive(Clone, Copy, Debug)]
struct Size {
    a: usize,
    c: usize,
    m: u8,
}

impl Size {
    fn at(self, batch: usize, width: usize) -> usize {
        let m = match self.m % 6 {
            0 => 0,
            1 => batch,
            2 => width,
            3 => batch * width,
            4 => batch * width.div_ceil(4),
            _ => (width + 3) / 8,
        };
        (self.a + self.c * m).max(1)
    }
}

/// What one fuzz input of a family did: `None` where its bytes made no
/// valid run structure (nothing ran); else its runs, by how they were
/// served.
pub type FamilyRuns = Option<tensor_arena::FamilyCounts>;

/// Runs one fuzz input through a family (see the module docs); returns
/// what its runs were served as.
///
/// # Panics
/// When a check fails: overlapping live blocks, a fill pattern overwritten,
/// bytes in use after a run's blocks are dropped, memory not returned, or
/// a run counted twice or not at all.
pub(crate) fn families(u: &mut Unstructured<'_>) -> FamilyRuns {
    let Ok(structure) = recording(u) else {
        return None;
    };
    if structure.validate().is_err() || structure.is_empty() {
        return None;
    }
    let sizes: Vec<Size> = (0..structure.len())
        .map(|_| Size {
            a: usize::from(u16::arbitrary(u).unwrap_or(0) % 4096),
            c: usize::from(u8::arbitrary(u).unwrap_or(0) % 128) + 1,
            m: u8::arbitrary(u).unwrap_or(0),
        })
        .collect();
    let counting = Counting::new();
    let mut runs = 0u64;
    let counts = {
        let config = ArenaConfig {
            max_reserved: 64 << 20,
            ..ArenaConfig::default()
        };
        let arena = Arena::with_backing(config, &counting);
        let cache: PlanCache<Vec<usize>> = PlanCache::new(4);
        for _ in 0..MAX_RUNS {
            let Ok(raw) = <[u8; 3]>::arbitrary(u) else {
                break;
            };
            let key = [usize::from(raw[0] % 8) + 1, usize::from(raw[1]) * 2 + 8];
            let twist = raw[2];
            let lookup = cache.lookup(&key[..]);
            let run = match &lookup.plan {
                Some(plan) => match arena.begin_planned_run(plan.clone()) {
                    Ok(run) => run,
                    Err(_) => arena.begin_recorded_run(),
                },
                None => arena.begin_recorded_run(),
            };
            let mut live: Vec<Option<Live<'_, '_>>> = Vec::new();
            let mut extras: Vec<Live<'_, '_>> = Vec::new();
            let mut failed = false;
            for (t, ev) in structure.events.iter().enumerate() {
                let fill = (t as u8).wrapping_mul(7) ^ twist;
                match *ev {
                    PlanEvent::Alloc(i) => {
                        let mut len = sizes[i as usize].at(key[0], key[1]);
                        if twist % 8 == 1 && usize::from(twist) % structure.len() == i as usize {
                            len *= 2;
                        }
                        let Ok(mut block) = run.try_alloc(len) else {
                            failed = true;
                            live.push(None);
                            continue;
                        };
                        block.fill(fill);
                        live.push(Some(Live { block, fill }));
                        if twist % 8 == 2 && t == usize::from(twist) % structure.events.len() {
                            if let Ok(mut extra) = run.try_alloc(100) {
                                extra.fill(!fill);
                                extras.push(Live {
                                    block: extra,
                                    fill: !fill,
                                });
                            }
                        }
                    }
                    PlanEvent::Free(i) => {
                        free_slot(&mut live, i, (twist % 8 == 3).then_some(t));
                    }
                }
                check(live.iter().flatten().chain(&extras));
            }
            drop(extras);
            drop(live);
            let (report, rec) = run.finish_with_recording();
            runs += 1;
            let learned = cache.after_run(&key[..], &lookup, &report, &rec, !failed);
            if let Some(plan) = learned {
                if let Err(e) = plan.validate() {
                    panic!("a learned plan fails validation: {e}");
                }
            }
            if lookup.source == PlanSource::Predicted && report.planned {
                assert!(
                    lookup.plan.as_ref().is_some_and(|p| p.validate().is_ok()),
                    "a predicted plan fails validation"
                );
            }
            assert_eq!(arena.stats().in_use, 0, "bytes in use after a run");
        }
        let counts = cache.stats().runs;
        assert_eq!(counts.runs(), runs, "every run counted once");
        counts
    };
    assert_eq!(counting.outstanding(), 0, "memory not returned after drop");
    Some(counts)
}
