//! One process per strategy.
//!
//! By default `replay` runs each strategy in a fresh child process of this
//! same binary (`tensor-arena replay --child NAME ...`, a hidden option), one
//! after another, so that no strategy runs on what another left behind: the
//! heap, glibc's mmap threshold and the page tables start fresh each time.
//! The child replays the workload and writes a [`ChildReport`] as JSON on its
//! stdout (a pipe); its stderr is the parent's, for progress. The parent
//! then reaps it with `wait4`, which gives its peak resident memory.
//!
//! A child that is killed by a signal, exits with an error or sends no
//! readable report becomes a [`StrategyResult`] with an `error` and no runs;
//! the other strategies still run.

use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::process::{Command, ExitCode, ExitStatus, Stdio};

use serde::{Deserialize, Serialize};

use crate::os;
use crate::replay::{Progress, StrategyResult, Timeline};
use crate::strategies::{failed, run_strategy, Settings, Strategy};
use crate::workload::Workload;
use tensor_arena::PlanStore;

/// The hidden option that makes `replay` a child running one strategy.
pub const CHILD_FLAG: &str = "--child";

/// Test hook: a child whose strategy is named in this variable aborts
/// (SIGABRT) before replaying, so tests can check how a crashed child is
/// reported. Nothing else reads it.
pub const ABORT_HOOK: &str = "TENSOR_ARENA_TEST_CHILD_ABORT";

/// What a child sends back on its stdout.
#[derive(Debug, Serialize, Deserialize)]
pub struct ChildReport {
    /// The strategy's result (everything but the timeline).
    pub result: StrategyResult,
    /// The timeline for `--svg` (empty unless asked for).
    pub timeline: Timeline,
}

/// The child's side: replays `workload` with `strategy` and writes the
/// [`ChildReport`] on stdout. Exit code 0 when the report was written, even
/// if runs failed (the report says so); 1 if it could not be written.
pub fn child_main(
    strategy: Strategy,
    workload: &Workload,
    settings: Settings,
    store: Option<&PlanStore>,
) -> ExitCode {
    if std::env::var_os(ABORT_HOOK).is_some_and(|v| v == strategy.name()) {
        std::process::abort();
    }
    let mut result = run_strategy(strategy, workload, settings, store, &Progress::new());
    let timeline = std::mem::take(&mut result.timeline);
    let report = ChildReport { result, timeline };
    let stdout = std::io::stdout().lock();
    let mut out = std::io::BufWriter::new(stdout);
    let written = serde_json::to_writer(&mut out, &report)
        .map_err(std::io::Error::from)
        .and_then(|()| out.flush());
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "tensor-arena: child {}: cannot send the report: {e}",
                strategy.name()
            );
            ExitCode::FAILURE
        }
    }
}

/// The parent's side: runs each of `strategies` in turn in a child process
/// started with `args` (the `replay` arguments that rebuild the workload and
/// settings) plus `--child NAME`.
pub fn run_in_children(
    strategies: &[Strategy],
    args: &[OsString],
    progress: &Progress,
) -> Vec<StrategyResult> {
    strategies
        .iter()
        .enumerate()
        .map(|(k, &s)| {
            run_child(s, args, progress, k + 1, strategies.len())
                .unwrap_or_else(|error| failed(s, error))
        })
        .collect()
}

/// Runs strategy `s` (the `k`-th of `n`) in a child and collects its report.
fn run_child(
    s: Strategy,
    args: &[OsString],
    progress: &Progress,
    k: usize,
    n: usize,
) -> Result<StrategyResult, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this program to start a child process: {e}"))?;
    let mut child = Command::new(&exe)
        .args(args)
        .arg(CHILD_FLAG)
        .arg(s.name())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start a child process ({}): {e}", exe.display()))?;
    progress.child_started(s.name(), child.id(), k, n);
    let mut sent = Vec::new();
    let read = match child.stdout.take() {
        Some(mut pipe) => pipe.read_to_end(&mut sent).map(drop),
        None => Ok(()),
    };
    let exit = os::wait_child(child).map_err(|e| format!("cannot wait for the child: {e}"))?;
    if !exit.status.success() {
        return Err(describe_failure(exit.status));
    }
    read.map_err(|e| format!("cannot read the child's report: {e}"))?;
    let report: ChildReport = serde_json::from_slice(&sent)
        .map_err(|e| format!("the child process sent no readable report: {e}"))?;
    let mut result = report.result;
    result.timeline = report.timeline;
    result.peak_rss_bytes = exit.peak_rss_bytes;
    Ok(result)
}

/// Says how a child ended badly: the signal that killed it, or its code.
pub fn describe_failure(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(sig) = status.signal() {
            let core = if status.core_dumped() {
                ", core dumped"
            } else {
                ""
            };
            return format!(
                "the child process was killed by signal {sig} ({}{core})",
                signal_name(sig)
            );
        }
    }
    match status.code() {
        Some(code) => format!("the child process exited with status {code}"),
        None => format!("the child process ended abnormally ({status})"),
    }
}

/// The usual name of signal `sig`.
#[cfg(unix)]
fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGXCPU => "SIGXCPU",
        _ => return format!("signal {sig}"),
    };
    name.to_owned()
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    #[test]
    fn failures_name_the_signal_or_code() {
        // Raw wait statuses: a signal in the low 7 bits, an exit code in the
        // second byte.
        let killed = describe_failure(ExitStatus::from_raw(libc::SIGKILL));
        assert!(killed.contains("signal 9 (SIGKILL)"), "{killed}");
        let aborted = describe_failure(ExitStatus::from_raw(libc::SIGABRT | 0x80));
        assert!(aborted.contains("SIGABRT, core dumped"), "{aborted}");
        let exited = describe_failure(ExitStatus::from_raw(3 << 8));
        assert_eq!(exited, "the child process exited with status 3");
    }
}
