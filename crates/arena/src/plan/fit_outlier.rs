//! A block the data made larger at one shape seen ([`AllButOne`]).
//!
//! A block whose size depends on the data (detections, a buffer grown for
//! one input) may come once at twice what its dimensions give. No model
//! then explains every shape seen, and models near the key that include
//! that shape predict from it: a constant block seen once doubled was
//! predicted at 2.25x its size (a kept run 1.04x its dynamic run), a
//! proportional one 2.8x. Where every shape but one follows one model, and
//! the one left out is at least half as large again as that model gives
//! there, the block follows the model: a run at a key whose data makes the
//! block larger again leaves its plan at that block, and is served as a
//! run that leaves its plan is.

use super::*;

/// Shapes seen before one may be left out: the rest then has three or
/// more (two fall on a line in every monomial), the least a constant
/// model is trusted from.
const MIN_SHAPES: usize = 4;

/// Shapes the rest must have for a scaled or affine model of it.
const FITTED_SHAPES: usize = 4;

/// How much larger than the model of the rest the shape left out must be:
/// half as large again (the data doubled it; a size capped past some
/// length, or an algorithm chosen by size, is smaller than the model or
/// near it).
const LARGER: f64 = 1.5;

/// The shapes seen, each left out in turn, made once for every block that
/// needs them.
pub(super) struct AllButOne<'a> {
    obs: &'a [Observation],
    varied: &'a [bool],
    q: f64,
    /// By the shape left out: the rest, their tiers and volume range
    /// (`None`: not made yet; `Some(None)`: the rest vary in other
    /// dimensions).
    rest: Vec<Option<Option<Rest>>>,
}

struct Rest {
    obs: Vec<Observation>,
    tiers: Vec<Tier>,
    volumes: (f64, f64),
}

impl<'a> AllButOne<'a> {
    /// For the shapes `obs`, varying in `varied`, sizes known to `q`.
    /// Leaves nothing out where the shapes do not need more as their
    /// dimensions grow (`grows`, [`monotone`]): the fit predicts nothing
    /// then.
    pub(super) fn new(obs: &'a [Observation], varied: &'a [bool], q: f64, grows: bool) -> Self {
        let obs = if grows { obs } else { &[] };
        AllButOne {
            obs,
            varied,
            q,
            rest: (0..obs.len()).map(|_| None).collect(),
        }
    }

    /// Block `b`'s model over every shape seen but one, where exactly one
    /// shape can be left out so, and that shape's size is at least
    /// [`LARGER`] times what the model gives there; else `None`.
    pub(super) fn model(&mut self, b: usize) -> Option<SizeModel> {
        if self.obs.len() < MIN_SHAPES {
            return None;
        }
        let mut found = None;
        for j in 0..self.obs.len() {
            let (obs, varied, q) = (self.obs, self.varied, self.q);
            let rest = self.rest[j].get_or_insert_with(|| {
                let rest: Vec<Observation> = obs
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != j)
                    .map(|(_, o)| o.clone())
                    .collect();
                let same = (0..varied.len())
                    .all(|d| varied[d] == rest.iter().any(|o| o.dims[d] != rest[0].dims[d]));
                same.then(|| Rest {
                    tiers: tiers_for(varied, &rest),
                    volumes: volume_range(&rest, varied),
                    obs: rest,
                })
            });
            let Some(rest) = rest else {
                continue;
            };
            let (lo, hi) = rest.volumes;
            // A constant model of three shapes or more; a scaled or affine
            // one of four or more: there are many monomials (strided,
            // up to degree 3), and one of them may fit three shapes to the
            // rounding where the block follows another (a block 773 + 124
            // w was fitted at 1.43x its size at a fourth width so).
            let model = match model_of(&rest.obs, b, &rest.tiers, q, lo, hi) {
                Some(m @ SizeModel::Const { .. }) => m,
                Some(m) if rest.obs.len() >= FITTED_SHAPES => m,
                _ => continue,
            };
            let left = &obs[j];
            if (left.sizes[b] as f64) < LARGER * largest_at(&model, &left.dims) {
                continue;
            }
            if found.is_some() {
                // Two shapes could be the one: nothing tells which.
                return None;
            }
            found = Some(model);
        }
        found
    }
}

/// Whether the shapes seen needed more as their dimensions grew: no shape
/// at dimensions at most another's needed more than it (by more than a
/// sixteenth, and a quantum a block). A key that explains nothing (a
/// request counter) breaks this ([`Fit::unfit`]).
pub(crate) fn monotone(obs: &[Observation], quantum: usize) -> bool {
    let blocks = obs.first().map_or(0, |o| o.sizes.len());
    obs.iter().all(|a| {
        obs.iter().all(|b| {
            let within = a.dims.iter().zip(&b.dims).all(|(x, y)| x <= y);
            !within || a.lower_bound <= b.lower_bound + b.lower_bound / 16 + quantum * blocks
        })
    })
}

/// The largest size `model` gives at `dims`, over its fits and the
/// vertices of each.
fn largest_at(model: &SizeModel, dims: &[u64]) -> f64 {
    match model {
        SizeModel::Const { size, .. } => *size as f64,
        SizeModel::Scaled(fits) | SizeModel::Affine(fits) => {
            super::predict::tier_range(fits, dims, |_| 1.0).0
        }
    }
}
