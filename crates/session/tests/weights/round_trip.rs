//! Round trip, views, in-memory weights.

use super::*;

#[test]
fn round_trip_both_modes() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("round_trip.safetensors");
    write_sample(&path);
    let file = fs::read(&path).unwrap();

    for mode in MODES {
        let w = Weights::open(&path, mode).expect("open sample");
        assert_eq!(w.is_mapped(), mode == MMAP);
        assert_eq!(w.path(), Some(path.as_path()));
        assert!(!w.is_empty());
        assert_matches_safetensors(&w, &file);

        // Names come in offset order, and file ranges point at the bytes in the file.
        let starts: Vec<usize> = w.iter().map(|t| t.file_range().unwrap().start).collect();
        assert!(starts.windows(2).all(|p| p[0] <= p[1]), "{starts:?}");
        assert_eq!(w.names().count(), sample_tensors().len());
        for t in w.iter() {
            assert_eq!(&file[t.file_range().unwrap()], t.bytes());
        }

        let embed = w.get("embed").unwrap();
        assert_eq!(embed.dtype(), Dtype::F32);
        assert_eq!(embed.shape(), &[4, 3]);
        assert_eq!(embed.len_elements(), 12);
        assert_eq!(
            embed.try_as_slice::<f32>().unwrap(),
            embed_values().as_slice()
        );
        assert_eq!(
            w.get("bias").unwrap().try_as_slice::<f64>().unwrap(),
            &[0.25, -8.0, 1e10]
        );
        assert_eq!(
            w.get("ids").unwrap().to_vec_of::<i64>().unwrap(),
            vec![7, -3]
        );
        assert_eq!(w.get("scalar").unwrap().shape(), &[] as &[usize]);
        assert_eq!(w.get("scalar").unwrap().len_elements(), 1);
        assert_eq!(
            w.get("empty").unwrap().try_as_slice::<f32>().unwrap(),
            &[] as &[f32]
        );
        assert_eq!(w.get("flag").unwrap().dtype(), Dtype::Bool);
        assert_eq!(w.get("half").unwrap().dtype(), Dtype::Bf16);
        assert!(w.get("nope").is_none());
        assert!(
            w.get("format").is_none(),
            "__metadata__ entries are not tensors"
        );
    }
}

#[test]
fn copy_mode_buffer_is_64_byte_aligned() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("aligned.safetensors");
    write_sample(&path);
    let w = Weights::open(&path, LoadMode::Copy).unwrap();
    let embed = w.get("embed").unwrap();
    let file_start = embed.bytes().as_ptr() as usize - embed.file_range().unwrap().start;
    assert_eq!(file_start % OWNED_ALIGN, 0);
}

#[test]
fn empty_header_is_valid_and_empty() {
    for header in ["{}", "{}      ", r#"{"__metadata__":{"a":"b"}}"#] {
        let (_dir, dir) = temp_dir();
        let path = dir.join("empty_header.safetensors");
        fs::write(&path, image(header, &[])).unwrap();
        for mode in MODES {
            let w = Weights::open(&path, mode).unwrap();
            assert!(w.is_empty());
            assert_eq!((w.len(), w.total_bytes(), w.names().count()), (0, 0, 0));
        }
    }
}

#[test]
fn from_tensors_packs_aligned_and_keeps_order() {
    let w = Weights::from_tensors([
        ("b", Dtype::U8, vec![3], vec![1u8, 2, 3]),
        ("a", Dtype::F32, vec![2], le_bytes_f32(&[1.5, -2.0])),
        ("c", Dtype::F64, vec![1, 1], le_bytes_f64(&[9.0])),
    ])
    .unwrap();
    assert_eq!(w.names().collect::<Vec<_>>(), ["b", "a", "c"]);
    assert_eq!(w.len(), 3);
    assert_eq!(w.total_bytes(), 3 + 8 + 8);
    assert!(!w.is_mapped());
    assert_eq!(w.path(), None);
    for t in w.iter() {
        assert_eq!(t.bytes().as_ptr() as usize % OWNED_ALIGN, 0, "{}", t.name());
        assert_eq!(t.file_range(), None);
    }
    assert_eq!(
        w.get("a").unwrap().try_as_slice::<f32>().unwrap(),
        &[1.5, -2.0]
    );
    assert_eq!(w.get("c").unwrap().try_as_slice::<f64>().unwrap(), &[9.0]);
    let copy = w.to_owned_copy();
    assert_eq!(copy.get("b").unwrap().bytes(), &[1, 2, 3]);

    // Borrowed slices and arrays work as shapes and bytes too.
    let w = Weights::from_tensors([("s", Dtype::I16, [2usize], &[1u8, 0, 2, 0][..])]).unwrap();
    assert_eq!(w.get("s").unwrap().try_as_slice::<i16>().unwrap(), &[1, 2]);
}

