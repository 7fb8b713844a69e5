//! How each block's size follows a run key's dimensions: the fit a plan
//! family makes from the shapes it has seen ([`Fit`]).
//!
//! What is fitted, and why:
//! - **Constant**: the block had one size at every shape seen (a model's
//!   state, shape tensors, a fixed workspace).
//! - **Proportional to a monomial** `c · m(dims)`: tensors are products of
//!   their dimensions, so an intermediate's bytes are a constant times a
//!   product of the input's varying dimensions (batch; height times width;
//!   batch times width squared for attention), each possibly divided by a
//!   stride and rounded up (`ceil(w / 4)` after two stride-2 layers). The
//!   monomials tried have degree 1 to 3 in the dimensions that varied, each
//!   factor divided by 1, 2, 4, 8, 16 or 32 and rounded up (padded
//!   convolutions) or down (pooling).
//! - **Affine in a monomial** `a + c · m(dims)`, where no proportional
//!   monomial fits (a constant part beside a scaled one).
//!
//! Sizes are known only to the arena's rounding (the *quantum*, a power of
//! two): a recorded size `s` stands for a true size in `(s - q, s]`. A
//! monomial fits when one `c` explains every shape seen to that precision,
//! and the prediction takes the largest `c` that does, rounded up to the
//! quantum (and an intercept under a quantum, which the rounding cannot
//! rule out), so that a block whose size truly follows the monomial always
//! fits its predicted slot. Monomials are tried simplest first (by degree,
//! the product of every varying dimension first at its degree); the first
//! that fits wins. Within it, the least strided variants that fit are
//! taken (two widths that are both multiples of 32 cannot tell `w` from
//! `ceil(w / 32)`: tensors mostly follow their dimensions unstrided), the
//! largest of them where several fit: too large a slot costs a few bytes,
//! too small a slot hands the run over to the dynamic path. Where only
//! strided variants fit, a twin divided further that the shapes seen
//! cannot tell from them is another model (below).
//!
//! Ambiguity is known, not guessed: where other tiers of the degree of the
//! first that fits (the product of every varying dimension or not, the
//! same kind) fit too, as the batch and the sequence do when they only
//! varied together (`[1, 512]`, then `[2, 1024]`: `b * s`, `s^2` and
//! `b^2`), the block keeps every one of them, and the prediction at
//! a key says where they part (`Predicted::least`): its family predicts
//! the largest only where that costs no more live bytes than the least (to
//! a sixty-fourth), and refuses the key otherwise
//! (`DynamicReason::Ambiguous`; the run teaches which is right). So with a
//! strided fit and its coarsest twin whose values at every shape seen are
//! a constant multiple of its own (`ceil(w / 4)^2` and `ceil(w / 8)^2` at
//! widths that each round up to an even multiple of 4). A block
//! the same size at every shape seen is one of two models at a key far
//! below them (`Fit::below_range`): a constant, or a size padded to a
//! bucket that the shapes seen all fell in.
//!
//! A dimension that never varied among the shapes seen says nothing by how
//! sizes moved with it; but sizes are products of the input's dimensions,
//! so a varying block whose every size is a multiple of the dimension's
//! value (or of a strided variant of it) with a prime factor of 11 or more
//! follows it: 736 (`23 * 32`) divides every feature map of a 736-high
//! image. Such blocks scale with it; a key is refused
//! ([`NoPrediction::Unvaried`]) where nothing can tell (the value 1, a
//! power of two, or one whose odd factors are those of channel counts, 3,
//! 5, 7: 192 divides per-channel blocks of MobileNetV3 that do not follow
//! the width) or where the blocks that show nothing hold more than an
//! eighth of the varying bytes (`Fit::unvaried_scale`).
//!
//! Keys must explain the sizes: where a shape seen at dimensions at most
//! another's needed more than it (a key made of request counters), nothing
//! is predicted.
//!
//! A prediction is also bounded ([`Fit::bound`]): sizes in a tensor
//! program do not grow as its input shrinks, so a run seen at dimensions
//! at least as large bounds the lower bound of a shape; past the shapes
//! seen, sizes grow at most as the highest degree the fit found. A predicted run
//! whose lower bound exceeds that (by more than an eighth, and a quantum a
//! block for the slots' safe-side rounding) is a wrong fit, not a large
//! input: its family refuses it (`DynamicReason::Unbounded`).

