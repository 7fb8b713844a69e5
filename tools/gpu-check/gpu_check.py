#!/usr/bin/env python3
"""GPU check of tensor-arena as PyTorch's CUDA allocator.

Runs DenseNet-121 at batches 16,1,4,1,8,16 and ResNet-50 at 64,8,32,8,64
(torchvision, random weights, torch.manual_seed(0), cuDNN benchmark off,
224x224 inputs), and BERT-base (transformers, random weights) at batch 8
with sequence lengths 512,128,64,64,512 (its shapes change every run and
its activations are not convolutions), with PyTorch's native caching
allocator and with tensor-arena by two routes, each in its own process
(PyTorch cannot change its allocator once it has allocated): `install()`,
the process's allocator, and `pool()` (`--routes`), torch.cuda.MemPool
scopes in a process that used CUDA natively first. Checks that the
outputs are identical to native and prints, per batch, the live peak,
each allocator's reserved bytes and the time per batch after warm-up, and
for `pool()` its figures against `install()`'s.

Usage (on a machine with an NVIDIA GPU, PyTorch and torchvision):

    cargo build --release -p tensor-arena-cuda
    python3 tools/gpu-check/gpu_check.py --lib target/release/libtensor_arena_cuda.so

or, with the wheel installed, without --lib.

Exit status: 0 when every output matched, 1 otherwise, 2 for bad usage or
a missing prerequisite.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
try:  # the installed wheel, if there is one
    import tensor_arena_cuda  # noqa: F401
except ImportError:  # the source tree (then --lib names the library)
    sys.path.insert(0, os.path.join(ROOT, "crates", "cuda", "python"))

# Per model, what changes from run to run: the batch of 224x224 images for
# the vision models, the sequence length (at batch BERT_BATCH) for BERT.
MODELS = {
    "densenet121": [16, 1, 4, 1, 8, 16],
    "resnet50": [64, 8, 32, 8, 64],
    "bert": [512, 128, 64, 64, 512],
}
BERT_BATCH = 8
MIB = 1 << 20
# Another order of shapes, for every process of a sitting:
# GPU_CHECK_BATCHES="bert=64,128,512;densenet121=1,4,16" (plan families
# predict a shape never seen once a model has shown two, so an order whose
# largest shape comes third shows first sight on a predicted plan).
for part in filter(None, os.environ.get("GPU_CHECK_BATCHES", "").split(";")):
    name, _, sizes = part.partition("=")
    if name not in MODELS or not sizes:
        raise SystemExit(f"GPU_CHECK_BATCHES: bad entry {part!r}")
    MODELS[name] = [int(x) for x in sizes.split(",")]


def inputs(model, batches):
    """The same inputs in both processes: CPU tensors from fixed seeds."""
    import torch

    out = []
    for i, b in enumerate(batches):
        g = torch.Generator().manual_seed(1000 + i)
        if model == "bert":
            out.append(torch.randint(0, 30522, (BERT_BATCH, b), generator=g))
        else:
            out.append(torch.randn(b, 3, 224, 224, generator=g))
    return out


def make_model(name):
    """The model with random weights from seed 0, on the host."""
    if name == "bert":
        import transformers

        config = transformers.BertConfig()  # BERT-base: 12 layers, 768 wide
        return transformers.BertModel(config), lambda m, x: m(input_ids=x).last_hidden_state
    import torchvision

    return getattr(torchvision.models, name)(weights=None), lambda m, x: m(x)


def child(args):
    """One model with one allocator; writes its figures as JSON and its
    outputs with torch.save."""
    arena = None
    if args.child == "arena":
        import tensor_arena_cuda

        # Before anything touches CUDA memory.
        arena = tensor_arena_cuda.install(args.lib)
    import torch

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    dev = torch.device("cuda")
    if args.child == "mempool":
        import tensor_arena_cuda

        # A process that already used CUDA with PyTorch's own allocator
        # (a matrix product: cuBLAS's workspace is PyTorch's, for good),
        # then the arena for a scope at a time (torch.cuda.MemPool).
        a = torch.ones(256, 256, device=dev)
        assert float((a @ a)[0, 0]) == 256.0
        # (and cuBLASLt's workspace: a product with a bias)
        assert float(torch.addmm(torch.ones(256, device=dev), a, a)[0, 0]) == 257.0
        del a
        arena = tensor_arena_cuda.Arena(args.lib)
    model, call = make_model(args.model)
    if args.child == "mempool":
        with arena.pool():  # no key: the weights outlive the scope
            model = model.to(dev).eval()
    else:
        model = model.to(dev).eval()
    scope = arena.pool if args.child == "mempool" else (arena.run if arena else None)
    batches = MODELS[args.model]
    plans = {}
    if args.plans and arena is not None:
        # The model's plans saved by an earlier process (--plans DIR): loaded
        # after the weights, before the first batch; saved after the last.
        plans["options"] = f"torch={torch.__version__} device={torch.cuda.get_device_name()}"
        try:
            plans["loaded"] = arena.load_plans(args.plans, args.model, plans["options"])
        except RuntimeError as e:
            plans.update(loaded=0, load_error=str(e))
            print(f"{args.model}: plan store not loaded: {e}", file=sys.stderr)
    # Inputs stay on the host; each batch copies its own in, inside the run,
    # so the live peak is weights + one batch's tensors.
    xs = inputs(args.model, batches)

    def reserved():
        if arena is None:
            return torch.cuda.memory_reserved()
        return arena.stats()["arena"]["reserved"]

    def forward(i, keep_output, measure=True):
        """One batch; returns (output on the host or None, live peak, reserved
        peak). Without `measure` (timed runs) nothing is asked of either
        allocator beyond the batch itself, and the peaks are None."""
        key = f"{args.model}:{batches[i]}"
        if arena is None:
            if measure:
                torch.cuda.reset_peak_memory_stats()
            x = xs[i].to(dev)
            out = call(model, x)
            host = out.cpu() if keep_output else None
            torch.cuda.synchronize()
            del out, x
            if not measure:
                return host, None, None
            return host, torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        with scope(key):
            x = xs[i].to(dev)
            out = call(model, x)
            host = out.cpu() if keep_output else None
            torch.cuda.synchronize()
            # Device tensors die inside the run, so it can be planned.
            del out, x
        if not measure:
            return host, None, None
        s = arena.stats()
        # The most device memory mapped during the run (a plan learned at
        # its end may shrink the arena after it).
        return host, s["last_run"]["peak_in_use"], s["last_run_peak_mapped"]

    rows = [{"batch": b} for b in batches]
    outputs = []
    with torch.inference_mode():
        # 1. First sight of each batch size (outputs kept for the comparison).
        for i in range(len(batches)):
            before = arena.stats()["arena"]["in_use"] if arena else None
            host, live, res = forward(i, True)
            outputs.append(host)
            rows[i].update(live_first=live, reserved_first=res)
            if arena:
                # How the run was planned (its family's prediction after two
                # shapes), and its high-water mark over its own live peak.
                s = arena.stats()
                rows[i].update(plan_first=s.get("last_plan"),
                               hw_first=s["last_run"]["high_water"],
                               run_live_first=s["last_run"]["peak_in_use"] - before)
        # 2. Every size seen before (served from plans with the arena).
        calls_before = arena.stats()["calls"]["total"] if arena else None
        for i in range(len(batches)):
            _, live, res = forward(i, False)
            rows[i].update(live_seen=live, reserved_seen=res)
        # Sizes seen twice: now planned.
        for i in range(len(batches)):
            _, live, res = forward(i, False)
        calls_planned = None
        if arena:
            before = arena.stats()["calls"]["total"]
            for i in range(len(batches)):
                forward(i, False)
            calls_planned = arena.stats()["calls"]["total"] - before
            rows[0]["planned_runs"] = arena.stats()["arena"]["planned_runs"]
        # 3. Shrink after each batch smaller than the one before it.
        for i in range(len(batches) if not args.light else 0):
            _, live, _ = forward(i, False)
            if i > 0 and batches[i] < batches[i - 1]:
                if arena is None:
                    torch.cuda.empty_cache()
                else:
                    arena.shrink()
                rows[i].update(live_shrunk=live, reserved_shrunk=reserved())
        # ... and the peaks that follow (native: its later peak after
        # empty_cache; the arena: plans drawn again where shrunk).
        for i in range(len(batches) if not args.light else 0):
            _, _, res = forward(i, False)
            rows[i]["reserved_after_shrinks"] = res
        # 4. Time per batch after warm-up: median of `--repeat` runs.
        for i in range(len(batches) if not args.light else 0):
            times = []
            for _ in range(args.repeat):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                forward(i, False, measure=False)
                times.append(time.perf_counter() - t0)
            rows[i]["ms"] = statistics.median(times) * 1e3
    result = {
        "allocator": args.child,
        "torch_memory_allocated": torch.cuda.memory_allocated() if args.child == "mempool" else None,
        "model": args.model,
        "rows": rows,
        "reserved_max": max(r["reserved_first"] for r in rows),
        "live_max": max(r["live_first"] for r in rows),
        "driver_calls_in_planned_pass": calls_planned,
        "calls_before_seen_pass": calls_before,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
    }
    if arena:
        result["arena_stats"] = arena.stats()
    if "options" in plans:
        try:
            plans["saved_bytes"] = arena.save_plans(args.plans, args.model, plans["options"])
        except RuntimeError as e:
            plans["save_error"] = str(e)
            print(f"{args.model}: plan store not saved: {e}", file=sys.stderr)
        result["plans"] = plans
    torch.save(outputs, args.out + ".pt")
    with open(args.out, "w") as f:
        json.dump(result, f)


def run_child(model, allocator, lib, repeat, tmp, plans=None, light=False, tag=""):
    out = os.path.join(tmp, f"{model}-{allocator}{tag}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", allocator,
           "--model", model, "--out", out, "--repeat", str(repeat)]
    print(f"-- {model}: {allocator}{tag}", file=sys.stderr, flush=True)
    if lib:
        cmd += ["--lib", lib]
    if plans:
        cmd += ["--plans", plans]
    if light:
        cmd += ["--light"]
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        raise SystemExit(f"{model} with the {allocator} allocator failed (exit {proc.returncode})")
    with open(out) as f:
        return json.load(f), out + ".pt"


def ratio(a, b):
    return a / b if b else float("nan")


def report(model, native, arena, same):
    print(f"\n== {model} ({native['device']}, torch {native['torch']}) outputs identical: {same}")
    head = ("batch", "live MiB", "native res", "arena res 1st", "arena res seen",
            "native shrunk", "arena shrunk", "native ms", "arena ms", "time ratio")
    print("{:>5} {:>9} {:>11} {:>13} {:>14} {:>13} {:>12} {:>9} {:>9} {:>10}".format(*head))
    for n, a in zip(native["rows"], arena["rows"]):
        def mib(row, key):
            v = row.get(key)
            return f"{v / MIB:.1f}" if v is not None else "-"
        print("{:>5} {:>9} {:>11} {:>13} {:>14} {:>13} {:>12} {:>9.2f} {:>9.2f} {:>10.3f}".format(
            n["batch"], mib(n, "live_first"), mib(n, "reserved_first"), mib(a, "reserved_first"),
            mib(a, "reserved_seen"), mib(n, "reserved_shrunk"), mib(a, "reserved_shrunk"),
            n["ms"], a["ms"], ratio(a["ms"], n["ms"])))
    live = native["live_max"]
    print(f"max reserved / max live: native {ratio(native['reserved_max'], live):.3f}, "
          f"arena first sight {ratio(arena['reserved_max'], live):.3f}, "
          f"arena seen before {ratio(max(r['reserved_seen'] for r in arena['rows']), live):.3f}")
    for n, a in zip(native["rows"], arena["rows"]):
        if "reserved_shrunk" in a:
            print(f"after shrink at batch {a['batch']}: arena {ratio(a['reserved_shrunk'], a['live_shrunk']):.3f}x "
                  f"its need, native empty_cache {ratio(n['reserved_shrunk'], n['live_shrunk']):.3f}x")
    regrow = [r["reserved_after_shrinks"] for r in native["rows"]], [r["reserved_after_shrinks"] for r in arena["rows"]]
    print(f"peak reserved in the pass after shrinking / max live: native {ratio(max(regrow[0]), live):.3f}, "
          f"arena {ratio(max(regrow[1]), live):.3f}")
    print(f"driver calls in a pass of planned runs: {arena['driver_calls_in_planned_pass']}")
    # Plan families: a size never seen, after two, is planned from a fit.
    cells = []
    for a in arena["rows"]:
        if "hw_first" in a:
            cells.append(f"{a['batch']}: {json.dumps(a['plan_first'])} "
                         f"{ratio(a['hw_first'], a['run_live_first']):.3f}")
    print("first sight per run (how planned; the run's high water / its own live peak): " + "; ".join(cells))


def report_mempool(model, native, arena, mempool, same):
    """The MemPool route against install(): the issue's goal is the same
    outputs and the same footprint figures within 2%."""
    live = native["live_max"]

    def seen(r):
        return max(x["reserved_seen"] for x in r["rows"])

    def shrunk(r):
        return [x["reserved_shrunk"] for x in r["rows"] if "reserved_shrunk" in x]

    figures = [
        ("first sight / live", ratio(arena["reserved_max"], live), ratio(mempool["reserved_max"], live)),
        ("seen before / live", ratio(seen(arena), live), ratio(seen(mempool), live)),
    ]
    for a, m, r in zip(shrunk(arena), shrunk(mempool), [x for x in native["rows"] if "live_shrunk" in x]):
        figures.append((f"after shrink at {r['batch']} / need", ratio(a, r["live_shrunk"]), ratio(m, r["live_shrunk"])))
    print(f"\n== {model}: MemPool route (a process that used CUDA first) vs install(); "
          f"outputs identical to native: {same}")
    print("{:>28} {:>10} {:>10} {:>10} {:>6}".format("figure", "install()", "pool()", "pool/inst", "<=2%"))
    worst = 0.0
    for name, a, m in figures:
        r = ratio(m, a)
        worst = max(worst, abs(r - 1.0))
        print("{:>28} {:>10.3f} {:>10.3f} {:>10.3f} {:>6}".format(name, a, m, r, "yes" if abs(r - 1) <= 0.02 else "NO"))
    times = [ratio(m["ms"], n["ms"]) for m, n in zip(mempool["rows"], native["rows"])]
    print("pool() time / native per batch: " + " ".join(f"{t:.3f}" for t in times))
    print(f"pool() driver calls in a pass of planned runs: {mempool['driver_calls_in_planned_pass']}; "
          f"torch.cuda.memory_allocated() at the end (it sees the pools' tensors, the weights): "
          f"{mempool['torch_memory_allocated']}")
    print(f"footprint within 2% of install(): {'yes' if worst <= 0.02 else 'no'} (largest gap {worst:.1%})")


def report_plans(model, first, second, same):
    """Two install() processes, the second loading the plans the first
    saved (--plans-twice): each one's first sight."""
    print(f"\n== {model} ({first['device']}, torch {first['torch']}): the plan store across two "
          f"processes; outputs of the second identical to the first's: {same}")
    print("{:>7} {:>8} {:>8} {:>12} {:>12} {:>12}  {}".format(
        "process", "loaded", "saved", "live MiB", "1st res MiB", "first sight", "how each batch was planned at first sight"))
    for n, r in ((1, first), (2, second)):
        p = r.get("plans", {})
        how = " ".join(f"{x['batch']}:{plan_name(x.get('plan_first'))}" for x in r["rows"])
        print("{:>7} {:>8} {:>8} {:>12.1f} {:>12.1f} {:>12.3f}  {}".format(
            n, p.get("loaded", "-"), p.get("saved_bytes", "-"), r["live_max"] / MIB, r["reserved_max"] / MIB,
            ratio(r["reserved_max"], r["live_max"]), how))
        for k in ("load_error", "save_error"):
            if k in p:
                print(f"  process {n} {k.replace('_', ' ')}: {p[k]}")
    print(f"first sight (max reserved / max live): process 1 {ratio(first['reserved_max'], first['live_max']):.3f}, "
          f"process 2 with the store {ratio(second['reserved_max'], second['live_max']):.3f}")


