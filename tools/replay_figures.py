#!/usr/bin/env python3
"""Regenerate the `tensor-arena replay` figures of README.md and docs/replay.svg.

Usage (from anywhere in the repository):
    python3 tools/replay_figures.py

Builds the release CLI, then runs
    tensor-arena replay
    tensor-arena replay --trace traces/densenet121-mixed.trace
    tensor-arena replay --svg docs/replay.svg
and writes the first two summary tables into README.md between its marker comments
(`<!-- replay-summary:builtin -->` and `<!-- replay-summary:densenet -->`,
each followed by a ```text block). Nothing else in README.md changes: the
prose that quotes figures has to be checked by hand against the new tables.
"""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "tensor-arena"
RUNS = {
    "builtin": ["replay"],
    "densenet": ["replay", "--trace", "traces/densenet121-mixed.trace"],
}
# The timeline comes from a run of its own: recording it allocates from the
# system allocator too, which moves glibc's figures a little.
SVG = ["replay", "--svg", "docs/replay.svg"]


def summary(args):
    """The summary table (header and one row per strategy) of one replay."""
    print("+ tensor-arena " + " ".join(args), file=sys.stderr)
    out = subprocess.run([BIN, *args], cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    lines = out.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("summary "))
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    return "\n".join(lines[start:end])


def main():
    subprocess.run(["cargo", "build", "--release", "-p", "tensor-arena-cli"], cwd=ROOT, check=True)
    readme = ROOT / "README.md"
    text = readme.read_text()
    for name, args in RUNS.items():
        table = summary(args)
        pattern = re.compile(r"(<!-- replay-summary:%s -->\n```text\n).*?(\n```)" % name, re.S)
        text, n = pattern.subn(lambda m: m.group(1) + table + m.group(2), text)
        if n != 1:
            sys.exit(f"README.md: marker replay-summary:{name} found {n} times, expected once")
    readme.write_text(text)
    summary(SVG)
    print("README.md and docs/replay.svg updated; check the prose against the tables.", file=sys.stderr)


if __name__ == "__main__":
    main()