/// Strides a factor may be divided by: `2^0 ..= 2^MAX_SHIFT`.
const MAX_SHIFT: u8 = 5;

/// The least value a strided factor (`ceil(w / 4)`) may take at every
/// shape seen for its monomial to be fitted. Rounding moves a strided
/// factor by up to one: at 1 or 2 such a factor fits nearly any sizes
/// (`floor(b / 4)`, 0, 0 and 1 at batches 2, 1 and 5, explains a constant
/// block that a deviation doubled at batch 5, and predicted it doubled at
/// batch 7: a run kept at 2x its need). Strides are a layer's over a
/// spatial dimension or a sequence, whose values are tens to thousands.
/// (Over random families at 1,050, the worst fell-back run went from
/// 3.29x to 2.30x its dynamic run and the worst kept one from 3.00x to
/// 2.52x, for a tenth fewer predictions; 4 also refused true fits, such
/// as `ceil(19 / 8)`.)
const MIN_STRIDED: u64 = 3;

/// Dimensions a family may vary in and still be fitted with every
/// monomial; past it only degree 1 and the product of all are tried.
const FULL_SEARCH_DIMS: usize = 3;

/// One factor of a monomial: `floor((dim + offset) / 2^shift)` to the
/// power `exp` (offset 0 rounds down, `2^shift - 1` up; the others are
/// what layers of different kernels and paddings compose to).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Factor {
    dim: u16,
    shift: u8,
    offset: u8,
    exp: u8,
}

/// A product of factors of the key's dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Monomial(Vec<Factor>);

impl Monomial {
    /// Its degree: the sum of its factors' exponents.
    fn degree(&self) -> i32 {
        self.0.iter().map(|f| i32::from(f.exp)).sum()
    }

    /// Which dimensions it multiplies, to which powers (its tier: its
    /// strided variants share it).
    pub(super) fn same_tier(&self, other: &Monomial) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|(a, b)| a.dim == b.dim && a.exp == b.exp)
    }

    /// The strides it divides by, in all (the sum of its factors' shifts).
    pub(super) fn strides(&self) -> u32 {
        self.0.iter().map(|f| u32::from(f.shift)).sum()
    }

    /// Whether a strided factor of it is under [`MIN_STRIDED`] at one of
    /// `obs`: it then fits sizes it does not explain (see there).
    pub(super) fn coarse(&self, obs: &[Observation]) -> bool {
        self.0.iter().any(|f| {
            f.shift > 0
                && obs.iter().any(|o| {
                    let v = o.dims.get(f.dim as usize).copied().unwrap_or(0);
                    (v.saturating_add(u64::from(f.offset)) >> f.shift) < MIN_STRIDED
                })
        })
    }

    /// Its value at `dims` (a missing dimension counts as 0).
    pub(super) fn eval(&self, dims: &[u64]) -> f64 {
        self.0.iter().fold(1.0, |m, f| {
            let v = dims.get(f.dim as usize).copied().unwrap_or(0);
            let v = (v.saturating_add(u64::from(f.offset)) >> f.shift) as f64;
            // The usual exponents multiplied out: `powi` is a call.
            m * match f.exp {
                1 => v,
                2 => v * v,
                e => v.powi(i32::from(e)),
            }
        })
    }
}

