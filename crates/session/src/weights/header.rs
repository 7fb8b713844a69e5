//! The safetensors validator: the one place that reads a file's layout.
//!
//! A file is `u64` little-endian header length `n`, `n` bytes of UTF-8 JSON, then the data
//! section. The JSON maps tensor names to `{"dtype", "shape", "data_offsets": [start, end]}`
//! (offsets relative to the data section), plus an optional `"__metadata__"` map of strings.
//! The tensors must cover the data section exactly: contiguous from offset 0, without gaps,
//! overlaps or trailing bytes, each `product(shape) * dtype size` bytes long. This is the
//! format the `safetensors` crate reads and writes; `tests/weights/` checks that every file
//! it accepts, we accept with the same tensors, and that we reject all it rejects.
//!
//! Checks run in this order, and the first failure is reported:
//! 1. the length prefix and header length ([`MAX_HEADER_LEN`], not past the end of the file);
//! 2. UTF-8, then the JSON and its shape (every entry has the three fields, of the right
//!    types; `__metadata__` holds strings);
//! 3. repeated tensor names (a JSON parser would let the last silently win);
//! 4. per tensor, in header order: a known whole-byte dtype, offsets within the data section;
//! 5. in offset order (ties by name): offsets not reversed, no overlap, no gap, the length
//!    the dtype and shape call for; then no bytes after the last tensor.
//!
//! Every offset is compared with the data section's length before any sum, so no input can
//! overflow, and only validated ranges become [`Entry`]s.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;

use serde::de::{self, MapAccess, Visitor};
use serde::Deserialize;

use super::{Dtype, Entry, WeightsError, MAX_HEADER_LEN};

/// Size of the little-endian `u64` header length that opens every safetensors file.
const LEN_PREFIX: usize = 8;

/// The key of the optional free-form string map in a safetensors header; not a tensor.
const METADATA_KEY: &str = "__metadata__";

/// One tensor's description as written in the header (the safetensors crate's `TensorInfo`,
/// with the dtype kept as text so that an unknown one is reported with its tensor's name).
#[derive(Deserialize)]
struct RawInfo {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// The parsed header: tensors in header order, and the first repeated name.
struct Header {
    tensors: Vec<(String, RawInfo)>,
    duplicate: Option<String>,
}

impl<'de> Deserialize<'de> for Header {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HeaderVisitor;

        impl<'de> Visitor<'de> for HeaderVisitor {
            type Value = Header;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object mapping tensor names to tensor descriptions")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Header, A::Error> {
                let mut names = HashSet::new();
                let mut tensors = Vec::new();
                let mut duplicate = None;
                let mut metadata_seen = false;
                while let Some(key) = map.next_key::<String>()? {
                    if key == METADATA_KEY {
                        if std::mem::replace(&mut metadata_seen, true) {
                            return Err(de::Error::duplicate_field(METADATA_KEY));
                        }
                        map.next_value::<Option<HashMap<String, String>>>()?;
                        continue;
                    }
                    let info = map
                        .next_value::<RawInfo>()
                        .map_err(|e| de::Error::custom(format_args!("tensor `{key}`: {e}")))?;
                    if names.insert(key.clone()) {
                        tensors.push((key, info));
                    } else {
                        duplicate.get_or_insert(key);
                    }
                }
                Ok(Header { tensors, duplicate })
            }
        }

        deserializer.deserialize_map(HeaderVisitor)
    }
}

/// A tensor whose dtype is known and whose offsets lie within the data section.
struct Placed {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    start: usize,
    end: usize,
}

