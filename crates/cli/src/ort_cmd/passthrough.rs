//! Running a child: its stdout (the JSON report) is collected, its stderr
//! (progress and errors) passes through to ours line by line as it comes,
//! once, with terminal escape sequences (ONNX Runtime's log colours)
//! removed when our stderr is not a terminal.

use std::io::{BufRead as _, BufReader, IsTerminal as _, Read as _, Write as _};
use std::process::{Command, ExitStatus, Stdio};

use crate::os;

/// How a child ended and what it sent.
pub struct ChildOutput {
    /// Its exit status.
    pub status: ExitStatus,
    /// All it wrote on stdout.
    pub stdout: Vec<u8>,
}

/// Runs `cmd` to its end, passing its stderr through.
pub fn run(mut cmd: Command) -> Result<ChildOutput, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start a child process: {e}"))?;
    let strip = !std::io::stderr().is_terminal();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let sent = std::thread::scope(|scope| {
        let reader = scope.spawn(move || {
            let mut sent = Vec::new();
            if let Some(mut pipe) = stdout {
                pipe.read_to_end(&mut sent).map(|_| sent)
            } else {
                Ok(sent)
            }
        });
        if let Some(pipe) = stderr {
            forward(pipe, strip);
        }
        reader.join()
    });
    let exit = os::wait_child(child).map_err(|e| format!("cannot wait for the child: {e}"))?;
    let stdout = sent
        .map_err(|_| "the thread reading the child's report panicked".to_string())?
        .map_err(|e| format!("cannot read the child's report: {e}"))?;
    Ok(ChildOutput {
        status: exit.status,
        stdout,
    })
}

/// Copies `pipe` to our stderr line by line until it closes.
fn forward(pipe: impl std::io::Read, strip: bool) {
    let mut reader = BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = if strip {
            strip_escapes(&line)
        } else {
            line.clone()
        };
        let _ = std::io::stderr().lock().write_all(&text);
    }
}

/// `bytes` without terminal escape sequences: CSI sequences (`ESC [`
/// parameters, then a final byte from `@` to `~`, as ONNX Runtime's
/// colours `ESC[1;31m` and `ESC[m`) and other two-byte `ESC x` sequences.
pub fn strip_escapes(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != 0x1b {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        i += 1;
        if bytes.get(i) == Some(&b'[') {
            i += 1;
            while i < bytes.len() && !(0x40..=0x7e).contains(&bytes[i]) {
                i += 1;
            }
        }
        // The final byte (or the second byte of `ESC x`).
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::strip_escapes;

    #[test]
    fn escapes_are_removed_and_text_kept() {
        assert_eq!(
            strip_escapes(b"\x1b[1;31m2026 [E:onnxruntime] bad\x1b[m\n"),
            b"2026 [E:onnxruntime] bad\n"
        );
        assert_eq!(strip_escapes(b"plain [1;31m text"), b"plain [1;31m text");
        assert_eq!(strip_escapes(b"a\x1bcb\x1b"), b"ab");
        assert_eq!(strip_escapes(b"cut \x1b[1;3"), b"cut ");
    }
}