/// How one block's size follows the key.
#[derive(Clone, Debug)]
pub(crate) enum SizeModel {
    /// The same at every shape. `small`: so small that a block scaled
    /// with the varying dimensions could have rounded to one size at every
    /// shape seen (8 bytes a batch item is 64 bytes at batches 3 and 6):
    /// it is then predicted to scale past the largest shape seen.
    Const { size: usize, small: bool },
    /// `c · m` for each monomial that fits, with the vertices `(a, c)` of
    /// what the shapes allow (an intercept under one quantum included);
    /// the prediction is the largest over them.
    Scaled(Vec<(Monomial, Vec<(f64, f64)>)>),
    /// `a + c · m` for each monomial that fits, with every vertex `(a, c)`
    /// of the lines consistent with the shapes seen; the prediction is the
    /// largest over them.
    Affine(Vec<(Monomial, Vec<(f64, f64)>)>),
}

/// What a family has seen of one run structure at one key: its
/// dimensions and each block's recorded size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Observation {
    pub(crate) dims: Vec<u64>,
    pub(crate) sizes: Vec<usize>,
    /// The run's lower bound (most bytes live at once).
    pub(crate) lower_bound: usize,
}

/// The shapes seen nearest to a key, in threes ([`Fit::near`]).
pub(super) struct Near {
    /// The nearest three first, then the other threes among the nearest
    /// four; only those that vary in the same dimensions as all the
    /// shapes seen (none where the nearest three do not).
    triples: Vec<Triple>,
    quantum: f64,
}

/// Three shapes seen, with the tiers of the dimensions they vary in.
struct Triple {
    obs: Vec<Observation>,
    tiers: Vec<Tier>,
    /// The least and largest product of the varying dimensions.
    volumes: (f64, f64),
}

impl Near {
    /// Models of block `b` from the three shapes seen nearest to the key,
    /// for a block that no model explains over every shape: a size capped
    /// past some length (a chunked im2col), or that an algorithm chosen by
    /// size changes, is a simple function near any one shape. Empty when
    /// the nearest shapes do not vary in the same dimensions as all of
    /// them, or no model explains them either. After the nearest three's
    /// model come those of the other threes among the nearest four: a
    /// shape whose block the data made larger (a run with more detections)
    /// is explained by a model of the three with it and not by the others,
    /// and where they part at the key the prediction says so
    /// (`Predicted::least`).
    pub(super) fn models(&self, b: usize) -> Vec<SizeModel> {
        let mut out = Vec::new();
        for (t, tr) in self.triples.iter().enumerate() {
            let (lo, hi) = tr.volumes;
            match model_of(&tr.obs, b, &tr.tiers, self.quantum, lo, hi) {
                Some(m) => out.push(m),
                // The nearest three have no model: none is predicted.
                None if t == 0 => break,
                None => {}
            }
        }
        out
    }
}

/// Why a [`Fit`] makes no prediction for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoPrediction {
    /// A block's sizes follow no model (over every shape seen, or the
    /// shapes nearest to the key).
    Unfit,
    /// The key has other dimensions than the shapes seen, or a predicted
    /// size is not a size.
    Unpredictable,
    /// The key changes a dimension that never varied among the shapes
    /// seen.
    Unvaried,
}

/// Every block's [`SizeModel`], fitted to the observations of one run
/// structure.
#[derive(Clone, Debug)]
pub(crate) struct Fit {
    /// One per block; `None` where no model explains the sizes seen.
    models: Vec<Option<SizeModel>>,
    /// Sizes are known to this power of two.
    quantum: usize,
    /// The dimensions of the shapes seen, and whether each varied.
    base: Vec<u64>,
    varied: Vec<bool>,
    /// The largest product of the varying dimensions among the shapes seen.
    volume_max: f64,
    /// The shapes seen (for local models).
    obs: Vec<Observation>,
    /// The highest degree of a model in the varying dimensions (3 where a
    /// block has no model over every shape: a local one may have any).
    degree: i32,
    /// Whether the shapes seen needed more as their dimensions grew: no
    /// shape at dimensions at most another's needed more than it (by more
    /// than a sixteenth). A key that explains nothing (a request counter)
    /// breaks this, and is not predicted.
    monotone: bool,
}

