//! Plain-Rust kernels for exactly the ops of the Silero VAD v6 graph.
//!
//! Every kernel writes into a caller-provided output slice and never allocates,
//! so that all intermediate tensors can come from an arena. Output slices are
//! fully overwritten: their previous contents do not matter. Length mismatches
//! are programming errors and panic.
//!
//! Layouts follow the ONNX graph: row-major, batch first (`N x C x T` for the
//! convolutions). Weights are used in their ONNX layout, without repacking.
//!
//! The convolutions ([`conv1d`], through im2col when a receptive field is not
//! a contiguous run of the input), [`linear`] and the [`lstm`] products all
//! reduce to one private "A times B transposed" product whose inner loop
//! computes a 4 x 2 block of dot products with 4-lane accumulators; the
//! compiler turns it into SIMD on the baseline x86-64 target (SSE2), with no
//! `unsafe` and no target features.

/// Width of the accumulator arrays in the dot-product micro-kernels.
const LANES: usize = 4;

/// Shape of a 1-D convolution over a batch (ONNX `Conv` with one spatial axis,
/// `group = 1`, `dilation = 1`), optionally fused with a `Slice` that drops the
/// first `skip` output frames.
///
/// Input `N x in_channels x in_len`, weight `out_channels x in_channels x kernel`,
/// output `N x out_channels x out_len()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1d {
    /// Batch size `N`.
    pub batch: usize,
    /// Input channels.
    pub in_channels: usize,
    /// Input length (time axis).
    pub in_len: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Kernel width.
    pub kernel: usize,
    /// Stride along time.
    pub stride: usize,
    /// Zero padding before the first sample.
    pub pad_begin: usize,
    /// Zero padding after the last sample.
    pub pad_end: usize,
    /// Number of leading output frames not computed (a fused `Slice` on the
    /// time axis starting at `skip`).
    pub skip: usize,
}

impl Conv1d {
    /// Output frames of the convolution before the fused slice.
    pub fn full_out_len(&self) -> usize {
        let padded = self.in_len + self.pad_begin + self.pad_end;
        assert!(self.stride > 0, "conv1d: stride must be positive");
        assert!(
            padded >= self.kernel && self.kernel > 0,
            "conv1d: kernel {} longer than padded input {padded}",
            self.kernel
        );
        (padded - self.kernel) / self.stride + 1
    }

    /// Output frames actually computed: `full_out_len() - skip`.
    pub fn out_len(&self) -> usize {
        let full = self.full_out_len();
        assert!(
            self.skip < full,
            "conv1d: skip {} >= {full} frames",
            self.skip
        );
        full - self.skip
    }

    /// Number of input elements: `batch * in_channels * in_len`.
    pub fn input_len(&self) -> usize {
        self.batch * self.in_channels * self.in_len
    }

    /// Number of weight elements: `out_channels * in_channels * kernel`.
    pub fn weight_len(&self) -> usize {
        self.out_channels * self.in_channels * self.kernel
    }

    /// Number of output elements: `batch * out_channels * out_len()`.
    pub fn output_len(&self) -> usize {
        self.batch * self.out_channels * self.out_len()
    }

    /// Whether [`conv1d`] needs an im2col scratch buffer. It does not when
    /// every receptive field is a contiguous run of the input (one input
    /// channel and no padding), as in the STFT convolution.
    pub fn needs_cols(&self) -> bool {
        self.in_channels != 1 || self.pad_begin != 0 || self.pad_end != 0
    }

    /// Output frames whose im2col rows [`conv1d`] holds at once: at least
    /// [`COLS_TILE_MIN_ROWS`], rounded up to whole cache blocks of the
    /// product (so tiling does not change a single rounding).
    pub fn cols_tile_rows(&self) -> usize {
        let block = gemm_block_rows(self.in_channels * self.kernel);
        COLS_TILE_MIN_ROWS.div_ceil(block) * block
    }

    /// Length of the im2col scratch buffer [`conv1d`] takes:
    /// `min(batch * out_len(), cols_tile_rows()) * in_channels * kernel`, or
    /// 0 if not needed. It does not grow with the batch beyond one tile.
    pub fn cols_len(&self) -> usize {
        if self.needs_cols() {
            let rows = (self.batch * self.out_len()).min(self.cols_tile_rows());
            rows * self.in_channels * self.kernel
        } else {
            0
        }
    }
}

