//! Allocation traces: the text format of `shared/traces/README.md`, version 1.
//!
//! A trace holds one or more *runs* (inference calls). Each run is a list of
//! [`Event`]s: a tensor is allocated (`alloc <id> <bytes>`) and later freed
//! (`free <id>`). Within a run, ids are unique and every alloc is freed
//! exactly once.
//!
//! ```text
//! # trace v1 model=<name> input=<shape>[,<shape>...]
//! # any other line starting with '#' is a comment
//! run <label>
//! alloc <id> <bytes>
//! free <id>
//! ```
//!
//! The header line is optional. When the first line starts with the tokens
//! `#` `trace`, it is the header: its next token must be `v1`, and the rest
//! are `key=value` pairs (`model=`, `input=`; unknown keys are ignored so a
//! newer writer can add some). Any later line starting with `#` is a comment
//! and is not kept. Blank lines are skipped. Fields may be separated by any
//! run of spaces or tabs.
//!
//! [`Trace::parse`] checks everything the format promises and reports the
//! first violation with its 1-based line number (and the file name, for
//! [`Trace::from_file`]). [`TraceRun::lifetimes`] turns a run into half-open
//! event-index intervals `[alloc index, free index)`, the input of the offset
//! planner.
//!
//! ```
//! use tensor_arena::trace::{Event, Trace};
//!
//! let text = "# trace v1 model=tiny input=1x4\nrun 1x4\nalloc 0 16\nalloc 1 8\nfree 0\nfree 1\n";
//! let trace = Trace::parse(text).unwrap();
//! assert_eq!(trace.model.as_deref(), Some("tiny"));
//! let run = &trace.runs[0];
//! assert_eq!(run.events[0], Event::Alloc { id: 0, bytes: 16 });
//! assert_eq!(run.lower_bound(), 24);
//! assert_eq!(run.naive(), 24);
//! assert_eq!(Trace::parse(&trace.to_string()).unwrap(), trace);
//! ```

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The format version this module reads and writes (`# trace v1`).
pub const VERSION: u32 = 1;

/// A parsed trace file: an optional header and the runs in file order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Trace {
    /// The `model=` value of the header, if the header has one.
    pub model: Option<String>,
    /// The `input=` shapes of the header (one per run, in run order), split
    /// at commas; empty when the header has none.
    pub inputs: Vec<String>,
    /// The runs, in file order.
    pub runs: Vec<TraceRun>,
}

/// One run (inference call) of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TraceRun {
    /// The label of the `run` line (the shape of the model's main input).
    /// Labels need not be unique.
    pub label: String,
    /// The events of the run, in order. An event's index in this vector is
    /// its time in [`Lifetime`]s.
    pub events: Vec<Event>,
}

/// One line of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Event {
    /// A tensor of `bytes` bytes (never 0 in a parsed trace) is created.
    Alloc {
        /// Id of the tensor, unique within its run.
        id: u64,
        /// Size of the tensor in bytes.
        bytes: u64,
    },
    /// The tensor `id` is dead.
    Free {
        /// Id of a live tensor of the same run.
        id: u64,
    },
}

/// The lifetime of one tensor of a run: the half-open event-index interval
/// `[start, end)` from its `alloc` event to its `free` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Lifetime {
    /// Size in bytes (saturated at `usize::MAX` on targets where the traced
    /// size does not fit).
    pub size: usize,
    /// Index of the `alloc` event in [`TraceRun::events`].
    pub start: usize,
    /// Index of the `free` event in [`TraceRun::events`]; always `> start`.
    pub end: usize,
}