/// How block `b`'s size follows the shapes `obs`: constant, else the
/// first tier's proportional fit, else its affine fit, else none.
pub(super) fn model_of(
    obs: &[Observation],
    b: usize,
    tiers: &[Tier],
    q: f64,
    volume_min: f64,
    volume_max: f64,
) -> Option<SizeModel> {
    let first = &obs[0];
    let sizes: Vec<f64> = obs.iter().map(|o| o.sizes[b] as f64).collect();
    if obs.iter().all(|o| o.sizes[b] == first.sizes[b]) {
        // Scaled with the volume, its sizes would have spread over
        // `size * (1 - min / max)` bytes: under a quantum, the rounding
        // hid it.
        let size = first.sizes[b];
        let spread = size as f64 * (1.0 - volume_min / volume_max);
        let small = volume_max > 0.0 && spread < q;
        return Some(SizeModel::Const { size, small });
    }
    let proportional =
        |m: &Monomial, values: &[f64]| scaled(values, &sizes, q).map(|v| (m.clone(), v));
    if let Some(fits) = first_class(tiers, 0, proportional) {
        return Some(SizeModel::Scaled(fits));
    }
    let affine = |m: &Monomial, values: &[f64]| affine(values, &sizes, q).map(|v| (m.clone(), v));
    // An affine size has two free parameters: three shapes of a block of
    // degree 3 may fall on a line in a monomial of degree 1 or 2 (to the
    // rounding), so every degree's fits are kept beside the first. (Two
    // shapes fall on a line in every monomial: compared, they would part
    // at every third key, and nothing would be predicted from two.)
    let next = if obs.len() > 2 { 3 } else { 0 };
    first_class(tiers, next, affine).map(SizeModel::Affine)
}

/// Monomials that fit a block, each with the vertices `(a, c)` of what the
/// shapes seen allow.
pub(super) type Fits = Vec<(Monomial, Vec<(f64, f64)>)>;

/// The fits of the first tier that has any, and of every tier after it of
/// its degree, or up to `next` degrees past it, that fits too: each
/// explains the shapes seen as well as the first, so the shapes cannot
/// tell them apart (the batch and the sequence when they only varied
/// together; any two monomials at two shapes for an affine size; a strided
/// product that fits only within the rounding beside a square that fits
/// exactly: `b * ceil(s / 4)` and `s^2` at `[1, 59]`, `[2, 118]`,
/// `[1, 61]`). Where they part at a key, the prediction says so
/// (`Predicted::least`). Tier by tier; `None` when no tier fits.
fn first_class(
    tiers: &[Tier],
    next: i32,
    mut fit: impl FnMut(&Monomial, &[f64]) -> Option<(Monomial, Vec<(f64, f64)>)>,
) -> Option<Fits> {
    // The first fitting tier's degree, once one fits: tiers come by degree.
    let mut degree = None;
    let mut fits: Fits = Vec::new();
    for tier in tiers {
        if degree.is_some_and(|d| tier.class.0 > d + next) {
            break;
        }
        // Every tier of that degree (and `next` past it), the product of
        // every varying dimension or not, that fits: kept beside the first.
        let found = least_strided(tier, &mut fit);
        if !found.is_empty() {
            degree.get_or_insert(tier.class.0);
            fits.extend(found);
        }
    }
    degree.map(|_| fits)
}

/// One tier of monomials, each with its values at the shapes fitted (in
/// one vector, a row per monomial), so that every block's fit reads them
/// instead of computing them again.
pub(super) struct Tier {
    monomials: Vec<Monomial>,
    values: Vec<f64>,
    coarse: Vec<bool>,
    shapes: usize,
    /// Its degree, and whether it is the product of every varying
    /// dimension: tiers of one class are equally simple, so where several
    /// explain the shapes seen, the shapes cannot tell them apart.
    class: (i32, bool),
}

impl Tier {
    fn new(monomials: Vec<Monomial>, obs: &[Observation], varying: usize) -> Self {
        let values = monomials
            .iter()
            .flat_map(|m| obs.iter().map(move |o| m.eval(&o.dims)))
            .collect();
        let coarse = monomials.iter().map(|m| m.coarse(obs)).collect();
        let class = monomials.first().map_or((0, false), |m| {
            let volume = m.0.len() == varying && m.0.iter().all(|f| f.exp == 1);
            (m.degree(), volume)
        });
        Self {
            monomials,
            values,
            coarse,
            shapes: obs.len(),
            class,
        }
    }
}