/// The least number of output frames [`conv1d`] lays out with im2col at a
/// time (see [`Conv1d::cols_tile_rows`]): the scratch is a fixed tile, not a
/// copy of the whole input times the kernel width.
pub const COLS_TILE_MIN_ROWS: usize = 32;

/// 1-D convolution (ONNX `Conv`, plus the fused time `Slice` of
/// [`Conv1d::skip`]): `out[n, o, t] = bias[o] + sum_{c, k} w[o, c, k] *
/// x[n, c, (t + skip) * stride + k - pad_begin]`, with zeros outside the input.
///
/// `cols` is scratch of [`Conv1d::cols_len`] elements (may be empty when that
/// is 0); its contents on entry do not matter. The receptive fields are laid
/// out in it one tile of [`Conv1d::cols_tile_rows`] output frames at a time.
///
/// # Panics
/// If a slice length does not match `spec`.
pub fn conv1d(
    spec: &Conv1d,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    cols: &mut [f32],
    out: &mut [f32],
) {
    let out_len = spec.out_len();
    let row = spec.in_channels * spec.kernel;
    assert_eq!(input.len(), spec.input_len(), "conv1d: input length");
    assert_eq!(weight.len(), spec.weight_len(), "conv1d: weight length");
    assert_eq!(out.len(), spec.output_len(), "conv1d: output length");
    assert_eq!(cols.len(), spec.cols_len(), "conv1d: cols length");
    if let Some(b) = bias {
        assert_eq!(b.len(), spec.out_channels, "conv1d: bias length");
    }
    let cout = spec.out_channels;
    // GEMM row j = (n, t) and column o land at out[n, o, t].
    let index = |j: usize, o: usize| {
        let (n, t) = (j / out_len, j % out_len);
        (n * cout + o) * out_len + t
    };
    let n_rows = spec.batch * out_len;
    if spec.needs_cols() {
        let tile = spec.cols_tile_rows();
        let mut j0 = 0;
        while j0 < n_rows {
            let j1 = (j0 + tile).min(n_rows);
            let cols = &mut cols[..(j1 - j0) * row];
            im2col(spec, input, j0, cols);
            let cols = &*cols;
            gemm_nt(
                weight,
                cout,
                row,
                j1 - j0,
                |j| &cols[j * row..(j + 1) * row],
                bias,
                |j, o, v| out[index(j0 + j, o)] = v,
            );
            j0 = j1;
        }
    } else {
        // One channel, no padding: receptive field (n, t) is a contiguous run.
        let (in_len, stride, skip, k) = (spec.in_len, spec.stride, spec.skip, spec.kernel);
        gemm_nt(
            weight,
            cout,
            row,
            n_rows,
            |j| {
                let start = (j / out_len) * in_len + (j % out_len + skip) * stride;
                &input[start..start + k]
            },
            bias,
            |j, o, v| out[index(j, o)] = v,
        );
    }
}

/// im2col of GEMM rows `first..`: row `i` of `cols` holds the receptive
/// field of GEMM row `j = first + i`, that is output frame `t` of batch item
/// `n` for `j = n * out_len + t`, ordered `(channel, tap)` like the weight rows.
fn im2col(spec: &Conv1d, input: &[f32], first: usize, cols: &mut [f32]) {
    let out_len = spec.out_len();
    let (cin, k, in_len) = (spec.in_channels, spec.kernel, spec.in_len);
    let row = cin * k;
    for (i, dst) in cols.chunks_exact_mut(row).enumerate() {
        let j = first + i;
        let (n, t) = (j / out_len, j % out_len);
        // Position of tap 0 in the unpadded input (may be negative).
        let start = ((t + spec.skip) * spec.stride) as isize - spec.pad_begin as isize;
        // Taps [k0, k1) fall inside the input.
        let k0 = (-start).clamp(0, k as isize) as usize;
        let k1 = (in_len as isize - start).clamp(0, k as isize) as usize;
        let k1 = k1.max(k0);
        let src_n = &input[n * cin * in_len..(n + 1) * cin * in_len];
        for (c, d) in dst.chunks_exact_mut(k).enumerate() {
            d[..k0].fill(0.0);
            d[k1..].fill(0.0);
            if k1 > k0 {
                let s = (start + k0 as isize) as usize + c * in_len;
                d[k0..k1].copy_from_slice(&src_n[s..s + (k1 - k0)]);
            }
        }
    }
}

