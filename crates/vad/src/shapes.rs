//! The network's dimensions: the input framing, the convolution shapes of
//! one forward pass, and the intermediate tensors it takes, with their
//! sizes. Both the forward pass ([`Model`](crate::Model)) and the scratch
//! it takes them from ([`Scratch`](crate::Scratch)) stand on this.

use crate::kernels::Conv1d;

/// Sample rate the model was trained for.
pub const SAMPLE_RATE: u32 = 16_000;
/// New samples per window (32 ms at 16 kHz).
pub const WINDOW: usize = 512;
/// Samples of context before each window (the previous window's last 64).
pub const CONTEXT: usize = 64;
/// Length of one input row: `CONTEXT + WINDOW`.
pub const ROW: usize = CONTEXT + WINDOW;
/// LSTM hidden size (the length of `h` and `c`).
pub const HIDDEN: usize = 128;
/// Reflect padding on each side of a row before the STFT.
pub const STFT_PAD: usize = 128;
/// STFT kernel (frame) length.
pub const STFT_KERNEL: usize = 256;
/// STFT hop.
pub const STFT_HOP: usize = 128;
/// Frequency bins of the STFT (real and imaginary parts give 2x this channels).
pub const STFT_BINS: usize = 129;

/// Channel counts of the four encoder convolutions (input of the first is
/// [`STFT_BINS`]) and their strides; all have kernel 3 and padding 1.
const ENCODER: [(usize, usize, usize); 4] =
    [(129, 128, 1), (128, 64, 2), (64, 64, 2), (64, 128, 1)];

/// The convolution shapes of one forward pass over `l` windows: the STFT
/// (with its first output frame sliced off) and the four encoder blocks.
pub fn conv_specs(l: usize) -> [Conv1d; 5] {
    let stft = Conv1d {
        batch: l,
        in_channels: 1,
        in_len: ROW + 2 * STFT_PAD,
        out_channels: 2 * STFT_BINS,
        kernel: STFT_KERNEL,
        stride: STFT_HOP,
        pad_begin: 0,
        pad_end: 0,
        skip: 1,
    };
    let mut specs = [stft; 5];
    let mut len = stft.out_len();
    for (i, &(cin, cout, stride)) in ENCODER.iter().enumerate() {
        specs[i + 1] = Conv1d {
            batch: l,
            in_channels: cin,
            in_len: len,
            out_channels: cout,
            kernel: 3,
            stride,
            pad_begin: 1,
            pad_end: 1,
            skip: 0,
        };
        len = specs[i + 1].out_len();
    }
    specs
}

/// The intermediate tensors of one forward pass, in the order they are
/// first taken. Sizes depend on the number of windows `L`; see
/// [`Intermediate::shape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Intermediate {
    /// Reflect-padded rows, `L x 832`.
    Padded,
    /// STFT convolution output without frame 0, `L x 258 x 4`.
    Stft,
    /// STFT magnitude, `L x 129 x 4`.
    Magnitude,
    /// im2col scratch of encoder block 0, `min(4L, 40) x 387` (one tile,
    /// see [`Conv1d::cols_tile_rows`]).
    Cols0,
    /// Encoder block 0 output (ReLU in place), `L x 128 x 4`.
    Enc0,
    /// im2col scratch of encoder block 1, `min(2L, 40) x 384`.
    Cols1,
    /// Encoder block 1 output, `L x 64 x 2`.
    Enc1,
    /// im2col scratch of encoder block 2, `min(L, 40) x 192`.
    Cols2,
    /// Encoder block 2 output, `L x 64 x 1`.
    Enc2,
    /// im2col scratch of encoder block 3, `min(L, 40) x 192`.
    Cols3,
    /// Encoder block 3 output, `L x 128 x 1` (also the LSTM input `L x 1 x 128`).
    Enc3,
    /// LSTM gate pre-activations (scratch), `L x 512`.
    Gates,
    /// LSTM output (ReLU in place), `L x 128`.
    Lstm,
}