/// What went wrong while reading a trace; see [`TraceError`] for where.
#[derive(Debug)]
#[non_exhaustive]
pub enum TraceErrorKind {
    /// The file could not be read.
    Io(io::Error),
    /// The header (`# trace ...` on the first line) names a version other
    /// than 1; holds the version token as written.
    UnsupportedVersion(String),
    /// The header is not `# trace v1` followed by `key=value` pairs; holds a
    /// description.
    BadHeader(String),
    /// The line starts with something other than `run`, `alloc`, `free` or
    /// `#`; holds that word.
    UnknownKeyword(String),
    /// A field the keyword needs is missing.
    MissingField {
        /// The line's keyword.
        keyword: &'static str,
        /// Name of the first missing field.
        field: &'static str,
    },
    /// The line has more fields than its keyword takes.
    ExtraField {
        /// The line's keyword.
        keyword: &'static str,
        /// The first surplus field.
        found: String,
    },
    /// A numeric field is not a decimal number that fits in `u64`.
    BadNumber {
        /// Name of the field (`id` or `bytes`).
        field: &'static str,
        /// The field as written.
        found: String,
    },
    /// An `alloc` of zero bytes.
    ZeroBytes {
        /// The id of the allocation.
        id: u64,
    },
    /// An `alloc` or `free` before the first `run` line.
    OutsideRun {
        /// The line's keyword.
        keyword: &'static str,
    },
    /// An id allocated a second time within one run.
    DuplicateId {
        /// The id.
        id: u64,
        /// Line of its first `alloc`.
        first_line: usize,
    },
    /// A `free` of an id never allocated in this run.
    UnknownFree {
        /// The id.
        id: u64,
    },
    /// A second `free` of the same id.
    DoubleFree {
        /// The id.
        id: u64,
        /// Line of its first `free`.
        freed_line: usize,
    },
    /// A run ended (at the next `run` line or the end of the file) with
    /// tensors still live. The error's line is the `alloc` line of the
    /// earliest of them.
    Unfreed {
        /// The id allocated earliest among those still live.
        id: u64,
        /// Label of the run.
        run: String,
        /// How many tensors were still live.
        live: usize,
    },
}

/// A trace reading error: what ([`TraceErrorKind`]), and where (1-based line
/// number, and file path when read with [`Trace::from_file`]).
#[derive(Debug)]
pub struct TraceError {
    path: Option<PathBuf>,
    line: Option<usize>,
    kind: TraceErrorKind,
}

impl TraceError {
    fn at(line: usize, kind: TraceErrorKind) -> Self {
        TraceError {
            path: None,
            line: Some(line),
            kind,
        }
    }

    fn with_path(mut self, path: &Path) -> Self {
        self.path = Some(path.to_path_buf());
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> &TraceErrorKind {
        &self.kind
    }

    /// What went wrong, by value.
    pub fn into_kind(self) -> TraceErrorKind {
        self.kind
    }

    /// The 1-based line number of the offending line (`None` for I/O errors).
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The file being read, when the trace came from [`Trace::from_file`].
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

impl fmt::Display for TraceErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "cannot read trace: {e}"),
            Self::UnsupportedVersion(v) => {
                write!(f, "unsupported trace version `{v}` (expected `v{VERSION}`)")
            }
            Self::BadHeader(what) => write!(f, "bad header: {what}"),
            Self::UnknownKeyword(k) => {
                write!(f, "unknown keyword `{k}` (expected run, alloc, free or #)")
            }
            Self::MissingField { keyword, field } => write!(f, "`{keyword}` needs <{field}>"),
            Self::ExtraField { keyword, found } => {
                write!(f, "extra field `{found}` after `{keyword}`")
            }
            Self::BadNumber { field, found } => {
                write!(f, "<{field}> `{found}` is not a non-negative integer")
            }
            Self::ZeroBytes { id } => write!(f, "alloc {id} has 0 bytes"),
            Self::OutsideRun { keyword } => write!(f, "`{keyword}` before any `run` line"),
            Self::DuplicateId { id, first_line } => {
                write!(f, "id {id} allocated twice in one run (first at line {first_line})")
            }
            Self::UnknownFree { id } => write!(f, "free of id {id}, never allocated in this run"),
            Self::DoubleFree { id, freed_line } => {
                write!(f, "id {id} freed twice (first at line {freed_line})")
            }
            Self::Unfreed { id, run, live } => write!(
                f,
                "run `{run}` ends with {live} tensor(s) never freed; the first is id {id}, allocated here"
            ),
        }
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.path, self.line) {
            (Some(p), Some(l)) => write!(f, "{}:{l}: {}", p.display(), self.kind),
            (Some(p), None) => write!(f, "{}: {}", p.display(), self.kind),
            (None, Some(l)) => write!(f, "line {l}: {}", self.kind),
            (None, None) => write!(f, "{}", self.kind),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            TraceErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl Trace {
    /// Parses the text of a trace and checks it (see the module docs).
    ///
    /// # Errors
    /// The first violation of the format, with its 1-based line number.
    pub fn parse(text: &str) -> Result<Trace, TraceError> {
        let mut parser = Parser::default();
        for (index, line) in text.lines().enumerate() {
            parser.line(index + 1, line)?;
        }
        parser.finish()
    }

    /// Reads and parses the trace file at `path`.
    ///
    /// # Errors
    /// An I/O error or the first format violation; either way the error
    /// carries `path` (and the line number for format errors).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| TraceError {
            path: Some(path.to_path_buf()),
            line: None,
            kind: TraceErrorKind::Io(e),
        })?;
        Trace::parse(&text).map_err(|e| e.with_path(path))
    }

    /// Writes the trace in the v1 text format: the header line, then every
    /// run. Comments of a parsed file other than the header are not kept.
    ///
    /// # Errors
    /// I/O errors of `out`, and [`io::ErrorKind::InvalidInput`] when a
    /// model name, input shape or run label is empty (inputs and labels
    /// only) or holds whitespace, or an input shape holds a comma: such a
    /// trace could not be read back as it is.
    pub fn write(&self, out: &mut impl Write) -> io::Result<()> {
        self.check_writable()?;
        write!(out, "{self}")
    }

    fn check_writable(&self) -> io::Result<()> {
        let bad = |what: &str, value: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what} `{value}` cannot be written: empty or holds whitespace"),
            )
        };
        if let Some(model) = &self.model {
            if model.chars().any(char::is_whitespace) {
                return Err(bad("model", model));
            }
        }
        for input in &self.inputs {
            if !is_token(input) || input.contains(',') {
                return Err(bad("input", input));
            }
        }
        for run in &self.runs {
            if !is_token(&run.label) {
                return Err(bad("run label", &run.label));
            }
        }
        Ok(())
    }
}