/// Dense layer over rows: `out[r, o] = bias[o] + sum_i weight[o, i] * input[r, i]`
/// for `input` of `rows x in_features` and `weight` of `out_features x in_features`
/// (the ONNX/PyTorch layout), `out` of `rows x out_features`.
///
/// In this graph it computes the LSTM input projection, and the final
/// `Transpose` + 1x1 `Conv` (a 1x1 convolution over the transposed LSTM
/// output is this product over its untransposed rows).
///
/// # Panics
/// If a slice length does not match.
pub fn linear(
    input: &[f32],
    in_features: usize,
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    assert!(in_features > 0, "linear: in_features must be positive");
    assert_eq!(input.len() % in_features, 0, "linear: input length");
    assert_eq!(weight.len() % in_features, 0, "linear: weight length");
    let rows = input.len() / in_features;
    let out_features = weight.len() / in_features;
    assert_eq!(out.len(), rows * out_features, "linear: output length");
    if let Some(b) = bias {
        assert_eq!(b.len(), out_features, "linear: bias length");
    }
    gemm_nt(
        weight,
        out_features,
        in_features,
        rows,
        |r| &input[r * in_features..(r + 1) * in_features],
        bias,
        |r, o, v| out[r * out_features + o] = v,
    );
}

/// ONNX `Pad` with `mode = reflect` on the last axis of `rows x len`:
/// `out` is `rows x (left + len + right)`; `left`, `right < len`.
/// Reflection does not repeat the edge sample: `[1 2 3 4]` padded by 2 on
/// both sides is `[3 2 1 2 3 4 3 2]`.
///
/// # Panics
/// If a pad is not shorter than `len`, or a slice length does not match.
pub fn reflect_pad(input: &[f32], len: usize, left: usize, right: usize, out: &mut [f32]) {
    assert!(
        left < len && right < len,
        "reflect_pad: pad must be shorter than the row"
    );
    assert_eq!(input.len() % len, 0, "reflect_pad: input length");
    let padded = left + len + right;
    assert_eq!(
        out.len(),
        input.len() / len * padded,
        "reflect_pad: output length"
    );
    for (src, dst) in input.chunks_exact(len).zip(out.chunks_exact_mut(padded)) {
        let (head, rest) = dst.split_at_mut(left);
        let (body, tail) = rest.split_at_mut(len);
        body.copy_from_slice(src);
        for (i, d) in head.iter_mut().rev().enumerate() {
            *d = src[i + 1];
        }
        for (i, d) in tail.iter_mut().enumerate() {
            *d = src[len - 2 - i];
        }
    }
}

/// An audio sample the model can read: converted to `f32` as the reference
/// does (`i16` as `s / 32768`, `f32` unchanged).
pub trait Sample: Copy {
    /// The sample as `f32`.
    fn to_f32(self) -> f32;
}

impl Sample for f32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Sample for i16 {
    #[inline]
    fn to_f32(self) -> f32 {
        self as f32 / 32768.0
    }
}

/// Framing and reflect padding fused: writes, for each of the
/// `L = samples.len() / window` windows, the row `context_i ++ window_i`
/// (`context.len() + window` samples, as built by
/// [`frame_rows`](crate::frame_rows)) reflect-padded by `pad` on both sides
/// (as [`reflect_pad`]), without materializing the `L x (context + window)`
/// rows. `context_0` is `context`; `context_i` is the last `context.len()`
/// samples of window `i - 1`. `out` is `L x (pad + context.len() + window + pad)`.
///
/// Gives exactly the values of [`frame_rows`](crate::frame_rows) followed by
/// [`reflect_pad`] (copies only).
///
/// # Panics
/// If `samples.len()` is not a multiple of `window`, if `context` is longer
/// than a window, if `pad` is not shorter than a row, or if `out` has the
/// wrong length.
pub fn frame_reflect_pad<T: Sample>(
    samples: &[T],
    window: usize,
    context: &[f32],
    pad: usize,
    out: &mut [f32],
) {
    let ctx = context.len();
    assert!(window > 0 && ctx <= window, "frame_reflect_pad: bad window");
    assert_eq!(
        samples.len() % window,
        0,
        "frame_reflect_pad: samples length"
    );
    let len = ctx + window;
    assert!(
        pad < len,
        "frame_reflect_pad: pad must be shorter than the row"
    );
    let padded = pad + len + pad;
    let l = samples.len() / window;
    assert_eq!(out.len(), l * padded, "frame_reflect_pad: output length");
    for (i, dst) in out.chunks_exact_mut(padded).enumerate() {
        let (head, rest) = dst.split_at_mut(pad);
        let (row, tail) = rest.split_at_mut(len);
        let (row_ctx, row_new) = row.split_at_mut(ctx);
        if i == 0 {
            row_ctx.copy_from_slice(context);
        } else {
            let prev = &samples[i * window - ctx..i * window];
            for (d, &s) in row_ctx.iter_mut().zip(prev) {
                *d = s.to_f32();
            }
        }
        for (d, &s) in row_new
            .iter_mut()
            .zip(&samples[i * window..(i + 1) * window])
        {
            *d = s.to_f32();
        }
        let row = &*row;
        for (j, d) in head.iter_mut().rev().enumerate() {
            *d = row[j + 1];
        }
        for (j, d) in tail.iter_mut().enumerate() {
            *d = row[len - 2 - j];
        }
    }
}