/// The tiers of monomials to try over the dimensions that vary in `obs`.
pub(super) fn tiers_for(varied: &[bool], obs: &[Observation]) -> Vec<Tier> {
    let varying = varied.iter().filter(|&&v| v).count();
    tiers::tiers(varied)
        .into_iter()
        .map(|t| Tier::new(t, obs, varying))
        .collect()
}

/// The product of the dimensions that varied.
fn volume(dims: &[u64], varied: &[bool]) -> f64 {
    dims.iter()
        .zip(varied)
        .filter(|(_, &v)| v)
        .map(|(&d, _)| d as f64)
        .product()
}

/// The least and largest product of the varying dimensions among `obs`.
pub(super) fn volume_range(obs: &[Observation], varied: &[bool]) -> (f64, f64) {
    obs.iter()
        .map(|o| volume(&o.dims, varied))
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        })
}

impl Fit {
    /// Fits every block's size to `obs` (at least one observation, all
    /// with as many dimensions and as many blocks), sizes being rounded to
    /// at most `rounding` (a power of two: the smallest alignment of the
    /// blocks, which is at least the arena's).
    pub(crate) fn new(obs: &[Observation], rounding: usize) -> Fit {
        let (varied, quantum) = Self::frame(obs, rounding);
        let tiers = tiers_for(&varied, obs);
        let (volume_min, volume_max) = volume_range(obs, &varied);
        let q = quantum as f64;
        let grows = monotone(obs, quantum);
        let mut all_but_one = outlier::AllButOne::new(obs, &varied, q, grows);
        let models: Vec<Option<SizeModel>> = (0..obs[0].sizes.len())
            .map(|b| {
                model_of(obs, b, &tiers, q, volume_min, volume_max).or_else(|| all_but_one.model(b))
            })
            .collect();
        Self::assemble(obs, models, varied, quantum, grows)
    }

    /// Which dimensions vary among `obs`, and the quantum their sizes are
    /// known to (see [`Fit::new`]).
    pub(super) fn frame(obs: &[Observation], rounding: usize) -> (Vec<bool>, usize) {
        let first = &obs[0];
        let varied: Vec<bool> = (0..first.dims.len())
            .map(|d| obs.iter().any(|o| o.dims[d] != first.dims[d]))
            .collect();
        let quantum = obs
            .iter()
            .flat_map(|o| o.sizes.iter())
            .fold(0usize, |acc, &s| acc | s);
        let quantum = if quantum == 0 {
            1
        } else {
            1usize << quantum.trailing_zeros()
        }
        .min(rounding.max(1));
        (varied, quantum)
    }

    /// The fit of `obs` made of each block's model; `monotone`: whether
    /// the shapes needed more as their dimensions grew ([`monotone`]).
    pub(super) fn assemble(
        obs: &[Observation],
        models: Vec<Option<SizeModel>>,
        varied: Vec<bool>,
        quantum: usize,
        monotone: bool,
    ) -> Fit {
        let (_, volume_max) = volume_range(obs, &varied);
        let degree = models
            .iter()
            .map(|m| match m {
                None => 3,
                Some(SizeModel::Const { .. }) => 1,
                Some(SizeModel::Scaled(fits) | SizeModel::Affine(fits)) => {
                    fits.iter().map(|(m, _)| m.degree()).max().unwrap_or(1)
                }
            })
            .max()
            .unwrap_or(1)
            .max(1);
        Fit {
            monotone,
            models,
            quantum,
            base: obs[0].dims.clone(),
            varied,
            volume_max,
            obs: obs.to_vec(),
            degree,
        }
    }

