//! What the child checks against the model before running anything: every
//! run's inputs (names, shapes, types it can fill), the `--value`s, and the
//! outputs' types (they are hashed to compare the strategies). A failed
//! check is bad input: exit code 2, nothing run.

use super::shapes;
use super::values::{self, ValueSpec, SUPPORTED};
use tensor_arena_ort::ort::value::ValueType;
use tensor_arena_ort::InputSpec;

/// One run's inputs, resolved against the model: `(name, dims)`.
pub type Resolved = Vec<(String, Vec<usize>)>;

/// Resolves and checks every run's inputs and the `--value`s.
pub fn inputs(
    labels: &[String],
    runs: &[shapes::RunInputs],
    specs: &[InputSpec],
    given: &[ValueSpec],
) -> Result<Vec<Resolved>, String> {
    for v in given {
        values::check(v, specs)?;
    }
    let mut resolved = Vec::new();
    for (label, run) in labels.iter().zip(runs) {
        let r = shapes::resolve(run, specs)?;
        for (name, dims) in &r {
            let Some(spec) = specs.iter().find(|s| s.name == *name) else {
                return Err(tensor_arena_ort::OrtArenaError::UnknownInput {
                    name: name.clone(),
                    known: specs.iter().map(|s| s.name.clone()).collect(),
                }
                .to_string());
            };
            spec.check(dims).map_err(|e| e.to_string())?;
            match spec.elem {
                Some(ty) if values::supported(ty) => {}
                Some(ty) => {
                    return Err(format!(
                        "input {name:?} is a tensor of {ty}: tensor-arena ort generates inputs only for tensors of {SUPPORTED}"
                    ))
                }
                None => {
                    return Err(format!(
                        "input {name:?} is not a tensor: tensor-arena ort generates inputs only for tensors of {SUPPORTED}"
                    ))
                }
            }
        }
        if let Some(missing) = specs.iter().find(|s| !r.iter().any(|(n, _)| *n == s.name)) {
            return Err(format!(
                "run `{label}`: no shape for input {:?}, whose dimensions {:?} are not all fixed (-1 = free): write {}=SHAPE",
                missing.name, missing.dims, missing.name
            ));
        }
        resolved.push(r);
    }
    Ok(resolved)
}

/// Checks that every output can be hashed: a tensor of a supported type.
pub fn outputs(outputs: &[tensor_arena_ort::ort::value::Outlet]) -> Result<(), String> {
    for o in outputs {
        let what = match o.dtype() {
            ValueType::Tensor { ty, .. } if values::supported(*ty) => continue,
            ValueType::Tensor { ty, .. } => format!("a tensor of {ty}"),
            other => format!("not a tensor ({other})"),
        };
        return Err(format!(
            "output {:?} is {what}: the outputs are hashed to compare the strategies, and only tensors of {SUPPORTED} can be",
            o.name()
        ));
    }
    Ok(())
}
