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
                        let fits: Vec<_> = fits
                            .iter()
                            .filter_map(|(m, _)| {
                                scaled(&values(m), &sizes, q).map(|v| (m.clone(), v))
                            })
                            .collect();
                        (!fits.is_empty()).then_some(SizeModel::Scaled(fits))
                    }
                    Some(SizeModel::Affine(fits)) => {
                        let fits: Vec<_> = fits
                            .iter()
                            .filter_map(|(m, _)| {
                                affine(&values(m), &sizes, q).map(|v| (m.clone(), v))
                            })
                            .collect();
                        (!fits.is_empty()).then_some(SizeModel::Affine(fits))
                    }
                    _ => None,
                };
                kept.or_else(|| {
                    let tiers = tiers.get_or_insert_with(|| tiers_for(&varied, obs));
                    model_of(obs, b, tiers, q, volume_min, volume_max)
                })
            })
            .collect();
        Fit::assemble(obs, models, varied, quantum)
    }
}
