//! Malformed files.

use super::*;

#[test]
fn missing_file() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("missing.safetensors");
    for mode in MODES {
        let err = Weights::open(&path, mode).unwrap_err();
        assert!(
            matches!(&err, WeightsError::NotFound { path: p } if p == &path),
            "{err:?}"
        );
        assert!(err.to_string().contains("missing.safetensors"), "{err}");
    }
}

#[test]
fn directory_is_not_a_weights_file() {
    let (_dir, dir) = temp_dir();
    let sub = dir.join("a_directory.safetensors");
    fs::create_dir(&sub).unwrap();
    for mode in MODES {
        let err = Weights::open(&sub, mode).unwrap_err();
        assert!(matches!(err, WeightsError::Io { .. }), "{err:?}");
        assert!(err.to_string().contains("a_directory.safetensors"), "{err}");
    }
}

#[test]
fn empty_file() {
    let err = open_err(&[], "empty.safetensors");
    assert!(
        matches!(err, WeightsError::FileTooSmall { len: 0, .. }),
        "{err:?}"
    );
}

#[test]
fn seven_byte_file() {
    let img = sample_image();
    let err = open_err(&img[..7], "seven.safetensors");
    assert!(
        matches!(err, WeightsError::FileTooSmall { len: 7, .. }),
        "{err:?}"
    );
}

#[test]
fn header_length_past_eof() {
    let img = sample_image();
    let n = u64::from_le_bytes(img[..8].try_into().unwrap()) as usize;

    // Cut inside the header.
    let err = open_err(&img[..8 + n - 1], "cut_header.safetensors");
    assert!(
        matches!(err, WeightsError::HeaderPastEof { header_len, file_len, .. }
            if header_len == n as u64 && file_len == (8 + n - 1) as u64),
        "{err:?}"
    );

    // Header length bigger than the file, but within the limit (the limit itself included).
    for len in [img.len() as u64, MAX_HEADER_LEN] {
        let mut bad = img.clone();
        bad[..8].copy_from_slice(&len.to_le_bytes());
        let err = open_err(&bad, "long_header.safetensors");
        assert!(matches!(err, WeightsError::HeaderPastEof { .. }), "{err:?}");
    }
}

#[test]
fn header_length_over_limit() {
    for len in [u64::MAX, MAX_HEADER_LEN + 1, 1 << 40] {
        let mut bad = sample_image();
        bad[..8].copy_from_slice(&len.to_le_bytes());
        let err = open_err(&bad, "huge_header.safetensors");
        assert!(
            matches!(err, WeightsError::HeaderTooLarge { header_len, .. } if header_len == len),
            "{err:?}"
        );
        assert!(err.to_string().contains("100000000"), "{err}");
    }
    // Just the 8 bytes, nothing else.
    let err = open_err(&u64::MAX.to_le_bytes(), "only_len.safetensors");
    assert!(
        matches!(err, WeightsError::HeaderTooLarge { .. }),
        "{err:?}"
    );
}

#[test]
fn header_not_utf8() {
    let mut bad = sample_image();
    bad[9] = 0xFF;
    let err = open_err(&bad, "not_utf8.safetensors");
    assert!(matches!(err, WeightsError::HeaderNotUtf8 { .. }), "{err:?}");
}

