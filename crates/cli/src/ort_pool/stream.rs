//! The OCR request stream: one request a line, the shapes of det's input
//! and of the cls and rec batches it leads to (`tools/ocr-stream.py` makes
//! it from rendered images and det's own boxes).
//!
//! ```text
//! # a comment
//! det 1x3x960x672 cls 6x3x48x192 4x3x48x192 rec 6x3x48x385 4x3x48x1254
//! det 1x3x320x672
//! ```

use crate::ort_cmd::shapes::parse_shape;

/// The stream built into the command (64 requests, seed 2026).
pub const BUILT_IN: &str = include_str!("../../data/ocr-stream.txt");

/// The three models of the pipeline, in the order a request runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Text detection, once per image.
    Det,
    /// Angle classification, per batch of crops.
    Cls,
    /// Recognition, per batch of crops.
    Rec,
}

impl Stage {
    /// All of them, in order.
    pub const ALL: [Stage; 3] = [Stage::Det, Stage::Cls, Stage::Rec];

    /// The name in the stream and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Det => "det",
            Stage::Cls => "cls",
            Stage::Rec => "rec",
        }
    }

    /// Index into per-model arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One request: the model runs it makes, in order, each with its input's
/// shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `(model, input shape)` per run.
    pub runs: Vec<(Stage, Vec<usize>)>,
}

/// Parses a stream.
///
/// # Errors
/// The line and what is wrong with it: a word that is neither a model nor
/// a shape, a shape before any model, a request without det first, a shape
/// that is not rank 4, or no request at all.
pub fn parse(text: &str) -> Result<Vec<Request>, String> {
    let mut requests = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |msg: String| format!("stream line {}: {msg}", n + 1);
        let mut stage = None;
        let mut runs = Vec::new();
        for word in line.split_whitespace() {
            let named = Stage::ALL.into_iter().find(|s| s.name() == word);
            if let Some(s) = named {
                stage = Some(s);
                continue;
            }
            let Some(s) = stage else {
                return Err(at(format!("`{word}` comes before det, cls or rec")));
            };
            let shape = parse_shape(word).map_err(&at)?;
            if shape.len() != 4 {
                return Err(at(format!("`{word}` is not a rank-4 shape (NxCxHxW)")));
            }
            runs.push((s, shape));
        }
        if runs.first().map(|r| r.0) != Some(Stage::Det) {
            return Err(at("a request starts with det and its shape".into()));
        }
        requests.push(Request { runs });
    }
    if requests.is_empty() {
        return Err("the stream has no request".into());
    }
    Ok(requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_stream_parses() {
        let r = parse(BUILT_IN).unwrap();
        assert_eq!(r.len(), 64);
        assert!(r.iter().all(|q| q.runs[0].0 == Stage::Det));
        let crops: usize = r
            .iter()
            .flat_map(|q| q.runs.iter().filter(|(s, _)| *s == Stage::Rec))
            .map(|(_, shape)| shape[0])
            .sum();
        assert!(crops > 200, "{crops} crops");
    }

    #[test]
    fn bad_streams_say_where() {
        assert!(parse("").unwrap_err().contains("no request"));
        assert!(parse("1x3x32x32").unwrap_err().contains("line 1"));
        assert!(parse("# c\ncls 1x3x48x192").unwrap_err().contains("line 2"));
        assert!(parse("det 1x3x32").unwrap_err().contains("rank-4"));
        assert!(parse("det 1x3xAx32").unwrap_err().contains("line 1"));
        let ok = parse("det 1x3x64x64 cls 2x3x48x192 rec 2x3x48x320").unwrap();
        assert_eq!(ok[0].runs.len(), 3);
    }
}