#[test]
fn from_tensors_rejects_bad_input() {
    let err = Weights::from_tensors([
        ("x", Dtype::U8, vec![1], vec![0u8]),
        ("x", Dtype::U8, vec![1], vec![0u8]),
    ])
    .unwrap_err();
    assert!(matches!(&err, WeightsError::DuplicateName { tensor, path: None } if tensor == "x"));
    assert!(err.to_string().contains("in-memory weights"), "{err}");

    let err = Weights::from_tensors([("y", Dtype::F32, vec![3], vec![0u8; 8])]).unwrap_err();
    assert!(
        matches!(
            &err,
            WeightsError::LengthMismatch { tensor, expected: Some(12), actual: 8, .. } if tensor == "y"
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("`y`"), "{err}");

    let err =
        Weights::from_tensors([("z", Dtype::F64, vec![usize::MAX, 2], vec![0u8; 8])]).unwrap_err();
    assert!(
        matches!(err, WeightsError::LengthMismatch { expected: None, .. }),
        "{err:?}"
    );
}

#[test]
fn typed_view_wrong_element_size() {
    let (_dir, dir) = temp_dir();
    let path = dir.join("wrong_size.safetensors");
    write_sample(&path);
    for mode in MODES {
        let w = Weights::open(&path, mode).unwrap();
        let embed = w.get("embed").unwrap();
        for err in [
            embed.try_as_slice::<f64>().unwrap_err(),
            embed.as_cow::<u16>().unwrap_err(),
            embed.to_vec_of::<u8>().unwrap_err(),
        ] {
            assert!(
                matches!(&err, WeightsError::DtypeSizeMismatch { tensor, dtype: Dtype::F32, .. } if tensor == "embed"),
                "{err:?}"
            );
            assert!(err.to_string().contains("wrong_size.safetensors"), "{err}");
        }
        // Same size, other type: allowed (raw bits)...
        assert_eq!(embed.try_as_slice::<u32>().unwrap().len(), 12);
        // ...but not by the dtype-checked view.
        let err = embed.typed::<u32>().unwrap_err();
        assert!(
            matches!(
                &err,
                WeightsError::DtypeMismatch {
                    dtype: Dtype::F32,
                    requested: Dtype::U32,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("not U32"), "{err}");
        assert_eq!(embed.typed::<f32>().unwrap().len(), 12);
        assert_eq!(
            w.get("half").unwrap().try_as_slice::<u16>().unwrap(),
            &[0x0201, 0x0403, 0x0605, 0x0807]
        );
    }
}

/// Safetensors does not align data offsets. Two ways to get a misaligned F32: a U8 tensor of
/// odd length before it, or a header length that puts the data section at an odd offset.
#[test]
fn misaligned_tensor_errors_borrowed_and_copies_in_cow() {
    let values = [1.5f32, -2.25, 3.0e-7];
    let f32s = le_bytes_f32(&values);

    // (a) U8 of length 1 first; header padded so the data section starts 8-aligned.
    let mut header_a = String::from(
        r#"{"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"vals":{"dtype":"F32","shape":[3],"data_offsets":[1,13]}}"#,
    );
    while (8 + header_a.len()) % 8 != 0 {
        header_a.push(' ');
    }
    let mut data_a = vec![0xEE];
    data_a.extend_from_slice(&f32s);

    // (b) Header length odd: the data section itself starts at an odd file offset.
    let mut header_b =
        String::from(r#"{"vals":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}"#);
    if (8 + header_b.len()) % 2 == 0 {
        header_b.push(' ');
    }

    let (_dir, dir) = temp_dir();
    for (name, img) in [
        ("misaligned_a.safetensors", image(&header_a, &data_a)),
        ("misaligned_b.safetensors", image(&header_b, &f32s)),
    ] {
        let path = dir.join(name);
        fs::write(&path, &img).unwrap();
        for mode in MODES {
            let w = Weights::open(&path, mode).unwrap();
            let vals = w.get("vals").unwrap();
            assert_ne!(
                vals.bytes().as_ptr() as usize % 4,
                0,
                "test setup: misaligned"
            );

            let err = vals.try_as_slice::<f32>().unwrap_err();
            assert!(
                matches!(&err, WeightsError::Misaligned { tensor, required_align: 4, .. } if tensor == "vals"),
                "{err:?}"
            );
            assert!(err.to_string().contains(name), "{err}");

            let cow = vals.as_cow::<f32>().unwrap();
            assert!(matches!(cow, std::borrow::Cow::Owned(_)));
            assert_eq!(&*cow, &values);
            assert_eq!(vals.to_vec_of::<f32>().unwrap(), values);
            // Byte-sized views are always aligned.
            assert_eq!(vals.try_as_slice::<[u8; 4]>().unwrap().len(), 3);
        }
    }

    // Aligned tensors borrow.
    let w = Weights::from_tensors([("v", Dtype::F32, vec![3], f32s)]).unwrap();
    let cow = w.get("v").unwrap().as_cow::<f32>().unwrap();
    assert!(matches!(cow, std::borrow::Cow::Borrowed(_)));
}

#[test]
fn weights_is_send_sync_and_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Weights>();
    assert_send_sync::<Arc<Weights>>();

    let (_dir, dir) = temp_dir();
    let path = dir.join("threads.safetensors");
    write_sample(&path);
    let w = Arc::new(Weights::open(&path, MMAP).unwrap());
    let sums: Vec<f32> = (0..4)
        .map(|_| {
            let w = Arc::clone(&w);
            std::thread::spawn(move || {
                w.get("embed")
                    .unwrap()
                    .try_as_slice::<f32>()
                    .unwrap()
                    .iter()
                    .sum()
            })
        })
        .map(|h| h.join().unwrap())
        .collect();
    let want: f32 = embed_values().iter().sum();
    assert!(sums.iter().all(|&s| s == want));
}