/// STFT magnitude: the graph's two channel `Slice`s, two `Pow(.., 2)`, `Add`
/// and `Sqrt`, fused. `input` is `N x 2F x T` (real parts in channels
/// `0..F`, imaginary in `F..2F`); `out[n, f, t] = sqrt(re^2 + im^2)`, `N x F x T`.
///
/// # Panics
/// If a slice length does not match.
pub fn complex_magnitude(input: &[f32], freqs: usize, frames: usize, out: &mut [f32]) {
    let half = freqs * frames;
    assert!(half > 0, "complex_magnitude: empty shape");
    assert_eq!(
        input.len() % (2 * half),
        0,
        "complex_magnitude: input length"
    );
    assert_eq!(
        out.len() * 2,
        input.len(),
        "complex_magnitude: output length"
    );
    for (src, dst) in input.chunks_exact(2 * half).zip(out.chunks_exact_mut(half)) {
        let (re, im) = src.split_at(half);
        for ((d, &r), &i) in dst.iter_mut().zip(re).zip(im) {
            *d = (r * r + i * i).sqrt();
        }
    }
}

/// ONNX `Relu`, in place.
pub fn relu(x: &mut [f32]) {
    for v in x {
        *v = v.max(0.0);
    }
}

/// Logistic sigmoid of one value.
#[inline]
pub fn sigmoid1(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Hyperbolic tangent as `2 sigmoid(2x) - 1`: one `exp` instead of libm's
/// slower `tanhf`, absolute error within a few ulp of 1 (about 2e-7).
#[inline]
pub fn tanh1(x: f32) -> f32 {
    2.0 / (1.0 + (-2.0 * x).exp()) - 1.0
}

/// ONNX `Sigmoid`, in place.
pub fn sigmoid(x: &mut [f32]) {
    for v in x {
        *v = sigmoid1(*v);
    }
}

/// Weights of a one-direction ONNX `LSTM` (default activations sigmoid, tanh,
/// tanh; no peepholes, no clip), in the ONNX layout with gates ordered
/// `i, o, f, c`:
#[derive(Clone, Copy, Debug)]
pub struct LstmWeights<'w> {
    /// `W`: `4*hidden x input_size`.
    pub w: &'w [f32],
    /// `R`: `4*hidden x hidden`.
    pub r: &'w [f32],
    /// `B`: `8*hidden`, `Wb` then `Rb`.
    pub b: &'w [f32],
    /// Hidden size.
    pub hidden: usize,
}

impl LstmWeights<'_> {
    /// Input size implied by `w`.
    pub fn input_size(&self) -> usize {
        self.w.len() / (4 * self.hidden)
    }
}