impl Intermediate {
    /// Every intermediate tensor, in the order first taken.
    pub const ALL: [Intermediate; 13] = [
        Intermediate::Padded,
        Intermediate::Stft,
        Intermediate::Magnitude,
        Intermediate::Cols0,
        Intermediate::Enc0,
        Intermediate::Cols1,
        Intermediate::Enc1,
        Intermediate::Cols2,
        Intermediate::Enc2,
        Intermediate::Cols3,
        Intermediate::Enc3,
        Intermediate::Gates,
        Intermediate::Lstm,
    ];

    /// The ONNX tensor this buffer holds (or what it is for, for scratch).
    pub fn name(self) -> &'static str {
        match self {
            Intermediate::Padded => "/stft/padding/Pad_output_0",
            Intermediate::Stft => "/stft/Conv_output_0[:, :, 1:]",
            Intermediate::Magnitude => "/stft/Sqrt_output_0",
            Intermediate::Cols0 => "im2col(/encoder.0/Conv)",
            Intermediate::Enc0 => "/Relu_output_0",
            Intermediate::Cols1 => "im2col(/encoder.1/Conv)",
            Intermediate::Enc1 => "/Relu_1_output_0",
            Intermediate::Cols2 => "im2col(/encoder.2/Conv)",
            Intermediate::Enc2 => "/Relu_2_output_0",
            Intermediate::Cols3 => "im2col(/encoder.3/Conv)",
            Intermediate::Enc3 => "/Relu_3_output_0",
            Intermediate::Gates => "LSTM gates(/recurrent/LSTM)",
            Intermediate::Lstm => "/Relu_4_output_0",
        }
    }

    /// Shape for `l` windows (allocates: for planning and display; the
    /// forward pass uses [`len`](Self::len)).
    pub fn shape(self, l: usize) -> Vec<usize> {
        let s = conv_specs(l);
        let conv_out = |c: &Conv1d| vec![l, c.out_channels, c.out_len()];
        let cols = |c: &Conv1d| {
            let row = c.in_channels * c.kernel;
            vec![c.cols_len() / row, row]
        };
        match self {
            Intermediate::Padded => vec![l, s[0].in_len],
            Intermediate::Stft => conv_out(&s[0]),
            Intermediate::Magnitude => vec![l, STFT_BINS, s[0].out_len()],
            Intermediate::Cols0 => cols(&s[1]),
            Intermediate::Enc0 => conv_out(&s[1]),
            Intermediate::Cols1 => cols(&s[2]),
            Intermediate::Enc1 => conv_out(&s[2]),
            Intermediate::Cols2 => cols(&s[3]),
            Intermediate::Enc2 => conv_out(&s[3]),
            Intermediate::Cols3 => cols(&s[4]),
            Intermediate::Enc3 => conv_out(&s[4]),
            Intermediate::Gates => vec![l, 4 * HIDDEN],
            Intermediate::Lstm => vec![l, HIDDEN],
        }
    }

    /// Number of `f32` elements for `l` windows: the product of
    /// [`shape`](Self::shape), computed without allocating.
    pub fn len(self, l: usize) -> usize {
        let s = conv_specs(l);
        let conv_out = |c: &Conv1d| c.output_len();
        let cols = |c: &Conv1d| c.cols_len();
        match self {
            Intermediate::Padded => l * s[0].in_len,
            Intermediate::Stft => conv_out(&s[0]),
            Intermediate::Magnitude => l * STFT_BINS * s[0].out_len(),
            Intermediate::Cols0 => cols(&s[1]),
            Intermediate::Enc0 => conv_out(&s[1]),
            Intermediate::Cols1 => cols(&s[2]),
            Intermediate::Enc1 => conv_out(&s[2]),
            Intermediate::Cols2 => cols(&s[3]),
            Intermediate::Enc2 => conv_out(&s[3]),
            Intermediate::Cols3 => cols(&s[4]),
            Intermediate::Enc3 => conv_out(&s[4]),
            Intermediate::Gates => l * 4 * HIDDEN,
            Intermediate::Lstm => l * HIDDEN,
        }
    }
}