def plan_name(p):
    """A PlanSource as the stats give it (\"Exact\", {\"Dynamic\": \"NoFamily\"}), short."""
    if isinstance(p, dict):
        k, v = next(iter(p.items()))
        return f"{k}({v})"
    return str(p)


def plans_twice(models, lib, tmp, plans_dir):
    """Per model, two install() processes: the first loads from an empty
    store and saves, the second loads what the first saved."""
    everything, all_same = {}, True
    for model in models:
        d = plans_dir or os.path.join(tmp, "plans")
        os.makedirs(d, exist_ok=True)
        first, pt1 = run_child(model, "arena", lib, 1, tmp, plans=d, light=True, tag="-process1")
        second, pt2 = run_child(model, "arena", lib, 1, tmp, plans=d, light=True, tag="-process2")
        import torch

        a, b = torch.load(pt1), torch.load(pt2)
        same = len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
        all_same &= same
        report_plans(model, first, second, same)
        everything[model] = {"arena_process1": first, "arena_process2": second, "identical": same}
    return everything, all_same


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", help="path to libtensor_arena_cuda.so (default: the installed wheel's)")
    p.add_argument("--models", default="densenet121,resnet50,bert")
    p.add_argument("--repeat", type=int, default=10, help="timed runs per batch")
    p.add_argument("--json", help="write all figures to this file")
    p.add_argument("--routes", default="install,mempool",
                   help="which tensor-arena routes to compare with native: install, mempool or both")
    p.add_argument("--plans", metavar="DIR",
                   help="install() route: load the model's plans from the plan store in DIR before the "
                        "first batch, save them there after the last")
    p.add_argument("--plans-twice", action="store_true",
                   help="instead of the comparison: per model, two install() processes, the second "
                        "loading the plans the first saved (to --plans DIR, default a fresh temporary "
                        "directory); reports each one's first sight (no native process, no timing)")
    p.add_argument("--light", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child", choices=["native", "arena", "mempool"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if not args.lib:
        try:
            import tensor_arena_cuda

            args.lib = tensor_arena_cuda.library_path()
        except (ImportError, FileNotFoundError) as e:
            print(f"no library: install the wheel or pass --lib ({e})", file=sys.stderr)
            return 2
    if not os.path.exists(args.lib):
        print("--lib must name the built libtensor_arena_cuda.so "
              "(cargo build --release -p tensor-arena-cuda)", file=sys.stderr)
        return 2
    routes = [r for r in args.routes.split(",") if r]
    if not routes or any(r not in ("install", "mempool") for r in routes):
        print("--routes: install, mempool or install,mempool", file=sys.stderr)
        return 2
    try:
        import torch
        import torchvision  # noqa: F401
        if "bert" in args.models.split(","):
            import transformers  # noqa: F401
    except ImportError as e:
        print(f"PyTorch, torchvision and transformers (for bert) are needed: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print("--repeat must be at least 1", file=sys.stderr)
        return 2
    models = [m for m in args.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad:
        print(f"unknown models {bad}; known: {list(MODELS)}", file=sys.stderr)
        return 2
    lib = os.path.abspath(args.lib)
    plans_dir = os.path.abspath(args.plans) if args.plans else None
    if plans_dir:
        os.makedirs(plans_dir, exist_ok=True)  # a missing directory is refused by the load
    everything = {}
    all_same = True
    with tempfile.TemporaryDirectory() as tmp:
        if args.plans_twice:
            everything, all_same = plans_twice(models, lib, tmp, plans_dir)
            models = []
        for model in models:
            native, native_pt = run_child(model, "native", None, args.repeat, tmp)
            a = torch.load(native_pt)
            everything[model] = {"native": native}
            results = {}
            for route, child_name in (("install", "arena"), ("mempool", "mempool")):
                if route not in routes:
                    continue
                figures, pt = run_child(model, child_name, lib, args.repeat, tmp,
                                        plans=plans_dir if route == "install" else None)
                b = torch.load(pt)
                same = len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
                if not same:
                    diffs = [float((x - y).abs().max()) for x, y in zip(a, b)]
                    print(f"{model} ({route}): outputs differ, max abs difference per batch {diffs}")
                all_same &= same
                results[route] = (figures, same)
                everything[model][child_name] = figures
                everything[model][f"identical_{route}"] = same
            if "install" in results:
                report(model, native, results["install"][0], results["install"][1])
                p = results["install"][0].get("plans")
                if p:
                    print(f"plan store ({plans_dir}): loaded {p.get('loaded')} plans before the first batch, "
                          f"saved {p.get('saved_bytes', '-')} bytes after the last"
                          + "".join(f"; {k}: {p[k]}" for k in ("load_error", "save_error") if k in p))
            if "mempool" in results:
                if "install" in results:
                    report_mempool(model, native, results["install"][0], *results["mempool"])
                else:
                    report(model, native, *results["mempool"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
