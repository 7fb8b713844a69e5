//! Unit tests of the kernels.

use super::*;

/// Direct (naive) convolution as in the ONNX definition.
fn conv_naive(spec: &Conv1d, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f32> {
    let ol = spec.out_len();
    let mut out = vec![0.0; spec.output_len()];
    for n in 0..spec.batch {
        for o in 0..spec.out_channels {
            for t in 0..ol {
                let mut s = b.map_or(0.0, |b| b[o]) as f64;
                for c in 0..spec.in_channels {
                    for k in 0..spec.kernel {
                        let p =
                            ((t + spec.skip) * spec.stride + k) as isize - spec.pad_begin as isize;
                        if p >= 0 && (p as usize) < spec.in_len {
                            let xv = x[(n * spec.in_channels + c) * spec.in_len + p as usize];
                            let wv = w[(o * spec.in_channels + c) * spec.kernel + k];
                            s += (xv * wv) as f64;
                        }
                    }
                }
                out[(n * spec.out_channels + o) * ol + t] = s as f32;
            }
        }
    }
    out
}

fn pseudo(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

#[test]
fn tiled_im2col_changes_no_rounding() {
    // conv1d (im2col one tile at a time) against one product over the
    // whole lowered input: bitwise equal.
    for (l, spec) in [(1usize, 1usize), (9, 1), (33, 2), (100, 1), (57, 4)] {
        let s = crate::conv_specs(l)[spec];
        assert!(s.needs_cols());
        let x = pseudo(s.input_len(), l as u32);
        let w = pseudo(s.weight_len(), 7);
        let b = pseudo(s.out_channels, 8);
        let mut cols = vec![f32::NAN; s.cols_len()];
        let mut tiled = vec![f32::NAN; s.output_len()];
        conv1d(&s, &x, &w, Some(&b), &mut cols, &mut tiled);

        let (ol, row, n_rows) = (s.out_len(), s.in_channels * s.kernel, s.batch * s.out_len());
        let mut full = vec![0.0; n_rows * row];
        im2col(&s, &x, 0, &mut full);
        let mut whole = vec![f32::NAN; s.output_len()];
        gemm_nt(
            &w,
            s.out_channels,
            row,
            n_rows,
            |j| &full[j * row..(j + 1) * row],
            Some(&b),
            |j, o, v| whole[((j / ol) * s.out_channels + o) * ol + j % ol] = v,
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&tiled), bits(&whole), "L = {l}, conv {spec}");
        assert!(s.cols_len() <= s.cols_tile_rows() * row);
    }
}

#[test]
fn frame_reflect_pad_equals_frame_rows_then_reflect_pad() {
    use crate::{frame_rows, CONTEXT, ROW, STFT_PAD, WINDOW};
    for l in [1usize, 2, 5] {
        let samples = pseudo(l * WINDOW, l as u32);
        let ctx0: Vec<f32> = pseudo(CONTEXT, 99);
        let mut ctx = [0.0; CONTEXT];
        ctx.copy_from_slice(&ctx0);
        let mut rows = vec![0.0; l * ROW];
        frame_rows(&samples, &mut ctx, &mut rows);
        let padded = ROW + 2 * STFT_PAD;
        let mut want = vec![0.0; l * padded];
        reflect_pad(&rows, ROW, STFT_PAD, STFT_PAD, &mut want);
        let mut got = vec![f32::NAN; l * padded];
        frame_reflect_pad(&samples, WINDOW, &ctx0, STFT_PAD, &mut got);
        assert_eq!(got, want, "L = {l}");

        // i16 samples convert as s / 32768 on the way.
        let pcm: Vec<i16> = samples.iter().map(|&x| (x * 30000.0) as i16).collect();
        let as_f32: Vec<f32> = pcm.iter().map(|&s| s as f32 / 32768.0).collect();
        let mut want = vec![0.0; l * padded];
        frame_reflect_pad(&as_f32, WINDOW, &ctx0, STFT_PAD, &mut want);
        frame_reflect_pad(&pcm, WINDOW, &ctx0, STFT_PAD, &mut got);
        assert_eq!(got, want, "i16, L = {l}");
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn conv1d_matches_naive_for_many_shapes() {
    let mut seed = 1;
    for &(batch, cin, len, cout, k, stride, pb, pe, skip) in &[
        (1, 1, 10, 3, 4, 2, 0, 0, 0),
        (3, 1, 40, 7, 8, 4, 0, 0, 1),
        (2, 5, 4, 9, 3, 1, 1, 1, 0),
        (3, 6, 4, 5, 3, 2, 1, 1, 0),
        (2, 3, 2, 6, 3, 2, 1, 1, 0),
        (4, 3, 1, 6, 3, 1, 1, 1, 0),
        (1, 7, 9, 2, 1, 1, 0, 0, 0),
        (5, 2, 7, 13, 5, 3, 2, 3, 1),
    ] {
        let spec = Conv1d {
            batch,
            in_channels: cin,
            in_len: len,
            out_channels: cout,
            kernel: k,
            stride,
            pad_begin: pb,
            pad_end: pe,
            skip,
        };
        seed += 3;
        let x = pseudo(spec.input_len(), seed);
        let w = pseudo(spec.weight_len(), seed + 1);
        let b = pseudo(cout, seed + 2);
        let mut cols = vec![f32::NAN; spec.cols_len()];
        let mut out = vec![f32::NAN; spec.output_len()];
        conv1d(&spec, &x, &w, Some(&b), &mut cols, &mut out);
        let want = conv_naive(&spec, &x, &w, Some(&b));
        assert!(max_diff(&out, &want) < 1e-5, "{spec:?}");
        conv1d(&spec, &x, &w, None, &mut cols, &mut out);
        let want = conv_naive(&spec, &x, &w, None);
        assert!(max_diff(&out, &want) < 1e-5, "{spec:?} without bias");
    }
}

#[test]
fn linear_matches_naive() {
    for &(rows, inf, outf) in &[(1, 1, 1), (3, 7, 5), (5, 128, 9), (2, 13, 4)] {
        let x = pseudo(rows * inf, 7);
        let w = pseudo(outf * inf, 8);
        let b = pseudo(outf, 9);
        let mut out = vec![f32::NAN; rows * outf];
        linear(&x, inf, &w, Some(&b), &mut out);
        for r in 0..rows {
            for o in 0..outf {
                let s: f32 = b[o]
                    + (0..inf)
                        .map(|i| w[o * inf + i] * x[r * inf + i])
                        .sum::<f32>();
                assert!((out[r * outf + o] - s).abs() < 1e-5);
            }
        }
    }
}

#[test]
fn reflect_pad_matches_onnx_example() {
    let x = [1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0];
    let mut out = [0.0; 16];
    reflect_pad(&x, 4, 2, 2, &mut out);
    assert_eq!(
        out,
        [3.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 2.0, 30.0, 20.0, 10.0, 20.0, 30.0, 40.0, 30.0, 20.0]
    );
    let mut out = [0.0; 7];
    reflect_pad(&x[..4], 4, 0, 3, &mut out);
    assert_eq!(out, [1.0, 2.0, 3.0, 4.0, 3.0, 2.0, 1.0]);
}

#[test]
fn magnitude_relu_sigmoid() {
    // N = 1, F = 2, T = 1: re = [3, 0], im = [4, -2].
    let mut out = [0.0; 2];
    complex_magnitude(&[3.0, 0.0, 4.0, -2.0], 2, 1, &mut out);
    assert_eq!(out, [5.0, 2.0]);
    let mut x = [-1.0, 0.0, 2.5];
    relu(&mut x);
    assert_eq!(x, [0.0, 0.0, 2.5]);
    let mut s = [0.0, 100.0, -100.0];
    sigmoid(&mut s);
    assert_eq!(s[0], 0.5);
    assert!((s[1] - 1.0).abs() < 1e-7 && s[2] >= 0.0 && s[2] < 1e-30);
}

#[test]
fn lstm_matches_scalar_definition() {
    let (hid, inp, steps) = (3, 5, 4);
    let w = pseudo(4 * hid * inp, 11);
    let r = pseudo(4 * hid * hid, 12);
    let b = pseudo(8 * hid, 13);
    let x = pseudo(steps * inp, 14);
    let weights = LstmWeights {
        w: &w,
        r: &r,
        b: &b,
        hidden: hid,
    };
    let mut h = pseudo(hid, 15);
    let mut c = pseudo(hid, 16);
    let (mut h_ref, mut c_ref) = (h.clone(), c.clone());
    let mut gates = vec![0.0; steps * 4 * hid];
    let mut y = vec![0.0; steps * hid];
    lstm(&x, &weights, &mut h, &mut c, &mut gates, &mut y);
    for t in 0..steps {
        let gate = |g: usize, u: usize, h: &[f32]| {
            let row = g * hid + u;
            let mut s = b[row] + b[4 * hid + row];
            for i in 0..inp {
                s += w[row * inp + i] * x[t * inp + i];
            }
            for (k, hk) in h.iter().enumerate() {
                s += r[row * hid + k] * hk;
            }
            s
        };
        let prev = h_ref.clone();
        for u in 0..hid {
            // ONNX gate order: i, o, f, c.
            let i = sigmoid1(gate(0, u, &prev));
            let o = sigmoid1(gate(1, u, &prev));
            let f = sigmoid1(gate(2, u, &prev));
            let g = gate(3, u, &prev).tanh();
            c_ref[u] = f * c_ref[u] + i * g;
            h_ref[u] = o * c_ref[u].tanh();
            assert!((y[t * hid + u] - h_ref[u]).abs() < 1e-6);
        }
    }
    assert!(max_diff(&h, &h_ref) < 1e-6 && max_diff(&c, &c_ref) < 1e-6);
}