#[test]
fn bad_json() {
    let cases: [(&str, Vec<u8>); 5] = [
        ("syntax.safetensors", {
            let mut img = sample_image();
            img[8] = b'x'; // the opening brace
            img
        }),
        ("array.safetensors", image("[]", &[])),
        ("string_entry.safetensors", image(r#"{"a":"F32"}"#, &[])),
        (
            "missing_shape.safetensors",
            image(r#"{"a":{"dtype":"U8","data_offsets":[0,1]}}"#, &[0]),
        ),
        (
            "negative_offset.safetensors",
            image(
                r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}"#,
                &[0],
            ),
        ),
    ];
    for (name, img) in cases {
        let err = open_err(&img, name);
        assert!(
            matches!(err, WeightsError::BadJson { .. }),
            "{name}: {err:?}"
        );
    }
}

#[test]
fn unknown_dtype() {
    let bad = patch_header(sample_image(), r#""F32""#, r#""F31""#);
    let err = open_err(&bad, "unknown_dtype.safetensors");
    assert!(
        matches!(&err, WeightsError::UnknownDtype { tensor, dtype, .. }
            if dtype == "F31" && ["embed", "scalar", "empty"].contains(&tensor.as_str())),
        "{err:?}"
    );
    assert!(err.to_string().contains("F31"), "{err}");

    // Sub-byte dtypes are valid safetensors, but not supported here.
    let img = image(
        r#"{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}"#,
        &[0],
    );
    let err = open_err(&img, "f4.safetensors");
    assert!(
        matches!(&err, WeightsError::UnknownDtype { dtype, .. } if dtype == "F4"),
        "{err:?}"
    );
}

#[test]
fn duplicate_name_in_header() {
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#,
        &[1, 2],
    );
    let err = open_err(&img, "duplicate.safetensors");
    assert!(
        matches!(&err, WeightsError::DuplicateName { tensor, path: Some(_) } if tensor == "a"),
        "{err:?}"
    );
}

#[test]
fn offsets_out_of_range() {
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#,
        &[0; 6],
    );
    let err = open_err(&img, "out_of_range.safetensors");
    assert!(
        matches!(&err, WeightsError::OffsetsOutOfRange { tensor, start: 4, end: 8, data_len: 6, .. } if tensor == "b"),
        "{err:?}"
    );

    // Offsets near usize::MAX, chained so that every per-tensor check passes: the sum the
    // safetensors crate computes last would overflow.
    let step = 1u64 << 60;
    let entries: Vec<String> = (0..16u64)
        .map(|i| {
            let (start, end) = (i * step, if i == 15 { u64::MAX } else { (i + 1) * step });
            format!(
                r#""t{i:02}":{{"dtype":"U8","shape":[{}],"data_offsets":[{start},{end}]}}"#,
                end - start
            )
        })
        .collect();
    let img = image(&format!("{{{}}}", entries.join(",")), &[0; 16]);
    let err = open_err(&img, "near_usize_max.safetensors");
    assert!(
        matches!(err, WeightsError::OffsetsOutOfRange { .. }),
        "{err:?}"
    );
}

#[test]
fn truncated_data_section() {
    let img = sample_image();
    for cut in [1, 8, 40] {
        let err = open_err(&img[..img.len() - cut], "truncated_data.safetensors");
        assert!(
            matches!(err, WeightsError::OffsetsOutOfRange { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}

#[test]
fn trailing_bytes_after_last_tensor() {
    let mut img = sample_image();
    img.extend_from_slice(&[0; 3]);
    let err = open_err(&img, "trailing.safetensors");
    assert!(matches!(err, WeightsError::TrailingBytes { .. }), "{err:?}");
    assert!(
        err.to_string().contains("3 bytes after the last tensor"),
        "{err}"
    );
}

#[test]
fn overlapping_offsets() {
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#,
        &[0; 6],
    );
    let err = open_err(&img, "overlap.safetensors");
    assert!(
        matches!(&err, WeightsError::OverlappingTensors { tensor, other, .. } if tensor == "b" && other == "a"),
        "{err:?}"
    );

    // Same bytes claimed twice.
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#,
        &[0; 4],
    );
    let err = open_err(&img, "same_range.safetensors");
    assert!(
        matches!(err, WeightsError::OverlappingTensors { .. }),
        "{err:?}"
    );
}

#[test]
fn gap_between_tensors() {
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}"#,
        &[0; 6],
    );
    let err = open_err(&img, "gap.safetensors");
    assert!(
        matches!(&err, WeightsError::GapBeforeTensor { tensor, gap_start: 2, gap_end: 4, .. } if tensor == "b"),
        "{err:?}"
    );

    // A gap before the first tensor.
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}"#,
        &[0; 4],
    );
    let err = open_err(&img, "gap_first.safetensors");
    assert!(
        matches!(
            &err,
            WeightsError::GapBeforeTensor {
                gap_start: 0,
                gap_end: 2,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn reversed_offsets() {
    let img = image(
        r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,0]}}"#,
        &[0; 2],
    );
    let err = open_err(&img, "reversed.safetensors");
    assert!(
        matches!(&err, WeightsError::InvalidOffsets { tensor, start: 2, end: 0, .. } if tensor == "b"),
        "{err:?}"
    );
}

#[test]
fn dtype_shape_length_mismatch() {
    // Shape edited in a crate-written file: "embed" claims [4,4] F32 = 64 bytes, has 48.
    let bad = patch_header(sample_image(), "[4,3]", "[4,4]");
    let err = open_err(&bad, "shape_mismatch.safetensors");
    assert!(
        matches!(&err, WeightsError::LengthMismatch { tensor, dtype: Dtype::F32, expected: Some(64), actual: 48, .. }
            if tensor == "embed"),
        "{err:?}"
    );
    assert!(err.to_string().contains("`embed`"), "{err}");

    // Dtype edited: "ids" (I64, 16 bytes) claimed as I32 (8 bytes).
    let bad = patch_header(sample_image(), r#""I64""#, r#""I32""#);
    let err = open_err(&bad, "dtype_mismatch.safetensors");
    assert!(
        matches!(&err, WeightsError::LengthMismatch { tensor, expected: Some(8), actual: 16, .. } if tensor == "ids"),
        "{err:?}"
    );

    // A shape whose byte size overflows.
    let img = image(
        r#"{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
        &[0; 8],
    );
    let err = open_err(&img, "shape_overflow.safetensors");
    assert!(
        matches!(err, WeightsError::LengthMismatch { expected: None, .. }),
        "{err:?}"
    );
}