    /// The most a run at `dims` may need at once (its lower bound) for a
    /// prediction to be used. Sizes are sums of products of the input's
    /// dimensions, so a run needs no more than a run seen at dimensions at
    /// least as large, and past a shape seen it grows at most by the
    /// product of the dimensions' growth to the fit's highest degree:
    /// the least of `lower bound seen × growth^degree` over the shapes
    /// seen, plus an eighth and a quantum a block (see the module docs).
    pub(crate) fn bound(&self, dims: &[u64]) -> usize {
        let least = self
            .obs
            .iter()
            .map(|o| {
                // Every dimension: one that never varied grows the run
                // only where the sizes show they follow it
                // (`Fit::unvaried_scale`).
                let growth: f64 = dims
                    .iter()
                    .zip(&o.dims)
                    .map(|(&now, &seen)| (now as f64 / seen.max(1) as f64).max(1.0))
                    .product();
                o.lower_bound as f64 * growth.powi(self.degree)
            })
            .fold(f64::INFINITY, f64::min);
        let slack = (self.quantum * self.models.len()) as f64;
        let bound = least * 1.125 + slack;
        if bound >= usize::MAX as f64 {
            usize::MAX
        } else {
            bound as usize
        }
    }

    /// The shapes seen nearest to `dims` (by the product of the varying
    /// dimensions), in threes, for the blocks that no model explains over
    /// every shape ([`Near::models`]); made once per prediction.
    pub(super) fn near(&self, dims: &[u64]) -> Near {
        let at = volume(dims, &self.varied).max(1.0).ln();
        let mut near: Vec<&Observation> = self.obs.iter().collect();
        near.sort_by(|x, y| {
            let dx = (volume(&x.dims, &self.varied).max(1.0).ln() - at).abs();
            let dy = (volume(&y.dims, &self.varied).max(1.0).ln() - at).abs();
            dx.total_cmp(&dy)
        });
        // Three: two shapes fit any affine size, so a data-dependent size
        // would always be "predicted" (and always wrongly).
        let mut triples = Vec::new();
        let picks: &[[usize; 3]] = match near.len() {
            0..=2 => &[],
            3 => &[[0, 1, 2]],
            _ => &[[0, 1, 2], [0, 1, 3], [0, 2, 3], [1, 2, 3]],
        };
        for (t, pick) in picks.iter().enumerate() {
            let subset: Vec<Observation> = pick.iter().map(|&i| near[i].clone()).collect();
            let varied: Vec<bool> = (0..self.varied.len())
                .map(|d| subset.iter().any(|o| o.dims[d] != subset[0].dims[d]))
                .collect();
            if varied != self.varied {
                if t == 0 {
                    break;
                }
                continue;
            }
            let (lo, hi) = volume_range(&subset, &varied);
            let tiers = tiers_for(&varied, &subset);
            triples.push(Triple {
                obs: subset,
                tiers,
                volumes: (lo, hi),
            });
        }
        Near {
            triples,
            quantum: self.quantum as f64,
        }
    }

    /// Whether a block keeps models of several tiers (the shapes seen could
    /// not tell them apart).
    pub(crate) fn ambiguous(&self) -> bool {
        self.models.iter().any(|m| match m {
            Some(SizeModel::Scaled(fits) | SizeModel::Affine(fits)) => {
                fits.windows(2).any(|w| !w[0].0.same_tier(&w[1].0))
            }
            _ => false,
        })
    }

    /// The power of two the sizes are known to.
    pub(crate) fn quantum(&self) -> usize {
        self.quantum
    }

    /// Blocks whose sizes no model explains (every block, where the
    /// shapes seen did not need more as their dimensions grew).
    pub(crate) fn unfit(&self) -> usize {
        if !self.monotone {
            return self.models.len();
        }
        self.models.iter().filter(|m| m.is_none()).count()
    }
}

