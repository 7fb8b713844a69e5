//! The WAV reader: the committed file, and synthetic files for each error.

mod common;

use tensor_vad::wav::{self, WavError};

/// A WAV file: fmt chunk body, data bytes, optional extra chunk before data.
fn wav_bytes(fmt: &[u8], data: &[u8], extra: Option<(&[u8; 4], &[u8])>) -> Vec<u8> {
    let mut body = b"WAVE".to_vec();
    let mut chunk = |id: &[u8; 4], b: &[u8]| {
        body.extend_from_slice(id);
        body.extend_from_slice(&(b.len() as u32).to_le_bytes());
        body.extend_from_slice(b);
        if b.len() % 2 == 1 {
            body.push(0);
        }
    };
    chunk(b"fmt ", fmt);
    if let Some((id, b)) = extra {
        chunk(id, b);
    }
    chunk(b"data", data);
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn fmt_chunk(tag: u16, channels: u16, rate: u32, bits: u16) -> Vec<u8> {
    let align = channels * bits / 8;
    let mut f = Vec::new();
    f.extend_from_slice(&tag.to_le_bytes());
    f.extend_from_slice(&channels.to_le_bytes());
    f.extend_from_slice(&rate.to_le_bytes());
    f.extend_from_slice(&(rate * align as u32).to_le_bytes());
    f.extend_from_slice(&align.to_le_bytes());
    f.extend_from_slice(&bits.to_le_bytes());
    f
}

fn pcm(samples: &[i16]) -> Vec<u8> {
    samples.iter().flat_map(|s| s.to_le_bytes()).collect()
}

#[test]
fn reads_the_committed_speech() {
    let w = wav::read(common::data_path("speech.wav")).unwrap();
    assert_eq!(w.sample_rate, 16_000);
    let secs = w.samples.len() as f32 / 16_000.0;
    assert!((6.0..=12.0).contains(&secs), "{secs} s");
    // Speech is loud somewhere, the added noise is never digital silence.
    assert!(w.samples.iter().any(|&s| s.unsigned_abs() > 8000));
    assert!(w.samples[..1000].iter().any(|&s| s != 0));
}

#[test]
fn decodes_pcm16_mono_and_skips_other_chunks() {
    let samples = [0i16, 1, -1, i16::MAX, i16::MIN, 1234];
    let list = (b"LIST", &b"odd"[..]); // odd size: padded with one byte
    let bytes = wav_bytes(&fmt_chunk(1, 1, 16_000, 16), &pcm(&samples), Some(list));
    let w = wav::parse(&bytes).unwrap();
    assert_eq!(w.sample_rate, 16_000);
    assert_eq!(w.samples, samples);
    let f = w.to_f32();
    assert_eq!(f[3], 32767.0 / 32768.0);
    assert_eq!(f[4], -1.0);
}

#[test]
fn accepts_extensible_pcm_rejects_extensible_float() {
    let mut ext = fmt_chunk(0xFFFE, 1, 8_000, 16);
    ext.extend_from_slice(&22u16.to_le_bytes()); // cbSize
    ext.extend_from_slice(&16u16.to_le_bytes()); // valid bits
    ext.extend_from_slice(&4u32.to_le_bytes()); // channel mask
    let mut guid = [0u8; 16];
    guid[0] = 1; // KSDATAFORMAT_SUBTYPE_PCM starts with 0x0001
    ext.extend_from_slice(&guid);
    let w = wav::parse(&wav_bytes(&ext, &pcm(&[5, 6]), None)).unwrap();
    assert_eq!((w.sample_rate, w.samples), (8_000, vec![5, 6]));
    ext[24] = 3; // IEEE float subformat
    assert!(matches!(
        wav::parse(&wav_bytes(&ext, &pcm(&[5, 6]), None)),
        Err(WavError::UnsupportedFormat(0xFFFE))
    ));
}

#[test]
fn rejects_other_formats() {
    let data = pcm(&[1, 2, 3, 4]);
    type Check = fn(&WavError) -> bool;
    let cases: Vec<(Vec<u8>, Check)> = vec![
        (wav_bytes(&fmt_chunk(3, 1, 16_000, 32), &data, None), |e| {
            matches!(e, WavError::UnsupportedFormat(3))
        }),
        (wav_bytes(&fmt_chunk(1, 2, 16_000, 16), &data, None), |e| {
            matches!(e, WavError::UnsupportedChannels(2))
        }),
        (wav_bytes(&fmt_chunk(1, 1, 16_000, 8), &data, None), |e| {
            matches!(e, WavError::UnsupportedBitsPerSample(8))
        }),
        (wav_bytes(&fmt_chunk(1, 1, 16_000, 24), &data, None), |e| {
            matches!(e, WavError::UnsupportedBitsPerSample(24))
        }),
        (
            wav_bytes(&fmt_chunk(1, 1, 16_000, 16), &[1, 2, 3], None),
            |e| matches!(e, WavError::BadBlockAlign),
        ),
        (
            wav_bytes(&fmt_chunk(1, 1, 16_000, 16)[..14], &data, None),
            |e| matches!(e, WavError::MissingFormat),
        ),
        (b"RIFX\0\0\0\0WAVE".to_vec(), |e| {
            matches!(e, WavError::NotRiff)
        }),
        (b"RIFF\0\0\0\0AVI ".to_vec(), |e| {
            matches!(e, WavError::NotWave)
        }),
        (b"RIF".to_vec(), |e| matches!(e, WavError::NotRiff)),
    ];
    for (i, (bytes, ok)) in cases.iter().enumerate() {
        let err = wav::parse(bytes).unwrap_err();
        assert!(ok(&err), "case {i}: {err}");
        assert!(!err.to_string().is_empty());
    }
}

#[test]
fn rejects_truncated_and_missing_chunks() {
    let good = wav_bytes(&fmt_chunk(1, 1, 16_000, 16), &pcm(&[1, 2, 3, 4]), None);
    for cut in [good.len() - 1, good.len() - 8, 15, 13] {
        assert!(
            matches!(wav::parse(&good[..cut]), Err(WavError::Truncated)),
            "cut at {cut}"
        );
    }
    // Only a fmt chunk.
    let fmt_only = &good[..12 + 8 + 16];
    assert!(matches!(wav::parse(fmt_only), Err(WavError::MissingData)));
    // Only a data chunk.
    let mut data_only = good[..12].to_vec();
    data_only.extend_from_slice(&good[12 + 8 + 16..]);
    assert!(matches!(
        wav::parse(&data_only),
        Err(WavError::MissingFormat)
    ));
    // A missing file is an I/O error.
    assert!(matches!(
        wav::read(common::data_path("no-such.wav")),
        Err(WavError::Io(_))
    ));
}

/// `bytes` with the `data` chunk's size field (and the RIFF size) set to
/// `size`, as a program writing to a pipe leaves them.
fn streamed(mut bytes: Vec<u8>, size: u32) -> Vec<u8> {
    let at = bytes
        .windows(4)
        .position(|w| w == b"data")
        .expect("data chunk");
    bytes[at + 4..at + 8].copy_from_slice(&size.to_le_bytes());
    bytes[4..8].copy_from_slice(&size.to_le_bytes());
    bytes
}

#[test]
fn streamed_data_sizes_read_to_the_end() {
    let samples: Vec<u8> = (0..200u8).collect();
    let good = wav_bytes(&fmt_chunk(1, 1, 16000, 16), &samples, None);
    let expected = wav::parse(&good).unwrap();
    assert_eq!(expected.samples.len(), 100);
    // ffmpeg, other writers, sox (`sox -t raw ... - -t wav -`).
    for size in [u32::MAX, 0, 0x7FFF_F000] {
        assert_eq!(wav::parse(&streamed(good.clone(), size)).unwrap(), expected);
        // A stream cut in the middle of a sample keeps the whole ones.
        let mut cut = streamed(good.clone(), size);
        cut.push(7);
        assert_eq!(wav::parse(&cut).unwrap(), expected);
        assert_eq!(
            wav::read_from(&streamed(good.clone(), size)[..]).unwrap(),
            expected
        );
    }
    // Any other size past the end is still a truncated file.
    assert!(matches!(
        wav::parse(&streamed(good, 1000)),
        Err(WavError::Truncated)
    ));
}
