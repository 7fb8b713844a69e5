//! Fitting again as shapes come, block by block ([`Fit::refit`]).

use super::*;

impl Fit {
    /// The fit of `obs` (this fit's shapes, and more), made from this one:
    /// where the dimensions that vary and the quantum are this fit's, each
    /// block keeps those of its model's monomials that still explain every
    /// shape, and only a block whose model the shapes contradict (or that
    /// has none) is fitted from scratch. More shapes only rule monomials
    /// out, never in, so this is the fit [`Fit::new`] makes, for the price
    /// of the blocks that changed; where the frame changed it is
    /// [`Fit::new`].
    pub(crate) fn refit(&self, obs: &[Observation], rounding: usize) -> Fit {
        let (varied, quantum) = Fit::frame(obs, rounding);
        let blocks = obs[0].sizes.len();
        if varied != self.varied || quantum != self.quantum || blocks != self.models.len() {
            return Fit::new(obs, rounding);
        }
        let q = quantum as f64;
        let (volume_min, volume_max) = volume_range(obs, &varied);
        // Built only if a block must be fitted from scratch.
        let mut tiers: Option<Vec<Tier>> = None;
        let grows = outlier::monotone(obs, quantum);
        let mut all_but_one = outlier::AllButOne::new(obs, &varied, q, grows);
        let models = (0..blocks)
            .map(|b| {
                let sizes: Vec<f64> = obs.iter().map(|o| o.sizes[b] as f64).collect();
                let values =
                    |m: &Monomial| -> Vec<f64> { obs.iter().map(|o| m.eval(&o.dims)).collect() };
                let kept = match &self.models[b] {
                    Some(SizeModel::Const { size, .. })
                        if obs.iter().all(|o| o.sizes[b] == *size) =>
                    {
                        let spread = *size as f64 * (1.0 - volume_min / volume_max);
                        let small = volume_max > 0.0 && spread < q;
                        Some(SizeModel::Const { size: *size, small })
                    }
                    Some(SizeModel::Scaled(fits)) => {
                        let kept: Vec<_> = fits
                            .iter()
                            .filter(|(m, _)| !m.coarse(obs))
                            .filter_map(|(m, _)| {
                                scaled(&values(m), &sizes, q).map(|v| (m.clone(), v))
                            })
                            .collect();
                        every_tier_kept(fits, &kept).then_some(SizeModel::Scaled(kept))
                    }
                    Some(SizeModel::Affine(fits)) => {
                        let kept: Vec<_> = fits
                            .iter()
                            .filter(|(m, _)| !m.coarse(obs))
                            .filter_map(|(m, _)| {
                                affine(&values(m), &sizes, q).map(|v| (m.clone(), v))
                            })
                            .collect();
                        every_tier_kept(fits, &kept).then_some(SizeModel::Affine(kept))
                    }
                    _ => None,
                };
                kept.or_else(|| {
                    let tiers = tiers.get_or_insert_with(|| tiers_for(&varied, obs));
                    model_of(obs, b, tiers, q, volume_min, volume_max)
                })
                .or_else(|| all_but_one.model(b))
            })
            .collect();
        Fit::assemble(obs, models, varied, quantum, grows)
    }
}

/// Whether `kept` (what of `fits` still explains every shape, in order)
/// is the block's model made afresh: one tier before and after. A tier
/// left with none may still be explained by strided variants the first
/// fit did not keep (it kept the least strided only), and tiers the shapes
/// could not tell apart may be told apart now, or fit only within the
/// rounding: the block is then fitted from scratch, as [`Fit::new`] would
/// (rare: where dimensions varied together).
fn every_tier_kept(
    fits: &[(Monomial, Vec<(f64, f64)>)],
    kept: &[(Monomial, Vec<(f64, f64)>)],
) -> bool {
    let tiers = |f: &[(Monomial, Vec<(f64, f64)>)]| {
        let mut out: Vec<&Monomial> = Vec::new();
        for (m, _) in f {
            if out.last().is_none_or(|last| !last.same_tier(m)) {
                out.push(m);
            }
        }
        out.len()
    };
    tiers(fits) == 1 && tiers(kept) == 1
}
