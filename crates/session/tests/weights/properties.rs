//! Property tests: no input makes the loader panic.

use super::*;

static CASE: AtomicUsize = AtomicUsize::new(0);

/// Whether the safetensors crate reads `bytes` (a panic inside it counts as no).
fn safetensors_reads(bytes: &[u8]) -> bool {
    std::panic::catch_unwind(|| SafeTensors::deserialize(bytes).is_ok()).unwrap_or(false)
}

/// Writes `bytes` to a fresh file, opens it both ways, and checks: both modes agree; a loaded
/// file's tensors lie within the file and hold its bytes; an error names the file; we accept
/// exactly what the safetensors crate accepts, except what we reject on purpose.
fn check_loader(dir: &Path, bytes: &[u8]) -> Result<(), TestCaseError> {
    let name = format!(
        "case_{:06}.safetensors",
        CASE.fetch_add(1, Ordering::Relaxed)
    );
    let path = dir.join(&name);
    fs::write(&path, bytes).expect("write case");
    let results: Vec<Result<Weights, WeightsError>> =
        MODES.iter().map(|&m| Weights::open(&path, m)).collect();
    let crate_reads = safetensors_reads(bytes);
    match (&results[0], &results[1]) {
        (Ok(mapped), Ok(copied)) => {
            // One validator, the same format: what we load, the safetensors crate loads,
            // with the same tensors.
            prop_assert!(crate_reads, "we load what the safetensors crate rejects");
            assert_matches_safetensors(mapped, bytes);
            prop_assert!(mapped.is_mapped() && !copied.is_mapped());
            prop_assert!(mapped.names().eq(copied.names()));
            for w in [mapped, copied] {
                let mut total = 0;
                for t in w.iter() {
                    let range = t.file_range().expect("loaded from a file");
                    prop_assert!(range.start <= range.end && range.end <= bytes.len());
                    prop_assert_eq!(&bytes[range.clone()], t.bytes());
                    prop_assert_eq!(
                        t.bytes().len(),
                        t.len_elements() * t.dtype().size_in_bytes()
                    );
                    prop_assert_eq!(
                        Some(t.len_elements()),
                        t.shape().iter().try_fold(1usize, |a, &d| a.checked_mul(d))
                    );
                    prop_assert!(t.as_cow::<u8>().is_ok() == (t.dtype().size_in_bytes() == 1));
                    total += t.bytes().len();
                }
                prop_assert_eq!(total, w.total_bytes());
                prop_assert!(total <= bytes.len());
            }
        }
        (Err(a), Err(b)) => {
            // We reject all the crate rejects, and more only on purpose: repeated names
            // (the crate lets the last win) and the sub-byte dtypes we do not support.
            let stricter = matches!(a, WeightsError::DuplicateName { .. })
                || matches!(a, WeightsError::UnknownDtype { dtype, .. }
                    if ["F4", "F6_E2M3", "F6_E3M2"].contains(&dtype.as_str()));
            prop_assert!(
                !crate_reads || stricter,
                "the safetensors crate loads it: {}",
                a
            );
            prop_assert_eq!(std::mem::discriminant(a), std::mem::discriminant(b));
            prop_assert!(a.to_string().contains(&name), "{}", a);
        }
        (a, b) => prop_assert!(false, "modes disagree: {:?} vs {:?}", a, b),
    }
    drop(results);
    fs::remove_file(&path).expect("remove case");
    Ok(())
}

/// How a generated header entry departs from a valid one.
#[derive(Debug, Clone)]
enum Twist {
    None,
    ShiftStart(u64),
    ShiftEnd(u64),
    HugeEnd(u64),
    HugeDim(u64),
    Malformed,
}

