#!/usr/bin/env python3
"""Allocation traces (format v1) of DenseNet-121, ResNet-50 and BERT-base
as PyTorch's native CUDA caching allocator sees them.

Per model, one child process: the model (gpu_check.py's: random weights
from seed 0, cuDNN benchmark off, deterministic cuDNN) is moved to the
device first, untraced; then each forward (inside ``torch.no_grad``, the
input copied to the device inside the run, the output copied back and
every device tensor dropped inside the run) is recorded with
``torch.cuda.memory._record_memory_history`` and read back from
``torch.cuda.memory._snapshot()``'s ``device_traces`` (actions ``alloc``
and ``free_completed``). Written to OUT_DIR:

- ``<model>-mixed.trace``: the runs in gpu_check.py's order for that model
  (``GPU_CHECK_BATCHES`` changes it, as it does for gpu_check.py), from a
  process that ran nothing before: its first run holds the process's
  one-time allocations (cuBLAS's workspace, kept for the process's life);
- ``<model>-<shape>.trace``: one run per shape of that order, recorded
  after the mixed runs in the same process (steady state);
- ``summary.json``: per run, what was traced and PyTorch's own peaks.

Trace rules (format v1, ``traces/README.md``): ids restart at 0 in each run;
every alloc is freed once before the next ``run`` line. A block still alive
when the run ends (a workspace the process keeps, a free requested but not
completed) is freed at the run's end in the trace, counted, and named in a
comment. A free of a block made before the run (none is expected) is left
out and counted.

Usage (on a machine with an NVIDIA GPU, PyTorch, torchvision, transformers):

    python3 tools/gpu-check/record_traces.py OUT_DIR [--models densenet121,resnet50,bert]

Without a GPU (or without torch) it prints ``record_traces: not run: ...``
and exits 0 (1 with ``--require-gpu``). The conversion from a snapshot to a
trace (``run_events``, ``trace_text``) needs no torch:
``tools/gpu-check/test_record_traces.py`` checks it on hand-made snapshots.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20


# -- the conversion (no torch) --------------------------------------------


def run_events(entries):
    """The trace of one run from its snapshot trace entries (dicts with
    ``action``, ``addr``, ``size``, as ``_snapshot()["device_traces"][d]``
    holds them, oldest first).

    Returns a dict: ``events`` (``("alloc", id, bytes)`` / ``("free", id)``,
    every alloc freed once: blocks alive at the end are freed last, in
    allocation order), ``allocs``, ``alive_at_end`` (``[(id, bytes,
    free_requested)]``: freed at the end here), ``earlier_frees`` (frees of
    blocks made before the run: left out), ``zero_size`` (allocs of no bytes:
    left out), ``segment_allocs`` / ``segment_frees`` (``cudaMalloc`` /
    ``cudaFree`` of the caching allocator during the run), ``streams`` (how
    many streams allocated), ``peak`` (most bytes live at once: the run's
    lower bound).

    Raises ``ValueError`` for entries no allocator could have made (a second
    live alloc at one address, a malformed entry)."""
    live = {}  # address -> [id, bytes, free_requested]
    events = []
    out = dict(allocs=0, earlier_frees=0, zero_size=0, segment_allocs=0,
               segment_frees=0, peak=0)
    streams = set()
    in_use = 0
    next_id = 0
    for n, e in enumerate(entries):
        action = e.get("action")
        if action == "alloc":
            addr, size = _field(e, "addr", n), _field(e, "size", n)
            if size <= 0:
                out["zero_size"] += 1
                continue
            if addr in live:
                raise ValueError(f"entry {n}: alloc at {addr:#x}, where a block of this run is live")
            live[addr] = [next_id, size, False]
            events.append(("alloc", next_id, size))
            next_id += 1
            out["allocs"] += 1
            in_use += size
            out["peak"] = max(out["peak"], in_use)
            streams.add(e.get("stream", 0))
        elif action == "free_requested":
            addr = _field(e, "addr", n)
            if addr in live:
                live[addr][2] = True
        elif action == "free_completed":
            addr = _field(e, "addr", n)
            block = live.pop(addr, None)
            if block is None:
                out["earlier_frees"] += 1
                continue
            events.append(("free", block[0]))
            in_use -= block[1]
        elif action == "segment_alloc":
            out["segment_allocs"] += 1
        elif action == "segment_free":
            out["segment_frees"] += 1
    alive = sorted(live.values())
    for ident, _, _ in alive:
        events.append(("free", ident))
    out["events"] = events
    out["alive_at_end"] = [tuple(a) for a in alive]
    out["streams"] = len(streams)
    return out


def _field(entry, name, n):
    v = entry.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"entry {n}: {name} {v!r} is not a non-negative integer")
    return v


def trace_text(model, runs, comments):
    """A trace v1 file: ``runs`` is ``[(label, run_events(...))]``;
    ``comments`` are lines for the header (without the ``# ``). Each run
    with blocks alive at its end, earlier frees or zero-size allocs gets a
    comment line saying so."""
    lines = [f"# trace v1 model={model} input={','.join(label for label, _ in runs)}"]
    lines += [f"# {c}" for c in comments]
    for i, (label, r) in enumerate(runs, 1):
        note = (f"run {i} ({label}): {r['allocs']} allocs, peak live {r['peak'] / MIB:.2f} MiB, "
                f"{r['segment_allocs']} cudaMalloc / {r['segment_frees']} cudaFree of the caching allocator")
        alive = r["alive_at_end"]
        if alive:
            pending = sum(1 for a in alive if a[2])
            note += (f"; {len(alive)} blocks alive at the run's end, {sum(a[1] for a in alive)} bytes "
                     f"(ids {','.join(str(a[0]) for a in alive)}; {pending} of them with a free requested, "
                     "not completed), freed at the run's end here")
        if r["earlier_frees"]:
            note += f"; {r['earlier_frees']} frees of blocks made before the run, left out"
        if r["zero_size"]:
            note += f"; {r['zero_size']} zero-byte allocs, left out"
        if r["streams"] > 1:
            note += f"; allocations on {r['streams']} streams"
        lines.append(f"# {note}")
    for label, r in runs:
        lines.append(f"run {label}")
        for ev in r["events"]:
            lines.append(f"alloc {ev[1]} {ev[2]}" if ev[0] == "alloc" else f"free {ev[1]}")
    return "\n".join(lines) + "\n"


def label_of(model, size, bert_batch):
    """A run's label: the shape of the model's input."""
    return f"{bert_batch}x{size}" if model == "bert" else f"{size}x3x224x224"


# -- recording (torch, a GPU) ---------------------------------------------


# The history's `context` (which stack traces it keeps): none, unless a run
# recorded nothing that way (then "alloc", and the run is recorded again).
CONTEXT = [None]


def _start_history(torch):
    """Records every allocator event from now on (stack traces as CONTEXT
    says); returns how many entries the history held before (0 where it can
    be cleared)."""
    import inspect

    rec = torch.cuda.memory._record_memory_history
    kw = dict(context=CONTEXT[0], stacks="python")
    if "clear_history" in inspect.signature(rec).parameters:
        rec("all", clear_history=True, **kw)
        return 0
    rec("all", **kw)
    return len(torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()])


def child(args):
    sys.path.insert(0, HERE)
    import gpu_check  # MODELS (with GPU_CHECK_BATCHES), inputs, make_model
    import torch

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    dev = torch.device("cuda")
    name = args.child
    model, call = gpu_check.make_model(name)
    model = model.to(dev).eval()  # weights: not traced
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated()
    order = gpu_check.MODELS[name]
    ordinal = torch.cuda.current_device()

    def record(x):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        base = _start_history(torch)
        with torch.no_grad():
            xd = x.to(dev)  # the input's copy: traced
            out = call(model, xd)
            host = out.cpu()
            torch.cuda.synchronize()
            del out, xd
        torch.cuda.synchronize()
        entries = torch.cuda.memory._snapshot()["device_traces"][ordinal][base:]
        torch.cuda.memory._record_memory_history(None)
        r = run_events(entries)
        if r["allocs"] == 0 and torch.cuda.max_memory_allocated() > before and CONTEXT[0] is None:
            print("record_traces: a run recorded nothing with context=None; recording again with "
                  "context='alloc'", file=sys.stderr)
            CONTEXT[0] = "alloc"
            del host
            return record(x)
        r["torch"] = dict(allocated_before=before, allocated_after=torch.cuda.memory_allocated(),
                          max_allocated=torch.cuda.max_memory_allocated(),
                          max_reserved=torch.cuda.max_memory_reserved())
        del host
        return r

    base_comments = [
        f"source: PyTorch {torch.__version__} (CUDA {torch.version.cuda}), native CUDA caching allocator, "
        f"on {torch.cuda.get_device_name()}; torch.cuda.memory._record_memory_history / _snapshot() "
        "device_traces, actions alloc and free_completed; recorded by tools/gpu-check/record_traces.py",
        f"model: {'transformers BertModel (BERT-base config)' if name == 'bert' else 'torchvision ' + name}, "
        "random weights (torch.manual_seed(0)), eval(), torch.no_grad(), cuDNN benchmark off, deterministic"
        + (f"; input token ids of batch {gpu_check.BERT_BATCH}, label BATCHxSEQUENCE" if name == "bert" else ""),
        "bytes: the size PyTorch asked its allocator for (the trace entry's size; the caching allocator "
        "rounds it up to 512 B)",
        "traced: every CUDA allocation made during the run, in its order: the input's copy to the device, "
        "activations, kernel workspaces (cuDNN, cuBLAS), the output (freed inside the run after its copy "
        "to the host)",
        f"not traced: the weights ({weights} bytes, on the device before the first run), host tensors",
    ]

    mixed, summary = [], {"model": name, "device": torch.cuda.get_device_name(),
                          "torch": torch.__version__, "weights_bytes": weights, "runs": []}
    xs = gpu_check.inputs(name, order)  # gpu_check.py's inputs, on the host
    for size, x in zip(order, xs):
        r = record(x)
        mixed.append((label_of(name, size, gpu_check.BERT_BATCH), r))
    files = {}
    path = os.path.join(args.out, f"{name}-mixed.trace")
    with open(path, "w") as f:
        f.write(trace_text(f"torch-{name}", mixed, base_comments + [
            "runs in tools/gpu-check/gpu_check.py's order, in a process that ran nothing before: the first "
            "run holds the process's one-time allocations (blocks alive at its end, freed there here)",
            f"history context={CONTEXT[0]!r} (the stack traces it keeps; no allocation of the model's)"]))
    files["mixed"] = path
    singles = []
    for size in sorted(set(order)):
        r = record(gpu_check.inputs(name, [size])[0])
        lab = label_of(name, size, gpu_check.BERT_BATCH)
        path = os.path.join(args.out, f"{name}-{lab}.trace")
        with open(path, "w") as f:
            f.write(trace_text(f"torch-{name}", [(lab, r)], base_comments + [
                "one run, recorded after the -mixed runs in the same process (steady state: one-time "
                "allocations made before)",
                f"history context={CONTEXT[0]!r} (the stack traces it keeps; no allocation of the model's)"]))
        files[lab] = path
        singles.append((lab, r))
    for kind, runs in (("mixed", mixed), ("single", singles)):
        for lab, r in runs:
            summary["runs"].append(dict(
                file=kind, label=lab, allocs=r["allocs"], peak=r["peak"],
                alive_at_end=len(r["alive_at_end"]),
                alive_at_end_bytes=sum(a[1] for a in r["alive_at_end"]),
                earlier_frees=r["earlier_frees"], segment_allocs=r["segment_allocs"],
                streams=r["streams"],
                torch_run_peak=r["torch"]["max_allocated"] - r["torch"]["allocated_before"],
                torch_max_reserved=r["torch"]["max_reserved"]))
    summary["files"] = {k: os.path.basename(v) for k, v in files.items()}
    with open(os.path.join(args.out, f".{name}.json"), "w") as f:
        json.dump(summary, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="folder for the traces and summary.json")
    p.add_argument("--models", default="densenet121,resnet50,bert")
    p.add_argument("--timeout", type=float, default=150, help="seconds per model's process")
    p.add_argument("--require-gpu", action="store_true", help="exit 1, not 0, without a GPU")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    models = [m for m in args.models.split(",") if m]
    bad = [m for m in models if m not in ("densenet121", "resnet50", "bert")]
    if bad:
        print(f"record_traces: unknown models {bad}", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError as e:
        print(f"record_traces: not run: no torch ({e})")
        return 1 if args.require_gpu else 0
    if getattr(torch, "__version__", "") == "fake" or not torch.cuda.is_available():
        print("record_traces: not run: no GPU (torch.cuda.is_available() is false or torch is a stand-in)")
        return 1 if args.require_gpu else 0
    os.makedirs(args.out, exist_ok=True)
    status, everything = 0, {}
    for m in models:
        t0 = time.time()
        print(f"-- record_traces: {m}", file=sys.stderr, flush=True)
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), args.out, "--child", m],
                                  timeout=args.timeout)
            ok = proc.returncode == 0
            why = f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            ok, why = False, f"timed out after {args.timeout:.0f} s"
        part = os.path.join(args.out, f".{m}.json")
        if not ok or not os.path.exists(part):
            print(f"record_traces: {m} failed ({why})")
            status = 1
            continue
        with open(part) as f:
            everything[m] = json.load(f)
        os.remove(part)
        everything[m]["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(everything, f, indent=1)
    print("\n{:<12} {:<6} {:>16} {:>7} {:>10} {:>11} {:>14} {:>8}".format(
        "model", "file", "run", "allocs", "peak MiB", "torch MiB", "alive at end", "mallocs"))
    for m, s in everything.items():
        for r in s["runs"]:
            print("{:<12} {:<6} {:>16} {:>7} {:>10.1f} {:>11.1f} {:>14} {:>8}".format(
                m, r["file"], r["label"], r["allocs"], r["peak"] / MIB, r["torch_run_peak"] / MIB,
                f"{r['alive_at_end']} ({r['alive_at_end_bytes'] / MIB:.1f} MiB)", r["segment_allocs"]))
    print("(peak: most bytes live at once in the trace; torch: max_memory_allocated over the run's start, "
          "blocks rounded to 512 B)")
    return status


if __name__ == "__main__":
    sys.exit(main())
