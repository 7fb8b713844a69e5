//! Parsing `--inputs`: `1x3x48x320`, or `name=SHAPE,name=SHAPE`.

use tensor_arena_ort::InputSpec;

/// One run's inputs as written: `(name, dims)`, name `None` for a bare
/// shape.
pub type RunInputs = Vec<(Option<String>, Vec<usize>)>;

/// Parses one `--inputs` argument.
pub fn parse_run(s: &str) -> Result<RunInputs, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let (name, shape) = match part.split_once('=') {
            Some((n, sh)) if !n.is_empty() => (Some(n.to_string()), sh),
            Some(_) => return Err(format!("`{s}`: empty input name")),
            None => (None, part),
        };
        out.push((name, parse_shape(shape).map_err(|e| format!("`{s}`: {e}"))?));
    }
    if out.len() > 1 && out.iter().any(|(n, _)| n.is_none()) {
        return Err(format!(
            "`{s}`: with several inputs, write name=SHAPE for each"
        ));
    }
    Ok(out)
}

/// Parses `1x3x48x320` (every dimension at least 1, the product bounded).
pub fn parse_shape(s: &str) -> Result<Vec<usize>, String> {
    let dims: Vec<usize> = s
        .split('x')
        .map(|d| {
            d.trim().parse::<usize>().map_err(|_| {
                format!("bad shape `{s}`: dimensions are positive integers joined by `x`")
            })
        })
        .collect::<Result<_, _>>()?;
    if dims.contains(&0) {
        return Err(format!("bad shape `{s}`: a dimension is 0"));
    }
    let elems = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
        .filter(|&n| n <= 1 << 32)
        .ok_or_else(|| format!("bad shape `{s}`: more than 2^32 elements"))?;
    let _ = elems;
    Ok(dims)
}

/// Matches parsed inputs to the model's: a bare shape goes to the one input
/// with free dimensions; inputs left out must be fully fixed by the model.
pub fn resolve(run: &RunInputs, specs: &[InputSpec]) -> Result<Vec<(String, Vec<usize>)>, String> {
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    for (name, dims) in run {
        let name = match name {
            Some(n) => n.clone(),
            None => {
                let free: Vec<&InputSpec> = specs
                    .iter()
                    .filter(|s| s.dims.iter().any(|&d| d < 0))
                    .collect();
                match free.as_slice() {
                    [one] => one.name.clone(),
                    [] if specs.len() == 1 => specs[0].name.clone(),
                    _ => {
                        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
                        return Err(format!(
                            "the model has several inputs ({}): write name=SHAPE",
                            names.join(", ")
                        ));
                    }
                }
            }
        };
        out.push((name, dims.clone()));
    }
    for spec in specs {
        if out.iter().any(|(n, _)| *n == spec.name) {
            continue;
        }
        if spec.dims.iter().all(|&d| d > 0) {
            out.push((
                spec.name.clone(),
                spec.dims.iter().map(|&d| d as usize).collect(),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_shapes_and_names() {
        assert_eq!(
            parse_run("1x3x48x320").unwrap(),
            vec![(None, vec![1, 3, 48, 320])]
        );
        assert_eq!(
            parse_run("a=2x3,b=4").unwrap(),
            vec![(Some("a".into()), vec![2, 3]), (Some("b".into()), vec![4])]
        );
        for bad in [
            "",
            "1xx2",
            "0x3",
            "a=",
            "=3",
            "2x3,4",
            "-1x2",
            "99999999x99999999",
        ] {
            assert!(parse_run(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bare_shape_goes_to_the_free_input() {
        let specs = vec![
            InputSpec {
                name: "input".into(),
                dims: vec![-1, 576],
                elem: None,
            },
            InputSpec {
                name: "h".into(),
                dims: vec![1, 1, 128],
                elem: None,
            },
        ];
        let r = resolve(&parse_run("4x576").unwrap(), &specs).unwrap();
        assert_eq!(
            r,
            vec![
                ("input".into(), vec![4, 576]),
                ("h".into(), vec![1, 1, 128])
            ]
        );
    }
}