/// One-direction ONNX `LSTM` over a sequence of `steps = x.len() / input_size`
/// (batch 1), followed by the graph's `Squeeze`: `y` is `steps x hidden`.
/// `h` and `c` (`hidden` each) hold the initial state on entry and the final
/// state (`hn`, `cn`) on return.
///
/// `gates` is scratch of `steps * 4 * hidden`; the input projection of all
/// steps is computed at once into it, then the recurrence runs step by step.
///
/// # Panics
/// If a slice length does not match.
pub fn lstm(
    x: &[f32],
    weights: &LstmWeights<'_>,
    h: &mut [f32],
    c: &mut [f32],
    gates: &mut [f32],
    y: &mut [f32],
) {
    let hid = weights.hidden;
    let g4 = 4 * hid;
    let input_size = weights.input_size();
    assert!(hid > 0 && input_size > 0, "lstm: empty weights");
    assert_eq!(weights.w.len(), g4 * input_size, "lstm: W length");
    assert_eq!(weights.r.len(), g4 * hid, "lstm: R length");
    assert_eq!(weights.b.len(), 2 * g4, "lstm: B length");
    assert_eq!(x.len() % input_size, 0, "lstm: input length");
    let steps = x.len() / input_size;
    assert_eq!(h.len(), hid, "lstm: h length");
    assert_eq!(c.len(), hid, "lstm: c length");
    assert_eq!(gates.len(), steps * g4, "lstm: gates length");
    assert_eq!(y.len(), steps * hid, "lstm: y length");
    let (wb, rb) = weights.b.split_at(g4);

    // Input projection for every step: gates[t] = W x[t] + Wb.
    linear(x, input_size, weights.w, Some(wb), gates);

    for (g, y_t) in gates.chunks_exact_mut(g4).zip(y.chunks_exact_mut(hid)) {
        // Recurrent part: g += R h + Rb.
        let h_prev = &*h;
        gemm_nt(
            weights.r,
            g4,
            hid,
            1,
            |_| h_prev,
            Some(rb),
            |_, o, v| g[o] += v,
        );
        let (gi, rest) = g.split_at(hid);
        let (go, rest) = rest.split_at(hid);
        let (gf, gc) = rest.split_at(hid);
        for u in 0..hid {
            let i = sigmoid1(gi[u]);
            let o = sigmoid1(go[u]);
            let f = sigmoid1(gf[u]);
            let cand = tanh1(gc[u]);
            let cu = f * c[u] + i * cand;
            c[u] = cu;
            let hu = o * tanh1(cu);
            h[u] = hu;
            y_t[u] = hu;
        }
    }
}

/// Bytes of `b` rows processed against all of `a` at a time: small enough to
/// stay in the L1 cache while the rows of `a` stream past.
const B_BLOCK_BYTES: usize = 16 * 1024;

/// Rows of `b` per cache block in [`gemm_nt`] for rows of `k` floats: an
/// even number, at least 2.
fn gemm_block_rows(k: usize) -> usize {
    (B_BLOCK_BYTES / (4 * k.max(1)) / 2 * 2).max(2)
}

/// `store(j, i, bias[i] + dot(a[i], b_row(j)))` for every row `i < m` of `a`
/// (`m x k`, row-major) and every `j < n`.
///
/// The rows of `b` are taken in blocks of about [`B_BLOCK_BYTES`]; for each
/// block, `a` is streamed once, 4 rows at a time, and each group of 4 `a` rows
/// meets the block's `b` rows 2 at a time ([`dot_4x2`], 8 dot products
/// sharing their loads).
#[inline]
fn gemm_nt<'b>(
    a: &[f32],
    m: usize,
    k: usize,
    n: usize,
    b_row: impl Fn(usize) -> &'b [f32],
    bias: Option<&[f32]>,
    mut store: impl FnMut(usize, usize, f32),
) {
    debug_assert_eq!(a.len(), m * k);
    let a_row = |i: usize| &a[i * k..(i + 1) * k];
    let bias_of = |i: usize| bias.map_or(0.0, |b| b[i]);
    let block = gemm_block_rows(k);
    let mut j0 = 0;
    while j0 < n {
        let j1 = (j0 + block).min(n);
        let mut i = 0;
        while i < m {
            let quad = i + 4 <= m;
            let mut j = j0;
            while j < j1 {
                let pair = j + 1 < j1;
                let b0 = b_row(j);
                let b1 = if pair { b_row(j + 1) } else { b0 };
                debug_assert!(b0.len() == k && b1.len() == k);
                if quad {
                    let rows = [a_row(i), a_row(i + 1), a_row(i + 2), a_row(i + 3)];
                    let acc = if pair {
                        dot_4x2(rows, [b0, b1])
                    } else {
                        dot_4x1(rows, b0).map(|v| [v, 0.0])
                    };
                    for (r, v) in acc.iter().enumerate() {
                        let bi = bias_of(i + r);
                        store(j, i + r, v[0] + bi);
                        if pair {
                            store(j + 1, i + r, v[1] + bi);
                        }
                    }
                } else {
                    let bi = bias_of(i);
                    store(j, i, dot(a_row(i), b0) + bi);
                    if pair {
                        store(j + 1, i, dot(a_row(i), b1) + bi);
                    }
                }
                j += if pair { 2 } else { 1 };
            }
            i += if quad { 4 } else { 1 };
        }
        j0 = j1;
    }
}