/// A header (and data length) built to be valid most of the time: tensors laid out
/// contiguously by their dtype and shape, then twisted: offsets shifted or huge, dimensions
/// huge, entries malformed, unknown dtypes, a data section too short or too long.
fn arb_header() -> impl Strategy<Value = (String, usize)> {
    let dtype = prop::sample::select(vec![
        "BOOL", "U8", "I8", "F16", "BF16", "F32", "I64", "F64", "F8_E4M3", "C64", "BOOL", "U8",
        "F32", "F32", "F4", "X",
    ]);
    let twist = prop_oneof![
        12 => Just(Twist::None),
        1 => (0u64..6).prop_map(Twist::ShiftStart),
        1 => (0u64..6).prop_map(Twist::ShiftEnd),
        1 => prop_oneof![Just(u64::MAX), Just(1u64 << 62), any::<u64>()].prop_map(Twist::HugeEnd),
        1 => prop_oneof![Just(u64::MAX), Just(1u64 << 32), any::<u64>()].prop_map(Twist::HugeDim),
        1 => Just(Twist::Malformed),
    ];
    let entry = (dtype, prop::collection::vec(0u64..4, 0..3), twist);
    let data_slack = prop_oneof![6 => Just(0i64), 1 => -8i64..8];
    (
        prop::collection::vec(entry, 0..5),
        data_slack,
        any::<bool>(),
    )
        .prop_map(|(entries, slack, with_metadata)| {
            let mut offset = 0u64;
            let mut parts = Vec::new();
            for (i, (dtype, mut shape, twist)) in entries.into_iter().enumerate() {
                let size = Dtype::from_name(dtype).map_or(1, |d| d.size_in_bytes() as u64);
                let len = shape.iter().product::<u64>() * size; // small: dims < 4
                let (mut start, mut end) = (offset, offset.saturating_add(len));
                match twist {
                    Twist::None => {}
                    Twist::ShiftStart(d) => start = start.saturating_add(d),
                    Twist::ShiftEnd(d) => end = end.saturating_sub(d),
                    Twist::HugeEnd(e) => end = e,
                    Twist::HugeDim(d) => shape.push(d),
                    Twist::Malformed => {
                        parts.push(format!(
                            r#""t{i}":{{"dtype":"{dtype}","data_offsets":[{start}]}}"#
                        ));
                        continue;
                    }
                }
                offset = end;
                let shape: Vec<String> = shape.iter().map(u64::to_string).collect();
                parts.push(format!(
                    r#""t{i}":{{"dtype":"{dtype}","shape":[{}],"data_offsets":[{start},{end}]}}"#,
                    shape.join(",")
                ));
            }
            if with_metadata {
                parts.push(r#""__metadata__":{"k":"v"}"#.to_owned());
            }
            let data_len = (offset.min(4096) as i64 + slack).max(0) as usize;
            (format!("{{{}}}", parts.join(",")), data_len)
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        // Failures print their minimal input; nothing is written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let (_dir, dir) = temp_dir();
        check_loader(&dir, &bytes)?;
    }

    #[test]
    fn arbitrary_header_after_a_plausible_length_never_panics(
        header in prop::collection::vec(any::<u8>(), 0..200),
        slack in 0usize..16,
        extra in 0u64..4,
    ) {
        let (_dir, dir) = temp_dir();
        let mut img = (header.len() as u64 + extra).to_le_bytes().to_vec();
        img.extend_from_slice(&header);
        img.extend(std::iter::repeat_n(0u8, slack));
        check_loader(&dir, &img)?;
    }

    #[test]
    fn corrupted_valid_file_never_panics(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
        append in prop::collection::vec(any::<u8>(), 0..3),
    ) {
        let (_dir, dir) = temp_dir();
        let mut img = sample_image();
        for (at, byte) in &edits {
            let i = at.index(img.len());
            img[i] = *byte;
        }
        if let Some(cut) = cut {
            img.truncate(cut.index(img.len()));
        }
        img.extend_from_slice(&append);
        check_loader(&dir, &img)?;
    }

    #[test]
    fn generated_headers_never_panic((header, data_len) in arb_header()) {
        let (_dir, dir) = temp_dir();
        check_loader(&dir, &image(&header, &vec![0xAB; data_len]))?;
    }
}
