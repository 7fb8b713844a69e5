#!/usr/bin/env python3
"""On a GPU: outputs through tensor-arena identical to native, for the two
routes that join a process already running.

1. PyTorch's MemPool route (``tensor_arena_cuda.pool``): a process uses
   CUDA with PyTorch's own allocator first; then a model (torchvision's
   ResNet-18 with random weights, or a small convolutional net without
   torchvision) runs natively and inside keyed ``pool()`` scopes, batch by
   batch; the outputs must be bitwise equal, the scopes' allocations must
   reach the arena (and nothing outside them), the third sight of a key
   must be planned with no driver call, and the stats must read through
   PyTorch's names.
2. ONNX Runtime's CUDA execution provider with the external allocator
   (``gpu_external_alloc`` / ``_free`` / ``_empty_cache`` pointing at the
   library): a session with ONNX Runtime's own arena and one with
   tensor-arena's, same model, same inputs, runs keyed by the input shape;
   outputs must be equal, the session's initializers and activations must
   come from the arena, planned runs must make no driver call. Needs
   ``onnxruntime-gpu`` and a model with a free batch dimension (``--onnx``,
   e.g. ``densenet121_batch.onnx`` from ``tools/fetch-ort-assets.sh``);
   ``cudnn_conv_algo_search`` is ``DEFAULT`` in both sessions so that both
   pick the same convolution algorithms.

Each part runs in its own process and prints ``ok: ...`` / ``FAIL: ...``
lines, then ``<part>: identical`` or ``<part>: not run: <why>`` (no GPU, no
torch, no onnxruntime-gpu, no model). Without a GPU every part says it did
not run and the exit status is 0, as ``crates/cuda/tests/real_driver.rs``
does; ``TENSOR_ARENA_REQUIRE_TORCH_GPU=1`` makes a part that cannot run a
failure (for the GPU machine, where it must run).

Usage: python3 tools/gpu-check/identical_check.py [--lib LIB] [--onnx MODEL] [--parts mempool,ort]
Exit status: 0 when every part that ran matched (and, with the variable
set, every part ran), 1 otherwise, 2 for bad usage.
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
try:  # the installed wheel, if there is one
    import tensor_arena_cuda  # noqa: F401
except ImportError:  # the source tree (then --lib names the library)
    sys.path.insert(0, os.path.join(ROOT, "crates", "cuda", "python"))

REQUIRE = os.environ.get("TENSOR_ARENA_REQUIRE_TORCH_GPU") == "1"
FAILED = []


def check(what, ok, detail=""):
    print(f"{'ok' if ok else 'FAIL'}: {what} {detail}".rstrip(), flush=True)
    if not ok:
        FAILED.append(what)


def not_run(part, why):
    print(f"{part}: not run: {why}", flush=True)
    sys.exit(1 if REQUIRE else 0)


def mempool_part(lib):
    try:
        import torch
    except ImportError as e:
        not_run("mempool", f"no torch ({e})")
    if torch.__version__ == "fake":
        not_run("mempool", "the stand-in torch (tools/gpu-check/fake) runs no model")
    if not torch.cuda.is_available():
        not_run("mempool", "no CUDA device visible to PyTorch")
    if not hasattr(torch.cuda, "MemPool"):
        not_run("mempool", f"torch {torch.__version__} has no torch.cuda.MemPool (2.5+)")
    import tensor_arena_cuda

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    dev = torch.device("cuda")
    # PyTorch's own allocator first (cuBLAS's workspace is made here).
    a = torch.ones(256, 256, device=dev)
    check("CUDA used natively first", float((a @ a)[0, 0]) == 256.0
          and float(torch.addmm(torch.ones(256, device=dev), a, a)[0, 0]) == 257.0)
    del a
    try:
        import torchvision

        model = torchvision.models.resnet18(weights=None)
        name = "resnet18"
    except ImportError:
        nn = torch.nn
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2),
            nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
        name = "small convnet"
    model = model.to(dev).eval()
    arena = tensor_arena_cuda.Arena(lib)
    native_before = torch.cuda.memory_allocated()
    batches = [8, 1, 8, 8, 1, 8]
    same = True
    with torch.inference_mode():
        for i, b in enumerate(batches):
            x = torch.randn(b, 3, 224, 224, generator=torch.Generator().manual_seed(i))
            want = model(x.to(dev)).cpu()
            calls = arena.stats(0)["calls"]["total"]
            with arena.pool((name, b), device=0):
                got = model(x.to(dev)).cpu()
                torch.cuda.synchronize()
            s = arena.stats(0)
            eq = torch.equal(want, got)
            same &= eq
            check(f"{name} batch {b}: pool() output equal to native", eq)
            check(f"batch {b}: the scope's segments came from the arena",
                  s["last_run"]["peak_in_use"] > 0, f"(peak {s['last_run']['peak_in_use']} B)")
            check(f"batch {b}: everything came back when the scope ended", s["arena"]["in_use"] == 0,
                  f"(in use {s['arena']['in_use']} B)")
            if i == 3:
                check("third sight of batch 8: planned, no driver call",
                      s["last_run"]["planned"] and s["calls"]["total"] == calls,
                      f"(planned {s['last_run']['planned']}, calls {s['calls']['total'] - calls})")
    s = arena.stats(0)
    outside = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    after = arena.stats(0)
    check("an allocation outside the scopes stays with PyTorch",
          after["arena"]["allocs"] == s["arena"]["allocs"]
          and torch.cuda.memory_allocated() >= native_before + (64 << 20),
          f"(arena allocations {s['arena']['allocs']} -> {after['arena']['allocs']})")
    del outside
    m = arena.memory_stats(0)
    check("stats through PyTorch's names", m["reserved_bytes.all.current"] == arena.stats(0)["mapped"]
          and m["allocated_bytes.all.peak"] > 0 and m["num_device_alloc"] > 0, str(m))
    before = arena.stats(0)
    released = arena.shrink(0)
    after = arena.stats(0)
    need = after["arena"]["watermark"] + after["arena"]["in_use"]
    check("shrink after the scopes: releases what it says, down to the need",
          released == before["mapped"] - after["mapped"] and after["mapped"] <= need + (2 << 20),
          f"(released {released} B, mapped {before['mapped']} -> {after['mapped']} B, need {need} B)")
    if FAILED:
        print(f"mempool: FAILED ({len(FAILED)})")
        sys.exit(1)
    print("mempool: identical" if same else "mempool: outputs differ")
    sys.exit(0 if same else 1)


def ort_part(lib, model):
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as e:
        not_run("ort", f"no onnxruntime ({e}): pip install onnxruntime-gpu")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        not_run("ort", f"onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                f"({ort.get_available_providers()}): onnxruntime-gpu is needed")
    if not model or not os.path.exists(model):
        not_run("ort", f"no ONNX model (--onnx; got {model!r})")
    import tensor_arena_cuda

    arena = tensor_arena_cuda.Arena(lib)
    cdll = arena.lib
    base = {"device_id": "0", "cudnn_conv_algo_search": "DEFAULT"}
    ours = arena.ort_cuda_provider_options(0, cudnn_conv_algo_search="DEFAULT")
    native = ort.InferenceSession(model, providers=[("CUDAExecutionProvider", base)])
    before = arena.stats(0)["arena"]["in_use"]
    sess = ort.InferenceSession(model, providers=[("CUDAExecutionProvider", ours)])
    check("the arena's session runs on CUDA", sess.get_providers()[0] == "CUDAExecutionProvider",
          str(sess.get_providers()))
    weights = arena.stats(0)["arena"]["in_use"] - before
    check("the session's initializers came from the arena", weights > 0, f"({weights} B)")
    inp = sess.get_inputs()[0]
    batches = [16, 1, 4, 1, 8, 16]
    rng = np.random.default_rng(0)
    xs = []
    for b in batches:
        shape = [b if not isinstance(d, int) or d < 0 else d for d in inp.shape]
        shape[0] = b
        xs.append(rng.standard_normal(shape, dtype=np.float32))
    same = True
    rows = []
    for p in range(3):
        for b, x in zip(batches, xs):
            want = native.run(None, {inp.name: x})
            calls = arena.stats(0)["calls"]["total"]
            with arena.run(("onnx", tuple(x.shape)), device=0):
                got = sess.run(None, {inp.name: x})
            s = arena.stats(0)
            eq = len(want) == len(got) and all(np.array_equal(w, g) for w, g in zip(want, got))
            same &= eq
            if p == 0:
                check(f"batch {b}: output equal to ONNX Runtime's own arena", eq)
                rows.append((b, s["last_run"]["peak_in_use"] + weights, s["last_run_peak_mapped"]))
            if p == 2:
                check(f"batch {b}, third pass: planned, no driver call",
                      s["last_run"]["planned"] and s["calls"]["total"] == calls,
                      f"(calls {s['calls']['total'] - calls})")
    for b, live, mapped in rows:
        print(f"batch {b}: arena mapped / live at first sight {mapped / live:.3f} ({mapped >> 20} / {live >> 20} MiB)")
    cdll.tensor_arena_cuda_ort_empty_cache()
    s = arena.stats(0)
    print(f"after empty_cache: mapped {s['mapped'] >> 20} MiB, watermark + initializers "
          f"{(s['arena']['watermark'] + s['arena']['in_use']) >> 20} MiB")
    if FAILED:
        print(f"ort: FAILED ({len(FAILED)})")
        sys.exit(1)
    print("ort: identical" if same else "ort: outputs differ")
    sys.exit(0 if same else 1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", help="libtensor_arena_cuda.so (default: the installed wheel's)")
    p.add_argument("--onnx", help="ONNX model with a free batch dimension, for the ort part")
    p.add_argument("--parts", default="mempool,ort")
    p.add_argument("--child", choices=["mempool", "ort"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.lib is None:
        try:
            import tensor_arena_cuda

            args.lib = tensor_arena_cuda.library_path()
        except (ImportError, FileNotFoundError) as e:
            print(f"no library: install the wheel or pass --lib ({e})", file=sys.stderr)
            return 2
    if args.child == "mempool":
        return mempool_part(args.lib)
    if args.child == "ort":
        return ort_part(args.lib, args.onnx)
    parts = [x for x in args.parts.split(",") if x]
    if not parts or any(x not in ("mempool", "ort") for x in parts):
        print("--parts: mempool, ort or both", file=sys.stderr)
        return 2
    status = 0
    for part in parts:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", part, "--lib", args.lib]
        if args.onnx:
            cmd += ["--onnx", args.onnx]
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            print(f"{part}: exit status {rc}")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
