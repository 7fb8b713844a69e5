//! From speech probabilities to speech segments: silero-vad's
//! `get_speech_timestamps` rule, incrementally.
//!
//! Window `i` covers samples `512 i .. 512 (i + 1)`; its probability is `p_i`.
//!
//! 1. **Start**: when not in speech, the first window with
//!    `p >= threshold` (0.5) starts a segment at its first sample.
//! 2. **Hysteresis**: in speech, a window with `p < neg_threshold`
//!    (`max(threshold - 0.15, 0.01)`) marks a possible end at its first sample (if none
//!    is marked); a window with `p >= threshold` clears the mark. Windows in
//!    between change nothing.
//! 3. **End**: once the marked end lies `min_silence_ms` (100 ms) or more
//!    before the current window, the segment ends at the mark; it is kept if
//!    it is longer than `min_speech_ms` (250 ms). A segment still open at
//!    the end of the audio ends there, with the same length rule.
//! 4. **Padding**: each segment is widened by `speech_pad_ms` (30 ms) on
//!    both sides, clamped to the audio; where two segments are less than
//!    `2 x speech_pad_ms` apart, the gap is split between them instead.
//!
//! This is `get_speech_timestamps` of silero-vad 6.2 with its defaults
//! (`threshold = 0.5`, `neg_threshold = max(threshold - 0.15, 0.01)`,
//! `min_speech_duration_ms = 250`, `min_silence_duration_ms = 100`,
//! `speech_pad_ms = 30`, `max_speech_duration_s = inf`), except that the
//! `max_speech_duration_s` split is not implemented (with its default it
//! never applies) and the probabilities are those of full windows only
//! (silero zero-pads a trailing partial window into one more window).

use crate::shapes::{SAMPLE_RATE, WINDOW};

/// The segmentation rule's parameters; [`Default`] gives silero's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SegmentConfig {
    /// A window at or above this is speech (default 0.5). Compared in `f64`,
    /// as silero does with the model's `f32` output.
    pub threshold: f64,
    /// In speech, a window below this is silence (default
    /// `max(threshold - 0.15, 0.01)`, see [`SegmentConfig::with_threshold`]).
    pub neg_threshold: f64,
    /// Segments this long or shorter are dropped (default 250 ms).
    pub min_speech_ms: u32,
    /// Silence this long ends a segment (default 100 ms).
    pub min_silence_ms: u32,
    /// Padding added on each side of a segment (default 30 ms).
    pub speech_pad_ms: u32,
}

impl Default for SegmentConfig {
    fn default() -> Self {
        SegmentConfig::with_threshold(0.5)
    }
}

impl SegmentConfig {
    /// The defaults with another `threshold`, and `neg_threshold` derived
    /// from it as silero does: `max(threshold - 0.15, 0.01)`.
    pub fn with_threshold(threshold: f64) -> Self {
        SegmentConfig {
            threshold,
            neg_threshold: (threshold - 0.15).max(0.01),
            min_speech_ms: 250,
            min_silence_ms: 100,
            speech_pad_ms: 30,
        }
    }
}

/// A speech segment, in samples: `start .. end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    /// First sample.
    pub start: u64,
    /// One past the last sample.
    pub end: u64,
}

impl Segment {
    /// Start in seconds (at 16 kHz).
    pub fn start_secs(&self) -> f64 {
        self.start as f64 / SAMPLE_RATE as f64
    }

    /// End in seconds (at 16 kHz).
    pub fn end_secs(&self) -> f64 {
        self.end as f64 / SAMPLE_RATE as f64
    }
}

fn ms_to_samples(ms: u32) -> u64 {
    ms as u64 * SAMPLE_RATE as u64 / 1000
}