/// Whether `s` can be written as one whitespace-separated field.
fn is_token(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(char::is_whitespace)
}

/// The v1 text (as [`Trace::write`] without its checks: a label holding
/// whitespace is written as it is and will not read back).
impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "# trace v{VERSION}")?;
        if let Some(model) = &self.model {
            write!(f, " model={model}")?;
        }
        if !self.inputs.is_empty() {
            write!(f, " input={}", self.inputs.join(","))?;
        }
        writeln!(f)?;
        for run in &self.runs {
            writeln!(f, "run {}", run.label)?;
            for event in &run.events {
                match event {
                    Event::Alloc { id, bytes } => writeln!(f, "alloc {id} {bytes}")?,
                    Event::Free { id } => writeln!(f, "free {id}")?,
                }
            }
        }
        Ok(())
    }
}

impl TraceRun {
    /// A run from an arena's recording: block `i` becomes tensor `i` of
    /// `lens[i]` bytes (its rounded size when `lens` is short); blocks the
    /// run did not free are freed at its end, as the format requires.
    pub fn from_recording(label: String, rec: &crate::plan::Recording, lens: &[usize]) -> Self {
        let mut events = Vec::with_capacity(rec.events.len());
        let mut live = vec![false; rec.blocks.len()];
        for ev in &rec.events {
            match *ev {
                crate::plan::PlanEvent::Alloc(i) => {
                    let bytes = lens
                        .get(i as usize)
                        .copied()
                        .unwrap_or_else(|| rec.blocks.get(i as usize).map_or(0, |b| b.0));
                    if let Some(l) = live.get_mut(i as usize) {
                        *l = true;
                    }
                    events.push(Event::Alloc {
                        id: u64::from(i),
                        bytes: bytes as u64,
                    });
                }
                crate::plan::PlanEvent::Free(i) => {
                    if let Some(l) = live.get_mut(i as usize) {
                        *l = false;
                    }
                    events.push(Event::Free { id: u64::from(i) });
                }
            }
        }
        for (i, _) in live.iter().enumerate().filter(|(_, &l)| l) {
            events.push(Event::Free { id: i as u64 });
        }
        Self { label, events }
    }

    /// The lifetimes of the run's tensors, in alloc order: `[alloc event
    /// index, free event index)`.
    ///
    /// Runs built by hand need not be valid; then a tensor never freed lives
    /// to `events.len()`, a free of an id that is not live is ignored, and
    /// an id allocated again while live leaves the first tensor live to the
    /// end of the run.
    pub fn lifetimes(&self) -> Vec<Lifetime> {
        let end_of_run = self.events.len();
        let mut out: Vec<Lifetime> = Vec::new();
        let mut live: HashMap<u64, usize> = HashMap::new();
        for (index, event) in self.events.iter().enumerate() {
            match *event {
                Event::Alloc { id, bytes } => {
                    live.insert(id, out.len());
                    out.push(Lifetime {
                        size: usize::try_from(bytes).unwrap_or(usize::MAX),
                        start: index,
                        end: end_of_run,
                    });
                }
                Event::Free { id } => {
                    if let Some(slot) = live.remove(&id) {
                        out[slot].end = index;
                    }
                }
            }
        }
        out
    }