/// Validates a whole safetensors file image and returns its tensors, with byte ranges
/// relative to the start of `bytes` (so within it).
pub(super) fn parse_file(bytes: &[u8], path: &Path) -> Result<Vec<Entry>, WeightsError> {
    let path_buf = || path.to_path_buf();
    let file_len = bytes.len();

    // 1. Length prefix and header length.
    let Some((len_bytes, rest)) = bytes.split_first_chunk::<LEN_PREFIX>() else {
        return Err(WeightsError::FileTooSmall {
            path: path_buf(),
            len: file_len as u64,
        });
    };
    let header_len = u64::from_le_bytes(*len_bytes);
    if header_len > MAX_HEADER_LEN {
        return Err(WeightsError::HeaderTooLarge {
            path: path_buf(),
            header_len,
        });
    }
    let past_eof = || WeightsError::HeaderPastEof {
        path: path_buf(),
        header_len,
        file_len: file_len as u64,
    };
    let n = usize::try_from(header_len).map_err(|_| past_eof())?;
    let header = rest.get(..n).ok_or_else(past_eof)?;
    let header_end = LEN_PREFIX + n; // <= file_len, so no overflow
    let data_len = file_len - header_end;

    // 2. UTF-8 and JSON.
    let text = std::str::from_utf8(header).map_err(|source| WeightsError::HeaderNotUtf8 {
        path: path_buf(),
        source,
    })?;
    let header: Header = serde_json::from_str(text).map_err(|e| WeightsError::BadJson {
        path: path_buf(),
        message: e.to_string(),
    })?;

    // 3. Repeated names.
    if let Some(tensor) = header.duplicate {
        return Err(WeightsError::DuplicateName {
            path: Some(path_buf()),
            tensor,
        });
    }

    // 4. Per tensor: dtype, offsets within the data section.
    let mut placed = Vec::with_capacity(header.tensors.len());
    for (name, info) in header.tensors {
        let Some(dtype) = Dtype::from_name(&info.dtype) else {
            return Err(WeightsError::UnknownDtype {
                path: path_buf(),
                tensor: name,
                dtype: info.dtype,
            });
        };
        let (start, end) = info.data_offsets;
        let within = |offset: u64| usize::try_from(offset).ok().filter(|&o| o <= data_len);
        let (Some(start), Some(end)) = (within(start), within(end)) else {
            return Err(WeightsError::OffsetsOutOfRange {
                path: path_buf(),
                tensor: name,
                start,
                end,
                data_len: data_len as u64,
            });
        };
        placed.push(Placed {
            name,
            dtype,
            shape: info.shape,
            start,
            end,
        });
    }

    // 5. Layout, in offset order.
    placed.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    let mut prev: Option<&str> = None;
    let mut prev_end = 0usize;
    for t in &placed {
        if t.end < t.start {
            return Err(WeightsError::InvalidOffsets {
                path: path_buf(),
                tensor: t.name.clone(),
                start: t.start as u64,
                end: t.end as u64,
            });
        }
        if t.start < prev_end {
            return Err(WeightsError::OverlappingTensors {
                path: path_buf(),
                tensor: t.name.clone(),
                other: prev.unwrap_or_default().to_owned(),
            });
        }
        if t.start > prev_end {
            return Err(WeightsError::GapBeforeTensor {
                path: path_buf(),
                tensor: t.name.clone(),
                gap_start: prev_end as u64,
                gap_end: t.start as u64,
            });
        }
        let (shape, expected) = shape_and_len(t.dtype, &t.shape);
        if expected != Some(t.end - t.start) {
            return Err(WeightsError::LengthMismatch {
                path: Some(path_buf()),
                tensor: t.name.clone(),
                dtype: t.dtype,
                shape,
                expected,
                actual: (t.end - t.start) as u64,
            });
        }
        prev = Some(&t.name);
        prev_end = t.end;
    }
    if prev_end != data_len {
        return Err(WeightsError::TrailingBytes {
            path: path_buf(),
            data_end: prev_end as u64,
            data_len: data_len as u64,
        });
    }

    Ok(placed
        .into_iter()
        .map(|t| Entry {
            shape: shape_and_len(t.dtype, &t.shape).0,
            range: header_end + t.start..header_end + t.end, // both <= file_len
            name: t.name,
            dtype: t.dtype,
        })
        .collect())
}