/// The fits `fit` finds among a tier's variants: those divided by the
/// least strides (in all), and where those are strided, the coarsest of
/// their twins that the shapes seen cannot tell from them. An unstrided
/// monomial that fits is preferred to its strided twins (which fit too
/// when every dimension seen is a multiple of the stride: tensors mostly
/// follow their dimensions unstrided). But where only strided variants
/// fit, how far the dimension was divided is what the shapes seen show,
/// and a twin divided further whose values at every shape seen are a
/// constant multiple of a fit's is explained exactly as well (widths 262,
/// 277 and 285: `ceil(w / 4)^2` is `4 ceil(w / 8)^2` at each). The two
/// are then alternatives, as two tiers of one class are: where they part
/// at a key, the prediction says so (`Predicted::least`), and the family
/// predicts the larger only where it costs no more than the least.
fn least_strided<T>(tier: &Tier, mut fit: impl FnMut(&Monomial, &[f64]) -> Option<T>) -> Vec<T> {
    let n = tier.shapes.max(1);
    let values = |i: usize| &tier.values[i * n..(i + 1) * n];
    let mut least = u32::MAX;
    let mut out = Vec::new();
    let mut fitted: Vec<usize> = Vec::new();
    let mut rest = tier.monomials.len();
    for (i, m) in tier.monomials.iter().enumerate() {
        // (The tier's variants come by their strides, the least first.)
        let strides = m.strides();
        if strides > least {
            rest = i;
            break;
        }
        if tier.coarse[i] {
            continue;
        }
        if let Some(t) = fit(m, values(i)) {
            least = strides;
            out.push(t);
            fitted.push(i);
        }
    }
    if least == 0 || fitted.is_empty() {
        return out;
    }
    // The coarsest twin: the most strides, and of those the greatest
    // rounding offsets (the largest at any key); one is enough, as the
    // shapes seen tell it from none of the others.
    let mut twin: Option<(u32, u32, usize)> = None;
    for j in (rest..tier.monomials.len()).rev() {
        let m = &tier.monomials[j];
        let strides = m.strides();
        if twin.is_some_and(|(s, _, _)| strides < s) {
            break;
        }
        if tier.coarse[j]
            || !fitted
                .iter()
                .any(|&i| proportional_at(values(i), values(j)))
        {
            continue;
        }
        let offsets = m.0.iter().map(|f| u32::from(f.offset)).sum();
        if twin.is_none_or(|(_, o, _)| offsets > o) {
            twin = Some((strides, offsets, j));
        }
    }
    if let Some(t) = twin.and_then(|(_, _, j)| fit(&tier.monomials[j], values(j))) {
        out.push(t);
    }
    out
}

/// Whether `b` is a constant multiple of `a`, value by value (monomials'
/// values at the shapes seen: whole numbers, exact as floats).
fn proportional_at(a: &[f64], b: &[f64]) -> bool {
    let (Some(&a0), Some(&b0)) = (a.first(), b.first()) else {
        return false;
    };
    a0 > 0.0 && b0 > 0.0 && a.iter().zip(b).all(|(&x, &y)| x * b0 == y * a0)
}

/// `bytes` rounded up to the quantum `q` (a hair of float error is not
/// another quantum), at least one quantum; `None` past the largest block.
fn to_size(bytes: f64, q: f64) -> Option<usize> {
    if !bytes.is_finite() {
        return None;
    }
    let units = ceil_at_least_one(bytes / q - 1e-9);
    let size = units * q;
    (size <= super::MAX_BLOCK as f64).then_some(size as usize)
}

/// `x.ceil().max(1.0)` for a finite `x`, by truncation: baseline x86-64
/// has no rounding instruction, so `ceil` is a call into libm, twice per
/// block of every prediction. From 2^53 on every `f64` is a whole number.
fn ceil_at_least_one(x: f64) -> f64 {
    const WHOLE: f64 = (1u64 << 53) as f64;
    if x.is_nan() || x <= 1.0 {
        1.0
    } else if x >= WHOLE {
        x
    } else {
        let t = x as u64 as f64;
        if t < x {
            t + 1.0
        } else {
            t
        }
    }
}

