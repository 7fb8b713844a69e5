//! What a [`Fit`] predicts at a key ([`Fit::predict`]): each block's size,
//! the models the shapes seen cannot tell apart where they disagree, and
//! the dimensions that never varied but that the sizes show they follow.

use super::*;

/// A fit's prediction at a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Predicted {
    /// Each block's size: the largest any model that explains the shapes
    /// seen gives (a block that follows its model fits its slot).
    pub(crate) sizes: Vec<usize>,
    /// Where models that explain the shapes seen equally well (tiers of one
    /// class: dimensions that only varied together) disagree at the key,
    /// each block's least size over them; `None` where they all agree.
    pub(crate) least: Option<Vec<usize>>,
}

impl Fit {
    /// Every block's predicted size at `dims`, or why there is none: a
    /// block has no model (over every shape seen, or over the shapes
    /// nearest to `dims`), the key has other dimensions than the shapes
    /// seen, changes one that never varied and that the sizes do not show
    /// they follow ([`Fit::unvaried_scale`]), or a prediction is not a
    /// size.
    pub(crate) fn predict(&self, dims: &[u64]) -> Result<Predicted, NoPrediction> {
        if dims.len() != self.base.len() {
            return Err(NoPrediction::Unpredictable);
        }
        if !self.monotone {
            return Err(NoPrediction::Unfit);
        }
        let scale = self.unvaried_scale(dims)?;
        let q = self.quantum as f64;
        let grown = if self.volume_max > 0.0 {
            (volume(dims, &self.varied) / self.volume_max).max(1.0)
        } else {
            1.0
        };
        let below = self.below_range(dims);
        let mut near: Option<Near> = None;
        let mut sizes = Vec::with_capacity(self.models.len());
        let mut least: Option<Vec<usize>> = None;
        for (b, m) in self.models.iter().enumerate() {
            let range = |m: &SizeModel| match m {
                SizeModel::Const { size, small } => {
                    let grown = if *small { grown } else { 1.0 };
                    let bytes = *size as f64 * grown;
                    // Below the range it was seen constant over, a
                    // constant is as well explained by a size that
                    // follows the dimension that moved (a buffer padded
                    // to a bucket or doubled past the length).
                    (bytes, bytes * below_outside(below.as_deref(), &[]))
                }
                SizeModel::Scaled(fits) | SizeModel::Affine(fits) => {
                    tier_range(fits, dims, |m| below_outside(below.as_deref(), &m.0))
                }
            };
            let (most, fewest) = match m {
                Some(m) => range(m),
                // Local models: the largest and the least over them.
                None => near
                    .get_or_insert_with(|| self.near(dims))
                    .models(b)
                    .iter()
                    .map(range)
                    .reduce(|(a, b), (c, d)| (a.max(c), b.min(d)))
                    .ok_or(NoPrediction::Unfit)?,
            };
            let factor = scale.as_ref().map_or(1.0, |s| s[b]);
            let size = to_size(most * factor, q).ok_or(NoPrediction::Unpredictable)?;
            // (The least is never above the largest: where they are one,
            // so are their sizes.)
            let low = if fewest < most {
                to_size(fewest * factor, q).ok_or(NoPrediction::Unpredictable)?
            } else {
                size
            };
            if low < size && least.is_none() {
                least = Some(sizes.clone());
            }
            if let Some(least) = least.as_mut() {
                least.push(low);
            }
            sizes.push(size);
        }
        Ok(Predicted { sizes, least })
    }

