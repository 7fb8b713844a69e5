//! `tensor-arena plans show FILE`, and the plan store `replay --plans DIR`
//! starts from and saves to.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tensor_arena::plan::store::{self, StoreContents, StoreError};
use tensor_arena::{ModelKey, PlanStore};

/// `tensor-arena plans ...`.
#[derive(Debug, clap::Subcommand)]
pub enum PlansCommand {
    /// Check a plan store file and list what it holds: whose it is, each
    /// exact plan (key, blocks, size, lower bound) and each family (its
    /// structures and the shapes each was seen at, with their lower
    /// bounds).
    Show {
        /// The store file (`<model hash>.plans`).
        file: PathBuf,
    },
}

/// Runs a `plans` subcommand.
pub fn main(cmd: &PlansCommand) -> ExitCode {
    match cmd {
        PlansCommand::Show { file } => match show(file) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("tensor-arena: plan store {}: {e}", file.display());
                ExitCode::from(2)
            }
        },
    }
}

/// The listing of store file `path`, whatever kind of keys it holds.
fn show(path: &Path) -> Result<String, StoreError> {
    match store::read::<String>(path) {
        Ok(c) => Ok(listing(&c, |k| k.clone())),
        Err(StoreError::Mismatch(_)) => {
            let c = store::read::<Vec<usize>>(path)?;
            Ok(listing(&c, |k| format!("{k:?}")))
        }
        Err(e) => Err(e),
    }
}

fn listing<K>(c: &StoreContents<K>, name: impl Fn(&K) -> String) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model {:016x}, runtime {:?}, options {:?}",
        c.key.model, c.key.runtime, c.key.options
    );
    let _ = writeln!(out, "{} exact plans:", c.plans.len());
    let _ = writeln!(
        out,
        "  {:<28} {:>7} {:>14} {:>14} {:>7}",
        "key", "blocks", "size", "lower bound", "size/lb"
    );
    for (k, p) in &c.plans {
        let _ = writeln!(
            out,
            "  {:<28} {:>7} {:>14} {:>14} {:>7.3}",
            name(k),
            p.len(),
            p.size(),
            p.lower_bound(),
            p.size() as f64 / p.lower_bound().max(1) as f64
        );
    }
    let _ = writeln!(out, "{} families:", c.families.len());
    for f in &c.families {
        let _ = writeln!(
            out,
            "  {} (id {:016x}): {} structure(s)",
            f.name,
            f.id,
            f.structures.len()
        );
        for (i, s) in f.structures.iter().enumerate() {
            let _ = writeln!(
                out,
                "    structure {i}: {} blocks, {} events, {} shape(s)",
                s.aligns.len(),
                s.events.len(),
                s.shapes.len()
            );
            for shape in &s.shapes {
                let _ = writeln!(
                    out,
                    "      dims {:?}: lower bound {}",
                    shape.dims, shape.lower_bound
                );
            }
        }
    }
    out
}

/// The store `replay --plans DIR` uses: keyed by the model the workload
/// replays (the first trace's `model=`, else the built-in model and batch:
/// a trace holds no model bytes, so its model's name stands for them) and
/// this program's version; a replay's options do not change its
/// allocation order.
pub fn replay_store(
    dir: &Path,
    traces: &[PathBuf],
    model: &str,
    batch: u32,
) -> Result<PlanStore, String> {
    let identity = match traces.first() {
        Some(t) => format!("trace model {}", trace_model(t)?),
        None => format!("built-in model {model} batch {batch}"),
    };
    let key = ModelKey::new(
        identity.as_bytes(),
        format!("tensor-arena replay {}", env!("CARGO_PKG_VERSION")),
        String::new(),
    );
    Ok(PlanStore::new(dir, key))
}

/// The `model=` of a trace file's header (the file name where it has
/// none).
fn trace_model(path: &Path) -> Result<String, String> {
    let f =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut first = String::new();
    // The header is the first line; no more than 64 KiB of it is read.
    std::io::BufReader::new(std::io::Read::take(f, 64 << 10))
        .read_line(&mut first)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("model="))
        .map(str::to_owned)
        .unwrap_or_else(|| path.display().to_string()))
}