/// The shape as `usize`s (a dimension too large shows as `usize::MAX`) and the byte length it
/// calls for (`None` if a dimension does not fit or the product overflows).
fn shape_and_len(dtype: Dtype, dims: &[u64]) -> (Vec<usize>, Option<usize>) {
    let exact: Option<Vec<usize>> = dims.iter().map(|&d| usize::try_from(d).ok()).collect();
    match exact {
        Some(shape) => {
            let len = dtype.byte_len(&shape);
            (shape, len)
        }
        None => {
            let shape = dims
                .iter()
                .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
                .collect();
            (shape, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_image(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    fn parse(header: &str, data: usize) -> Result<Vec<Entry>, WeightsError> {
        parse_file(
            &file_image(header, &vec![0; data]),
            Path::new("x.safetensors"),
        )
    }

    /// The safetensors crate's verdict on the same image (a panic counts as a rejection).
    fn crate_accepts(header: &str, data: usize) -> bool {
        let img = file_image(header, &vec![0; data]);
        std::panic::catch_unwind(|| safetensors::SafeTensors::deserialize(&img).is_ok())
            .unwrap_or(false)
    }

    #[test]
    fn parse_rejects_offsets_near_usize_max_without_overflow() {
        // Offsets chained up to usize::MAX: a final `end + header + 8` sum would overflow.
        let mut header = String::from("{");
        let step = 1usize << 60;
        for i in 0..16usize {
            let start = i * step;
            let end = if i == 15 { usize::MAX } else { start + step };
            if i > 0 {
                header.push(',');
            }
            header.push_str(&format!(
                "\"t{i}\":{{\"dtype\":\"U8\",\"shape\":[{}],\"data_offsets\":[{start},{end}]}}",
                end - start
            ));
        }
        header.push('}');
        let err = parse(&header, 8).unwrap_err();
        assert!(
            matches!(err, WeightsError::OffsetsOutOfRange { .. }),
            "{err}"
        );
    }

    #[test]
    fn layout_problems_name_the_tensor() {
        let u8s = |name: &str, len: usize, start: usize, end: usize| {
            format!(r#""{name}":{{"dtype":"U8","shape":[{len}],"data_offsets":[{start},{end}]}}"#)
        };
        let parse = |entries: &[String], data: usize| {
            parse(&format!("{{{}}}", entries.join(",")), data).unwrap_err()
        };
        let err = parse(&[u8s("a", 4, 0, 4), u8s("b", 4, 2, 6)], 6);
        assert!(
            matches!(&err, WeightsError::OverlappingTensors { tensor, other, .. } if tensor == "b" && other == "a"),
            "{err:?}"
        );
        let err = parse(&[u8s("a", 2, 0, 2), u8s("b", 2, 4, 6)], 6);
        assert!(
            matches!(&err, WeightsError::GapBeforeTensor { tensor, gap_start: 2, gap_end: 4, .. } if tensor == "b"),
            "{err:?}"
        );
        let err = parse(&[u8s("a", 2, 2, 0)], 6);
        assert!(
            matches!(&err, WeightsError::InvalidOffsets { tensor, .. } if tensor == "a"),
            "{err:?}"
        );
        let err = parse(&[u8s("a", 3, 0, 6)], 6);
        assert!(
            matches!(&err, WeightsError::LengthMismatch { tensor, expected: Some(3), actual: 6, .. } if tensor == "a"),
            "{err:?}"
        );
    }

    /// Header forms at the edge of the format: we agree with the safetensors crate on each,
    /// except where we are stricter on purpose (repeated names, which the crate lets
    /// overwrite each other).
    #[test]
    fn edge_forms_agree_with_the_safetensors_crate() {
        let accepted = [
            // An entry as a JSON array (serde reads a struct from a sequence too).
            (r#"{"a":["U8",[2],[0,2]]}"#, 2),
            // Unknown fields in an entry are ignored.
            (
                r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1}}"#,
                2,
            ),
            (r#"{"__metadata__":null}"#, 0),
            (
                r#"{"__metadata__":{"k":"v"},"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#,
                0,
            ),
            // Two empty tensors at the same offset.
            (
                r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[1,0],"data_offsets":[0,0]}}"#,
                0,
            ),
        ];
        for (header, data) in accepted {
            assert!(crate_accepts(header, data), "crate: {header}");
            let entries = parse(header, data).unwrap_or_else(|e| panic!("{header}: {e}"));
            assert!(entries
                .iter()
                .all(|e| e.range.end <= 8 + header.len() + data));
        }
        let bad_json = [
            (r#"{"__metadata__":{"k":1}}"#, 0),
            (r#"{"__metadata__":{},"__metadata__":{}}"#, 0),
            (
                r#"{"a":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#,
                2,
            ),
            (
                r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2,3]}}"#,
                2,
            ),
            (
                r#"{"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}}"#,
                2,
            ),
            (r#"{"a":{"dtype":8,"shape":[2],"data_offsets":[0,2]}}"#, 2),
            (r#"{} x"#, 0),
            ("null", 0),
        ];
        for (header, data) in bad_json {
            assert!(!crate_accepts(header, data), "crate: {header}");
            let err = parse(header, data).unwrap_err();
            assert!(
                matches!(err, WeightsError::BadJson { .. }),
                "{header}: {err:?}"
            );
        }
        let err = parse(r#"{"a":{"dtype":"U8","data_offsets":[0,1]}}"#, 1).unwrap_err();
        assert!(
            err.to_string()
                .contains("tensor `a`: missing field `shape`"),
            "{err}"
        );
    }
}