    /// How far below the range of the shapes seen a key lies, dimension by
    /// dimension, as the factor a size that followed the dimension would
    /// shrink by: for a varying dimension whose value at `dims` is under
    /// every value seen, `dims[d] / min_d`, counted only where the key
    /// reaches further below the least value seen than the shapes seen
    /// span (`min_d / dims[d] > max_d / min_d`); 1 where it does not;
    /// `None` where it is 1 in every dimension (a key within the range
    /// seen, mostly). A model's factor is the product over the dimensions
    /// it leaves out ([`below_outside`]).
    ///
    /// A block the same size at every shape seen may be a constant (a
    /// model's state) or a size padded to a bucket, or doubled as it
    /// grows, that the shapes seen all fell in (K/V buffers of 2,048
    /// tokens at lengths 1,025 and 1,030): which it is, only a shape in
    /// another bucket tells. Seen constant over a range as wide as the
    /// step down to the key, it is taken as constant; further below, the
    /// constant and a size that follows the dimension that moved are two
    /// models the shapes cannot tell apart, and the prediction says both
    /// (`Predicted::least`): its family predicts the constant only where
    /// that costs no more than the least, and refuses the key otherwise.
    /// So with a block fitted by a model that leaves a varying dimension
    /// out (affine in the batch, where the sequence moved with it): far
    /// below the sequences seen, the sequence may be what it follows too
    /// (a block in the cube of the sequence, seen at three shapes whose
    /// batches it happened to fit).
    fn below_range(&self, dims: &[u64]) -> Option<Vec<f64>> {
        let mut factors = vec![1.0f64; dims.len()];
        for (d, &now) in dims.iter().enumerate() {
            if !self.varied[d] {
                continue;
            }
            let (lo, hi) = self
                .obs
                .iter()
                .map(|o| o.dims[d])
                .fold((u64::MAX, 0u64), |(lo, hi), v| (lo.min(v), hi.max(v)));
            if now >= lo || lo == 0 {
                continue;
            }
            let (now, lo, hi) = (now as f64, lo as f64, hi as f64);
            if lo / now.max(1.0) > hi / lo {
                factors[d] = now / lo;
            }
        }
        factors.iter().any(|&x| x != 1.0).then_some(factors)
    }

    /// How a key that changes dimensions that never varied among the shapes
    /// seen scales each block: `None` where it changes none. A dimension
    /// that never varied says nothing by how sizes moved; but sizes are
    /// products of the input's dimensions, so a block whose every size
    /// seen is a multiple of the dimension's value (or of a strided
    /// variant of it, `ceil(h / 4)`) that has a prime factor of 11 or more
    /// (which a size has by chance about as rarely as it divides it)
    /// follows it: `736` (`23 · 32`) in every size of a feature map of a
    /// 736-high image. Such a block scales by the dimension's growth (the
    /// largest among the variants that divide it); a constant block stays;
    /// a block that varied with the other dimensions and shows no such
    /// factor stays too (it falls back if it grows). Where those hold more
    /// than an eighth of the varying blocks' bytes, or the dimension's
    /// value has no such factor (1, a power of two, 192 = 3 x 64: nothing
    /// to tell), the key is not predicted ([`NoPrediction::Unvaried`]): its
    /// run teaches the family.
    pub(crate) fn unvaried_scale(&self, dims: &[u64]) -> Result<Option<Vec<f64>>, NoPrediction> {
        let changed: Vec<usize> = (0..dims.len())
            .filter(|&d| !self.varied[d] && dims[d] != self.base[d])
            .collect();
        if changed.is_empty() {
            return Ok(None);
        }
        let mut scale = vec![1.0f64; self.models.len()];
        let (mut varying, mut unexplained) = (0u128, 0u128);
        for (b, factor) in scale.iter_mut().enumerate() {
            if matches!(self.models[b], Some(SizeModel::Const { .. })) {
                continue;
            }
            let bytes = self.obs.iter().map(|o| o.sizes[b]).max().unwrap_or(0) as u128;
            varying += bytes;
            let growth = changed.iter().try_fold(1.0f64, |acc, &d| {
                self.follows(b, self.base[d], dims[d]).map(|g| acc * g)
            });
            match growth {
                Some(g) => *factor = g,
                None => unexplained += bytes,
            }
        }
        if varying == 0 || unexplained * 8 > varying {
            return Err(NoPrediction::Unvaried);
        }
        Ok(Some(scale))
    }