    /// The number of `alloc` events.
    pub fn allocs(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::Alloc { .. }))
            .count()
    }

    /// The lower bound of any offset plan for this run: the maximum, over
    /// event indices, of the bytes live at once (a tensor is live at its
    /// alloc index and not at its free index). Saturates at `u64::MAX`.
    pub fn lower_bound(&self) -> u64 {
        let mut bytes: HashMap<u64, u64> = HashMap::new();
        let mut live: u128 = 0;
        let mut peak: u128 = 0;
        for event in &self.events {
            match *event {
                Event::Alloc { id, bytes: size } => {
                    if let Some(old) = bytes.insert(id, size) {
                        // Invalid run: the shadowed tensor stays live for good.
                        live += u128::from(old);
                    }
                    live += u128::from(size);
                    peak = peak.max(live);
                }
                Event::Free { id } => {
                    if let Some(size) = bytes.remove(&id) {
                        live -= u128::from(size);
                    }
                }
            }
        }
        u64::try_from(peak).unwrap_or(u64::MAX)
    }

    /// The naive footprint: the sum of all allocation sizes (every tensor
    /// its own buffer). Saturates at `u64::MAX`.
    pub fn naive(&self) -> u64 {
        self.events.iter().fold(0u64, |sum, event| match *event {
            Event::Alloc { bytes, .. } => sum.saturating_add(bytes),
            Event::Free { .. } => sum,
        })
    }
}

/// The state of one id within the current run.
#[derive(Debug, Clone, Copy)]
struct IdState {
    alloc_line: usize,
    freed_line: Option<usize>,
}

/// The run being parsed.
#[derive(Debug, Default)]
struct OpenRun {
    run: TraceRun,
    ids: HashMap<u64, IdState>,
    live: usize,
}

/// Line-by-line trace parser.
#[derive(Debug, Default)]
struct Parser {
    trace: Trace,
    open: Option<OpenRun>,
}

impl Parser {
    fn line(&mut self, number: usize, line: &str) -> Result<(), TraceError> {
        let text = line.trim_start();
        if text.is_empty() {
            return Ok(());
        }
        if text.starts_with('#') {
            if number == 1 {
                self.header(text)
                    .map_err(|kind| TraceError::at(number, kind))?;
            }
            return Ok(());
        }
        let mut fields = text.split_ascii_whitespace();
        let keyword = fields.next().unwrap_or_default();
        match keyword {
            "run" => self.run(number, fields),
            "alloc" => self.alloc(number, fields),
            "free" => self.free(number, fields),
            other => Err(TraceError::at(
                number,
                TraceErrorKind::UnknownKeyword(other.to_string()),
            )),
        }
    }

    /// Reads the header if `text` (the first line) is one.
    fn header(&mut self, text: &str) -> Result<(), TraceErrorKind> {
        let mut fields = text.split_ascii_whitespace();
        if fields.next() != Some("#") || fields.next() != Some("trace") {
            return Ok(()); // An ordinary comment: no header.
        }
        let version = fields
            .next()
            .ok_or_else(|| TraceErrorKind::BadHeader("`# trace` without a version".into()))?;
        if version != format!("v{VERSION}") {
            return Err(TraceErrorKind::UnsupportedVersion(version.to_string()));
        }
        for field in fields {
            let (key, value) = field.split_once('=').ok_or_else(|| {
                TraceErrorKind::BadHeader(format!("`{field}` is not a key=value pair"))
            })?;
            match key {
                "model" => self.trace.model = Some(value.to_string()),
                "input" => self.trace.inputs = parse_inputs(value)?,
                _ => {} // Unknown keys are for newer writers; ignore them.
            }
        }
        Ok(())
    }