/// The largest `c` with `c · m_k` in `(s_k - q, s_k]` for every `k`, if
/// one exists (whether the size can be proportional).
fn proportional(ms: &[f64], sizes: &[f64], q: f64) -> Option<f64> {
    let mut lo = f64::NEG_INFINITY;
    let mut hi = f64::INFINITY;
    for (&m, &s) in ms.iter().zip(sizes) {
        if m <= 0.0 {
            return None;
        }
        lo = lo.max((s - q) / m);
        hi = hi.min(s / m);
    }
    // Open below: equality means no `c` fits (a relative hair is float).
    (lo < hi * (1.0 - 1e-12)).then_some(hi)
}

/// Every `(a, c)` with `a + c · m_k` in `(s_k - q, s_k]` for every `k`
/// (and `a` in `intercept`, if given) forms a convex polygon; its vertices,
/// if it is not empty. The largest prediction at any `m` that a size
/// consistent with the shapes seen can make is the largest over these
/// vertices (a linear objective peaks at a vertex), so predicting from
/// them is safe.
fn vertices(
    ms: &[f64],
    sizes: &[f64],
    q: f64,
    intercept: Option<(f64, f64)>,
) -> Option<Vec<(f64, f64)>> {
    // Lines `a + c * m = bound` (`m` = NaN marks `a = bound`).
    let mut lines: Vec<(f64, f64)> = ms
        .iter()
        .zip(sizes)
        .flat_map(|(&m, &s)| [(m, s), (m, s - q)])
        .collect();
    if let Some((lo, hi)) = intercept {
        lines.extend([(f64::NAN, lo), (f64::NAN, hi)]);
    }
    let scale = sizes.iter().copied().fold(q, f64::max);
    let tol = 1e-9 * scale;
    if !slopes::agree(ms, sizes, q, tol) {
        return None;
    }
    let feasible = |a: f64, c: f64| {
        intercept.is_none_or(|(lo, hi)| a >= lo - tol && a <= hi + tol)
            && ms.iter().zip(sizes).all(|(&m, &s)| {
                let v = a + c * m;
                v <= s + tol && v >= s - q - tol
            })
    };
    let mut out = Vec::new();
    for (i, &(m1, b1)) in lines.iter().enumerate() {
        for &(m2, b2) in &lines[i + 1..] {
            let (a, c) = match (m1.is_nan(), m2.is_nan()) {
                (true, true) => continue,
                (true, false) | (false, true) => {
                    let (a, (m, b)) = if m1.is_nan() {
                        (b1, (m2, b2))
                    } else {
                        (b2, (m1, b1))
                    };
                    if m == 0.0 {
                        continue;
                    }
                    (a, (b - a) / m)
                }
                (false, false) => {
                    if (m1 - m2).abs() <= f64::EPSILON * m1.abs().max(m2.abs()) {
                        continue;
                    }
                    let c = (b1 - b2) / (m1 - m2);
                    (b1 - c * m1, c)
                }
            };
            if feasible(a, c) {
                out.push((a, c));
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

/// An affine size `a + c · m` consistent with the shapes seen: the
/// vertices of what they allow.
pub(super) fn affine(ms: &[f64], sizes: &[f64], q: f64) -> Option<Vec<(f64, f64)>> {
    vertices(ms, sizes, q, None)
}

/// A proportional size `c · m` consistent with the shapes seen, predicted
/// with an intercept of up to one quantum allowed (which the rounding
/// cannot tell from none: ONNX Runtime asks for some tensors' bytes plus
/// 64, which is a multiple of 64 at even widths and not at odd ones): the
/// vertices of what that allows.
pub(super) fn scaled(ms: &[f64], sizes: &[f64], q: f64) -> Option<Vec<(f64, f64)>> {
    proportional(ms, sizes, q)?;
    vertices(ms, sizes, q, Some((0.0, q)))
}

#[path = "fit_outlier.rs"]
mod outlier;
use outlier::monotone;
#[path = "fit_predict.rs"]
mod predict;
#[path = "fit_refit.rs"]
mod refit;
#[path = "fit_slopes.rs"]
mod slopes;
#[path = "fit_tiers.rs"]
mod tiers;

#[cfg(test)]
#[path = "fit_tests.rs"]
mod tests;