type V = [f32; LANES];

#[inline(always)]
fn hsum(v: V) -> f32 {
    (v[0] + v[2]) + (v[1] + v[3])
}

/// `acc + a * b`, lane by lane (written out so that it becomes one SIMD
/// multiply and one add).
#[inline(always)]
fn mla(acc: V, a: V, b: V) -> V {
    [
        acc[0] + a[0] * b[0],
        acc[1] + a[1] * b[1],
        acc[2] + a[2] * b[2],
        acc[3] + a[3] * b[3],
    ]
}

/// The `i`-th group of `LANES` elements of `x` as an array.
#[inline(always)]
fn lanes(x: &[f32], i: usize) -> V {
    let s = &x[i * LANES..(i + 1) * LANES];
    [s[0], s[1], s[2], s[3]]
}

/// Dot product with `LANES`-wide accumulators.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    let (a, b) = (&a[..k], &b[..k]);
    let mut acc = [[0.0f32; LANES]; 2];
    let groups = k / LANES;
    let mut g = 0;
    while g + 2 <= groups {
        acc[0] = mla(acc[0], lanes(a, g), lanes(b, g));
        acc[1] = mla(acc[1], lanes(a, g + 1), lanes(b, g + 1));
        g += 2;
    }
    if g < groups {
        acc[0] = mla(acc[0], lanes(a, g), lanes(b, g));
    }
    let mut s = hsum(acc[0]) + hsum(acc[1]);
    for t in groups * LANES..k {
        s += a[t] * b[t];
    }
    s
}

/// Four dot products of four `a` rows with one `b` row.
#[inline(always)]
fn dot_4x1(a: [&[f32]; 4], b: &[f32]) -> [f32; 4] {
    let k = b.len();
    let a = [&a[0][..k], &a[1][..k], &a[2][..k], &a[3][..k]];
    let mut acc = [[0.0f32; LANES]; 4];
    for g in 0..k / LANES {
        let y = lanes(b, g);
        for r in 0..4 {
            acc[r] = mla(acc[r], lanes(a[r], g), y);
        }
    }
    // See dot_4x2.
    let acc = std::hint::black_box(acc);
    let mut out = [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])];
    for t in k / LANES * LANES..k {
        for r in 0..4 {
            out[r] += a[r][t] * b[t];
        }
    }
    out
}

/// Eight dot products: four `a` rows times two `b` rows. `out[r][c] = a[r] . b[c]`.
#[inline(always)]
fn dot_4x2(a: [&[f32]; 4], b: [&[f32]; 2]) -> [[f32; 2]; 4] {
    let k = b[0].len();
    let a = [&a[0][..k], &a[1][..k], &a[2][..k], &a[3][..k]];
    let (b0, b1) = (&b[0][..k], &b[1][..k]);
    let mut acc = [[[0.0f32; LANES]; 2]; 4];
    for g in 0..k / LANES {
        let y0 = lanes(b0, g);
        let y1 = lanes(b1, g);
        for r in 0..4 {
            let x = lanes(a[r], g);
            acc[r][0] = mla(acc[r][0], x, y0);
            acc[r][1] = mla(acc[r][1], x, y1);
        }
    }
    // The barrier keeps each accumulator a plain 4-lane vector: without it
    // LLVM's SLP vectorizer regroups lanes across accumulators to vectorize
    // the final horizontal sums, and fills the loop with shuffles (2x slower).
    // It costs one store of the 32 floats per call.
    let acc = std::hint::black_box(acc);
    let mut out = [[0.0f32; 2]; 4];
    for r in 0..4 {
        out[r] = [hsum(acc[r][0]), hsum(acc[r][1])];
        for t in k / LANES * LANES..k {
            out[r][0] += a[r][t] * b0[t];
            out[r][1] += a[r][t] * b1[t];
        }
    }
    out
}

#[cfg(test)]
mod tests;