    fn run<'a>(
        &mut self,
        number: usize,
        mut fields: impl Iterator<Item = &'a str>,
    ) -> Result<(), TraceError> {
        let label = required(number, "run", "label", fields.next())?;
        no_more(number, "run", fields)?;
        self.close_run()?;
        self.open = Some(OpenRun {
            run: TraceRun {
                label: label.to_string(),
                events: Vec::new(),
            },
            ..OpenRun::default()
        });
        Ok(())
    }

    fn alloc<'a>(
        &mut self,
        number: usize,
        mut fields: impl Iterator<Item = &'a str>,
    ) -> Result<(), TraceError> {
        let id = number_field(number, "alloc", "id", fields.next())?;
        let bytes = number_field(number, "alloc", "bytes", fields.next())?;
        no_more(number, "alloc", fields)?;
        if bytes == 0 {
            return Err(TraceError::at(number, TraceErrorKind::ZeroBytes { id }));
        }
        let open = self.open_run(number, "alloc")?;
        let state = IdState {
            alloc_line: number,
            freed_line: None,
        };
        if let Some(first) = open.ids.insert(id, state) {
            let kind = TraceErrorKind::DuplicateId {
                id,
                first_line: first.alloc_line,
            };
            return Err(TraceError::at(number, kind));
        }
        open.live += 1;
        open.run.events.push(Event::Alloc { id, bytes });
        Ok(())
    }

    fn free<'a>(
        &mut self,
        number: usize,
        mut fields: impl Iterator<Item = &'a str>,
    ) -> Result<(), TraceError> {
        let id = number_field(number, "free", "id", fields.next())?;
        no_more(number, "free", fields)?;
        let open = self.open_run(number, "free")?;
        let state = open
            .ids
            .get_mut(&id)
            .ok_or_else(|| TraceError::at(number, TraceErrorKind::UnknownFree { id }))?;
        if let Some(freed_line) = state.freed_line {
            let kind = TraceErrorKind::DoubleFree { id, freed_line };
            return Err(TraceError::at(number, kind));
        }
        state.freed_line = Some(number);
        open.live -= 1;
        open.run.events.push(Event::Free { id });
        Ok(())
    }

    fn open_run(
        &mut self,
        number: usize,
        keyword: &'static str,
    ) -> Result<&mut OpenRun, TraceError> {
        self.open
            .as_mut()
            .ok_or_else(|| TraceError::at(number, TraceErrorKind::OutsideRun { keyword }))
    }

    /// Checks that the open run (if any) freed everything and keeps it.
    fn close_run(&mut self) -> Result<(), TraceError> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        if open.live > 0 {
            let (id, state) = open
                .ids
                .iter()
                .filter(|(_, s)| s.freed_line.is_none())
                .min_by_key(|(_, s)| s.alloc_line)
                .map(|(id, s)| (*id, *s))
                .unwrap_or((
                    0,
                    IdState {
                        alloc_line: 0,
                        freed_line: None,
                    },
                ));
            let kind = TraceErrorKind::Unfreed {
                id,
                run: open.run.label,
                live: open.live,
            };
            return Err(TraceError::at(state.alloc_line, kind));
        }
        self.trace.runs.push(open.run);
        Ok(())
    }

    fn finish(mut self) -> Result<Trace, TraceError> {
        self.close_run()?;
        Ok(self.trace)
    }
}

/// Splits the header's `input=` value at commas; every shape non-empty.
fn parse_inputs(value: &str) -> Result<Vec<String>, TraceErrorKind> {
    if value.is_empty() {
        return Ok(Vec::new());
    }
    value
        .split(',')
        .map(|shape| {
            if shape.is_empty() {
                Err(TraceErrorKind::BadHeader(format!(
                    "empty shape in `input={value}`"
                )))
            } else {
                Ok(shape.to_string())
            }
        })
        .collect()
}

fn required<'a>(
    number: usize,
    keyword: &'static str,
    field: &'static str,
    value: Option<&'a str>,
) -> Result<&'a str, TraceError> {
    value.ok_or_else(|| TraceError::at(number, TraceErrorKind::MissingField { keyword, field }))
}

/// Parses a required decimal field: ASCII digits only (no sign), fits `u64`.
fn number_field(
    number: usize,
    keyword: &'static str,
    field: &'static str,
    value: Option<&str>,
) -> Result<u64, TraceError> {
    let text = required(number, keyword, field, value)?;
    let bad = || {
        let found = text.to_string();
        TraceError::at(number, TraceErrorKind::BadNumber { field, found })
    };
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    text.parse().map_err(|_| bad())
}

fn no_more<'a>(
    number: usize,
    keyword: &'static str,
    mut fields: impl Iterator<Item = &'a str>,
) -> Result<(), TraceError> {
    match fields.next() {
        None => Ok(()),
        Some(found) => {
            let found = found.to_string();
            Err(TraceError::at(
                number,
                TraceErrorKind::ExtraField { keyword, found },
            ))
        }
    }
}
