#!/usr/bin/env python3
"""What runs in flight together would hold if their largest blocks came
from one arena they share: a simulation over a recorded trace.

`WORKERS` runs of the trace's shapes (each drawn at random, one after the
other on each worker) advance one event at a time, the worker chosen at
random at each step (runs in flight at independent speeds). Three figures,
each the most over the simulation:

- live: the bytes the runs have live together;
- per-run blocks: each run holding its plan's block for its whole length
  (the block taken as the run's lower bound: plans are within a few
  thousandths of it), as the workers do now;
- base plans + shared: each run holding the block of its blocks under
  THRESHOLD only, and its blocks of THRESHOLD or more served by one
  best-fit arena the workers share, which keeps what it reached (no fault
  in steady state).

    tools/shared_spikes.py traces/ort/ppocr-det-sizes.trace 1 4 16

prints one line per threshold (MiB) and seed. Events are not time, so this
says what sharing could hold, not how runs overlap in a real server
(docs/decisions.md, "What runs in flight together hold").
"""

import random
import sys

WORKERS = 4
STEPS = 20000
SEEDS = 5


def load(path):
    runs, cur = [], None
    for line in open(path):
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        if f[0] == "run":
            cur = []
            runs.append(cur)
        elif f[0] == "alloc":
            cur.append((True, int(f[1]), (int(f[2]) + 63) // 64 * 64))
        elif f[0] == "free":
            cur.append((False, int(f[1]), 0))
    return runs


def lower_bound(events, keep):
    live = peak = 0
    size = {}
    for alloc, i, s in events:
        if alloc:
            size[i] = s
            if keep(s):
                live += s
                peak = max(peak, live)
        elif keep(size[i]):
            live -= size[i]
    return peak


class BestFit:
    """A dynamic arena: each block in the smallest gap that holds it; its
    high-water mark never comes down."""

    def __init__(self):
        self.blocks, self.high_water = {}, 0

    def alloc(self, key, size):
        at, best = 0, None
        for lo, hi in sorted(self.blocks.values()):
            if lo - at >= size and (best is None or lo - at < best[0]):
                best = (lo - at, at)
            at = max(at, hi)
        off = best[1] if best else at
        self.blocks[key] = (off, off + size)
        self.high_water = max(self.high_water, off + size)

    def free(self, key):
        del self.blocks[key]


def simulate(runs, threshold, seed):
    rng = random.Random(seed)
    shared = BestFit()
    work, full, base = [None] * WORKERS, [0] * WORKERS, [0] * WORKERS
    pos, gen, live = [0] * WORKERS, [0] * WORKERS, [0] * WORKERS
    sizes = [{} for _ in range(WORKERS)]

    def start(k):
        # Worker k's next run: its whole block, and the block of its rest.
        work[k] = rng.choice(runs)
        pos[k], sizes[k] = 0, {}
        full[k] = lower_bound(work[k], lambda s: True)
        base[k] = lower_bound(work[k], lambda s: s < threshold)

    for k in range(WORKERS):
        start(k)
    most = [0, 0, 0]
    for _ in range(STEPS):
        k = rng.randrange(WORKERS)
        if pos[k] == len(work[k]):
            start(k)
            gen[k] += 1
        alloc, i, s = work[k][pos[k]]
        pos[k] += 1
        key = (k, gen[k], i)
        if alloc:
            sizes[k][i] = s
            live[k] += s
            if s >= threshold:
                shared.alloc(key, s)
        else:
            s = sizes[k][i]
            live[k] -= s
            if s >= threshold:
                shared.free(key)
        most[0] = max(most[0], sum(live))
        most[1] = max(most[1], sum(full))
        most[2] = max(most[2], sum(base) + shared.high_water)
    return most


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    runs = load(sys.argv[1])
    mib = 1 << 20
    for t in sys.argv[2:]:
        threshold = int(float(t) * mib)
        for seed in range(1, SEEDS + 1):
            live, per_run, two = simulate(runs, threshold, seed)
            print(f"threshold {t} MiB, seed {seed}: live {live / mib:.0f} MiB, per-run blocks "
                  f"{per_run / mib:.0f} ({per_run / live:.2f}x), base plans + shared "
                  f"{two / mib:.0f} ({two / live:.2f}x)")


if __name__ == "__main__":
    main()