/// Turns probabilities into [`Segment`]s as they arrive (see the module
/// documentation for the rule); a segment is returned once the next one
/// (or the end of the audio) fixes its padding.
#[derive(Clone, Debug)]
pub struct Segmenter {
    config: SegmentConfig,
    min_speech: u64,
    min_silence: u64,
    pad: u64,
    /// Windows seen.
    windows: u64,
    /// Start of the open segment, if in speech.
    open: Option<u64>,
    /// Possible end of the open segment.
    temp_end: Option<u64>,
    /// The last closed segment, start padded, end not yet.
    pending: Option<Segment>,
}

impl Segmenter {
    /// A segmenter at the start of the audio.
    pub fn new(config: SegmentConfig) -> Self {
        Segmenter {
            config,
            min_speech: ms_to_samples(config.min_speech_ms),
            min_silence: ms_to_samples(config.min_silence_ms),
            pad: ms_to_samples(config.speech_pad_ms),
            windows: 0,
            open: None,
            temp_end: None,
            pending: None,
        }
    }

    /// The parameters.
    pub fn config(&self) -> SegmentConfig {
        self.config
    }

    /// Takes the probability of the next window; returns a segment when
    /// one is complete.
    pub fn push(&mut self, prob: f32) -> Option<Segment> {
        let cur = self.windows * WINDOW as u64;
        self.windows += 1;
        let prob = f64::from(prob);
        let speech = prob >= self.config.threshold;
        if speech {
            self.temp_end = None;
        }
        let Some(start) = self.open else {
            if speech {
                self.open = Some(cur);
            }
            return None;
        };
        if prob < self.config.neg_threshold {
            let end = *self.temp_end.get_or_insert(cur);
            if cur - end >= self.min_silence {
                self.open = None;
                self.temp_end = None;
                if end - start > self.min_speech {
                    return self.close(Segment { start, end });
                }
            }
        }
        None
    }

    /// Ends the audio after `total_samples` samples (including any trailing
    /// partial window); returns the last segments (at most two).
    pub fn finish(mut self, total_samples: u64) -> impl Iterator<Item = Segment> {
        let mut last = None;
        if let Some(start) = self.open.take() {
            if total_samples.saturating_sub(start) > self.min_speech {
                last = self.close(Segment {
                    start,
                    end: total_samples,
                });
            }
        }
        let tail = self.pending.take().map(|mut s| {
            s.end = (s.end + self.pad).min(total_samples);
            s
        });
        last.into_iter().chain(tail)
    }

    /// A segment closed (raw bounds): pads it against the pending one and
    /// returns the pending one, now final.
    fn close(&mut self, mut seg: Segment) -> Option<Segment> {
        let pad = self.pad;
        match self.pending.take() {
            None => {
                seg.start = seg.start.saturating_sub(pad);
                self.pending = Some(seg);
                None
            }
            Some(mut prev) => {
                let gap = seg.start.saturating_sub(prev.end);
                let widen = if gap < 2 * pad { gap / 2 } else { pad };
                prev.end += widen;
                seg.start = seg.start.saturating_sub(widen);
                self.pending = Some(seg);
                Some(prev)
            }
        }
    }
}

