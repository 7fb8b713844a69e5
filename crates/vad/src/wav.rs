//! A tiny WAV reader: RIFF/WAVE, 16-bit PCM, one channel. Anything else is
//! an error.
//!
//! Streamed WAVs are read too: a program writing to a pipe cannot go back to
//! fill in the sizes, so it leaves a placeholder in the `data` size: ffmpeg
//! writes `0xFFFFFFFF`, others 0, sox `0x7FFFF000`. Such a `data` chunk is
//! taken to run to the end of the input (whole samples only), as Python's
//! `wave` module reads it.

use std::fmt;
use std::path::Path;

/// Decoded 16-bit mono PCM audio.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wav {
    /// Samples per second.
    pub sample_rate: u32,
    /// The samples.
    pub samples: Vec<i16>,
}

impl Wav {
    /// Samples as `f32` in `[-1, 1)`: `s / 32768`.
    pub fn to_f32(&self) -> Vec<f32> {
        self.samples.iter().map(|&s| s as f32 / 32768.0).collect()
    }
}

/// Why a WAV file could not be read.
#[derive(Debug)]
pub enum WavError {
    /// Reading the file failed.
    Io(std::io::Error),
    /// Not a RIFF file.
    NotRiff,
    /// A RIFF file, but not WAVE.
    NotWave,
    /// A chunk runs past the end of the data.
    Truncated,
    /// No `fmt ` chunk, or one shorter than 16 bytes.
    MissingFormat,
    /// No `data` chunk.
    MissingData,
    /// Not integer PCM (format tag, e.g. 3 for float; 0xFFFE with a non-PCM subformat).
    UnsupportedFormat(u16),
    /// More than one channel.
    UnsupportedChannels(u16),
    /// Not 16 bits per sample.
    UnsupportedBitsPerSample(u16),
    /// `block_align` is not 2, or the data length is not a multiple of 2.
    BadBlockAlign,
}

impl fmt::Display for WavError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WavError::Io(e) => write!(f, "cannot read WAV file: {e}"),
            WavError::NotRiff => f.write_str("not a RIFF file"),
            WavError::NotWave => f.write_str("RIFF file is not WAVE"),
            WavError::Truncated => f.write_str("WAV file is truncated"),
            WavError::MissingFormat => f.write_str("WAV file has no valid fmt chunk"),
            WavError::MissingData => f.write_str("WAV file has no data chunk"),
            WavError::UnsupportedFormat(t) => {
                write!(f, "unsupported WAV format tag {t:#06x}: only 16-bit PCM")
            }
            WavError::UnsupportedChannels(n) => {
                write!(f, "unsupported WAV with {n} channels: only mono")
            }
            WavError::UnsupportedBitsPerSample(b) => {
                write!(f, "unsupported WAV with {b} bits per sample: only 16")
            }
            WavError::BadBlockAlign => f.write_str("WAV block alignment is not 2 bytes"),
        }
    }
}

impl std::error::Error for WavError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WavError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for WavError {
    fn from(e: std::io::Error) -> Self {
        WavError::Io(e)
    }
}

const FORMAT_PCM: u16 = 1;
const FORMAT_EXTENSIBLE: u16 = 0xFFFE;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Whether a `data` chunk size of `declared`, with `available` bytes after
/// the chunk header, is a streaming writer's placeholder: 0, `0xFFFFFFFF`,
/// or a size near 2 GiB (sox writes `0x7FFFF000`) larger than the input.
/// Any other size past the end is a truncated file.
fn is_streamed_size(declared: u32, available: usize) -> bool {
    const NEAR_2_GIB: u32 = 0x7FFF_0000;
    declared == 0
        || declared == u32::MAX
        || (declared >= NEAR_2_GIB && declared as usize > available)
}

/// Reads and decodes a WAV file (see [`parse`]).
pub fn read(path: impl AsRef<Path>) -> Result<Wav, WavError> {
    parse(&std::fs::read(path)?)
}

/// Reads a whole WAV stream (a pipe, stdin) and decodes it (see [`parse`]).
pub fn read_from(mut reader: impl std::io::Read) -> Result<Wav, WavError> {
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes)?;
    parse(&bytes)
}

/// Decodes a WAV file held in memory: RIFF/WAVE with a `fmt ` chunk of
/// 16-bit integer PCM (format tag 1, or 0xFFFE with the PCM subformat), one
/// channel, and a `data` chunk. Other chunks are skipped; the RIFF size field
/// is not trusted (chunks are read to the end of `bytes`). A `data` chunk
/// whose size is a streaming writer's placeholder (0, `0xFFFFFFFF`, or near
/// 2 GiB and past the end) runs to the end of `bytes` (a trailing odd byte,
/// half a sample, is dropped).
pub fn parse(bytes: &[u8]) -> Result<Wav, WavError> {
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" {
        return Err(WavError::NotRiff);
    }
    if &bytes[8..12] != b"WAVE" {
        return Err(WavError::NotWave);
    }
    let mut fmt: Option<&[u8]> = None;
    let mut data: Option<&[u8]> = None;
    let mut at = 12;
    while at < bytes.len() {
        if bytes.len() - at < 8 {
            return Err(WavError::Truncated);
        }
        let id = &bytes[at..at + 4];
        let declared = u32_at(bytes, at + 4);
        let body = at + 8;
        if id == b"data" && data.is_none() && is_streamed_size(declared, bytes.len() - body) {
            let rest = &bytes[body..];
            data = Some(&rest[..rest.len() & !1]);
            break;
        }
        let size = declared as usize;
        if bytes.len() - body < size {
            return Err(WavError::Truncated);
        }
        match id {
            b"fmt " if fmt.is_none() => fmt = Some(&bytes[body..body + size]),
            b"data" if data.is_none() => data = Some(&bytes[body..body + size]),
            _ => {}
        }
        // Chunks are padded to an even length.
        at = body + size + (size & 1);
    }
    let fmt = fmt
        .filter(|f| f.len() >= 16)
        .ok_or(WavError::MissingFormat)?;
    let mut tag = u16_at(fmt, 0);
    if tag == FORMAT_EXTENSIBLE {
        // cbSize (2), valid bits (2), channel mask (4), subformat GUID (16)
        // whose first two bytes are the format tag.
        if fmt.len() < 40 {
            return Err(WavError::MissingFormat);
        }
        let sub = u16_at(fmt, 24);
        if sub != FORMAT_PCM {
            return Err(WavError::UnsupportedFormat(tag));
        }
        tag = sub;
    }
    if tag != FORMAT_PCM {
        return Err(WavError::UnsupportedFormat(tag));
    }
    let channels = u16_at(fmt, 2);
    if channels != 1 {
        return Err(WavError::UnsupportedChannels(channels));
    }
    let sample_rate = u32_at(fmt, 4);
    let block_align = u16_at(fmt, 12);
    let bits = u16_at(fmt, 14);
    if bits != 16 {
        return Err(WavError::UnsupportedBitsPerSample(bits));
    }
    let data = data.ok_or(WavError::MissingData)?;
    if block_align != 2 || data.len() % 2 != 0 {
        return Err(WavError::BadBlockAlign);
    }
    let samples = data
        .chunks_exact(2)
        .map(|s| i16::from_le_bytes([s[0], s[1]]))
        .collect();
    Ok(Wav {
        sample_rate,
        samples,
    })
}