    /// If every size seen of block `b` is a multiple of a strided variant
    /// of `seen` (a dimension's value at every shape seen) of at least 4
    /// with a telling factor ([`telling`]) (or such a multiple plus one intercept under
    /// a quantum, the variant being over a quantum), the block's growth
    /// when the dimension becomes `now`: the largest over such variants.
    /// Which stride a block follows is unknown (channel counts are powers
    /// of two, so a map at stride 32 is a multiple of the full width too),
    /// and a slot too large costs bytes where one too small falls back:
    /// `192` becoming `100` scales by `ceil(100 / 32) / 6`, two thirds.
    fn follows(&self, b: usize, seen: u64, now: u64) -> Option<f64> {
        let mut best: Option<f64> = None;
        for shift in 0..=MAX_SHIFT {
            let top = (1u64 << shift) - 1;
            for offset in [0, top] {
                let g = seen.saturating_add(offset) >> shift;
                if g < 4 || !telling(g) {
                    continue;
                }
                // The same remainder at every shape: none, or an intercept
                // under a quantum (ONNX Runtime asks for some tensors'
                // bytes plus 64), which a variant under a quantum would
                // always leave.
                let rest = self.obs[0].sizes[b] as u64 % g;
                let q = self.quantum as u64;
                let same = self.obs.iter().all(|o| o.sizes[b] as u64 % g == rest);
                if same && (rest == 0 || (rest <= q && g > q)) {
                    let growth = (now.saturating_add(offset) >> shift) as f64 / g as f64;
                    best = Some(best.map_or(growth, |x: f64| x.max(growth)));
                }
            }
        }
        best
    }
}

/// The product of `factors` ([`Fit::below_range`]) over the dimensions no
/// factor of a monomial (`factors_of`) multiplies: 1 for none.
fn below_outside(factors: Option<&[f64]>, factors_of: &[Factor]) -> f64 {
    let Some(factors) = factors else {
        return 1.0;
    };
    factors
        .iter()
        .enumerate()
        .filter(|&(d, _)| !factors_of.iter().any(|f| usize::from(f.dim) == d))
        .map(|(_, &x)| x)
        .product()
}

/// Whether `g` has a prime factor of 11 or more: one that a tensor's size
/// has by chance about as rarely as it divides it. Channel counts are
/// powers of two times 3, 5, 7 or 9 (96, 160, 112, 576 in MobileNetV3): a
/// width of 192 (3 x 64) divides the size of a per-channel block that does
/// not follow it, and one of 736 (23 x 32) does not.
fn telling(g: u64) -> bool {
    let mut n = g >> g.trailing_zeros();
    let mut largest = 1;
    let mut p = 3;
    while p * p <= n && p < 1 << 16 {
        while n % p == 0 {
            largest = p;
            n /= p;
        }
        p += 2;
    }
    largest.max(n) >= 11
}

/// The largest and the least, over the tiers among `fits` (consecutive
/// runs of one tier's strided variants of one stride count), of each
/// tier's largest prediction at `dims`: equal where one tier explains the
/// shapes, apart where tiers of one degree (or a strided fit and its
/// twin divided further) do and disagree at `dims`. A tier's least is its
/// prediction times `below` of its monomial (how far a key lies below the
/// shapes seen in the dimensions the tier leaves out).
pub(super) fn tier_range(
    fits: &[(Monomial, Vec<(f64, f64)>)],
    dims: &[u64],
    below: impl Fn(&Monomial) -> f64,
) -> (f64, f64) {
    let (mut most, mut fewest) = (0.0f64, f64::INFINITY);
    let mut tier: Option<(&Monomial, f64)> = None;
    let mut close = |m: &Monomial, top: f64| {
        most = most.max(top);
        fewest = fewest.min(top * below(m));
    };
    for (m, vertices) in fits {
        let x = m.eval(dims);
        let v = vertices
            .iter()
            .map(|(a, c)| a + c * x)
            .fold(f64::NEG_INFINITY, f64::max);
        tier = match tier {
            // A tier's twins divided by more strides are another model
            // (`least_strided`), not the same one's slack.
            Some((first, top)) if first.same_tier(m) && first.strides() == m.strides() => {
                Some((first, top.max(v)))
            }
            Some((first, top)) => {
                close(first, top);
                Some((m, v))
            }
            None => Some((m, v)),
        };
    }
    if let Some((first, top)) = tier {
        close(first, top);
    }
    if fewest.is_infinite() {
        fewest = most;
    }
    (most.max(0.0), fewest.max(0.0))
}