/// All segments of a recording of `total_samples` samples whose full
/// windows have probabilities `probs`.
pub fn segments(probs: &[f32], total_samples: u64, config: SegmentConfig) -> Vec<Segment> {
    let mut s = Segmenter::new(config);
    let mut out: Vec<Segment> = probs.iter().filter_map(|&p| s.push(p)).collect();
    out.extend(s.finish(total_samples));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocky probabilities: runs of 1 to 12 windows at one of six levels
    /// (the same generator as the Python script that made the expectations).
    fn blocks(seed: u64, n: usize) -> Vec<f32> {
        const LEVELS: [f32; 6] = [0.05, 0.2, 0.4, 0.45, 0.6, 0.9];
        let mut s = seed;
        let mut out = Vec::with_capacity(n + 12);
        while out.len() < n {
            s = (s * 1103515245 + 12345) % (1 << 31);
            let len = 1 + (s >> 16) % 12;
            let level = LEVELS[((s >> 8) % 6) as usize];
            out.extend(std::iter::repeat_n(level, len as usize));
        }
        out.truncate(n);
        out
    }

    /// `get_speech_timestamps_from_probs` of silero-vad 6.2.3 (its source,
    /// run under Python 3.11) on `blocks(seed, 100 + 37 seed)` with
    /// `audio_length_samples = 512 n + (97 seed) % 512`, default parameters.
    const SILERO: [(u64, &[(u64, u64)]); 8] = [
        (1, &[(15904, 30688), (43040, 66528)]),
        (2, &[(4128, 11744), (55840, 66016), (70688, 79840)]),
        (
            3,
            &[(0, 36320), (42528, 54240), (75808, 88032), (96288, 103904)],
        ),
        (
            4,
            &[
                (12320, 19424),
                (24608, 32224),
                (66592, 89056),
                (117280, 123872),
            ],
        ),
        (
            5,
            &[
                (19488, 29664),
                (57888, 63968),
                (68640, 74720),
                (87584, 96224),
                (101920, 108512),
                (123424, 130016),
            ],
        ),
        (
            6,
            &[
                (4640, 34272),
                (48672, 67040),
                (94752, 100320),
                (104992, 152032),
            ],
        ),
        (
            7,
            &[
                (0, 21984),
                (59424, 64992),
                (97312, 120288),
                (138784, 156640),
            ],
        ),
        (
            8,
            &[
                (0, 6112),
                (48672, 61920),
                (64544, 73696),
                (88608, 98784),
                (103456, 109024),
                (111136, 116704),
                (129568, 135136),
                (150048, 177632),
                (193568, 203016),
            ],
        ),
    ];

    fn pairs(segs: &[Segment]) -> Vec<(u64, u64)> {
        segs.iter().map(|s| (s.start, s.end)).collect()
    }

    #[test]
    fn matches_silero_on_generated_probabilities() {
        for (seed, want) in SILERO {
            let n = 100 + 37 * seed as usize;
            let total = 512 * n as u64 + (97 * seed) % 512;
            let got = segments(&blocks(seed, n), total, SegmentConfig::default());
            assert_eq!(pairs(&got), want, "seed {seed}");
        }
    }

    #[test]
    fn matches_silero_with_other_parameters() {
        // threshold=0.6, min_speech_duration_ms=100, min_silence_duration_ms=200,
        // speech_pad_ms=50, 400 windows, audio_length_samples = 400 * 512.
        let want = [
            (6368, 13088),
            (24800, 41760),
            (49888, 63776),
            (69344, 72992),
            (79584, 89376),
            (114912, 119584),
            (131808, 139040),
            (165088, 181024),
            (193248, 199456),
        ];
        let config = SegmentConfig {
            min_speech_ms: 100,
            min_silence_ms: 200,
            speech_pad_ms: 50,
            ..SegmentConfig::with_threshold(0.6)
        };
        let got = segments(&blocks(42, 400), 400 * 512, config);
        assert_eq!(pairs(&got), want);
    }

    #[test]
    fn incremental_equals_batch_and_edge_cases() {
        let probs = blocks(8, 396);
        let mut s = Segmenter::new(SegmentConfig::default());
        let mut got = Vec::new();
        for &p in &probs {
            got.extend(s.push(p));
        }
        got.extend(s.finish(396 * 512 + 264));
        assert_eq!(
            got,
            segments(&probs, 396 * 512 + 264, SegmentConfig::default())
        );
        // No speech, no audio, speech to the very end.
        assert!(segments(&[0.1; 50], 50 * 512, SegmentConfig::default()).is_empty());
        assert!(segments(&[], 0, SegmentConfig::default()).is_empty());
        let all = segments(&[0.9; 20], 20 * 512, SegmentConfig::default());
        assert_eq!(pairs(&all), [(0, 20 * 512)]);
        // Too short: 7 windows = 224 ms <= 250 ms.
        assert!(segments(&[0.9; 7], 7 * 512, SegmentConfig::default()).is_empty());
        assert_eq!(all[0].end_secs(), 0.64);
    }
}
