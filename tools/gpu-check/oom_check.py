#!/usr/bin/env python3
"""Out of device memory through PyTorch, with tensor-arena as its allocator.

Allocates 8 GiB tensors (each filled) until the device refuses one, then
checks that the process goes on as with PyTorch's native allocator: the
refusal is a Python exception (not a crash, not a poisoned CUDA context),
the tensors held keep their bytes, one freed makes room for another, a
single request past the device's memory is refused too, and a kernel runs
afterwards. Each allocator runs in its own child process.

Usage (on a machine with an NVIDIA GPU and PyTorch):

    cargo build --release -p tensor-arena-cuda
    python3 tools/gpu-check/oom_check.py --lib target/release/libtensor_arena_cuda.so

Exit status: 0 when both allocators behaved, 1 otherwise, 2 for bad usage.
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "crates", "cuda", "python"))
GIB = 1 << 30


def child(allocator, lib):
    """Prints one line per check, `ok` or `FAIL`, then `done`."""
    arena = None
    if allocator == "arena":
        import tensor_arena_cuda

        arena = tensor_arena_cuda.install(lib)
    import torch

    def check(what, ok, detail=""):
        print(f"{'ok' if ok else 'FAIL'}: {what} {detail}".rstrip(), flush=True)

    held = []
    refusal = None
    try:
        for _ in range(1000):
            t = torch.empty(8 * GIB, dtype=torch.uint8, device="cuda")
            t.fill_(len(held) % 251)
            held.append(t)
    except Exception as e:  # what PyTorch raises for a refused allocation
        refusal = e
    torch.cuda.synchronize()
    check("a refused allocation is an exception",
          refusal is not None and len(held) > 0,
          f"after {len(held) * 8} GiB: {type(refusal).__name__}: {str(refusal)[:160]!r}")
    check("no tensor at address 0", all(t.data_ptr() != 0 for t in held))
    check("the tensors held keep their bytes",
          all(int(t[:: 1 << 26].min()) == i % 251 == int(t[:: 1 << 26].max())
              for i, t in enumerate(held)))
    held.pop()
    x = torch.empty(4 * GIB, dtype=torch.uint8, device="cuda")
    x.fill_(3)
    torch.cuda.synchronize()
    check("after one is freed, 4 GiB fit", int(x[:2].sum()) == 6)
    try:
        torch.empty(1 << 48, dtype=torch.uint8, device="cuda")
        check("a request past the device is refused", False)
    except Exception as e:
        check("a request past the device is refused", True, type(e).__name__)
    check("a kernel runs afterwards",
          torch.ones(1000, device="cuda").sum().item() == 1000.0)
    del held, x
    if arena is not None:
        print(f"arena: out_of_memory {arena.stats()['out_of_memory']}, "
              f"last error {arena.last_error()!r}", flush=True)
    print("done", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", help="path to libtensor_arena_cuda.so")
    p.add_argument("--child", choices=["native", "arena"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.lib)
    if not args.lib or not os.path.exists(args.lib):
        print("--lib must name the built libtensor_arena_cuda.so", file=sys.stderr)
        return 2
    good = True
    for allocator in ["native", "arena"]:
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", allocator,
             "--lib", os.path.abspath(args.lib)],
            capture_output=True, text=True, timeout=600)
        print(f"== {allocator} (exit {proc.returncode})")
        print(proc.stdout, end="")
        behaved = (proc.returncode == 0 and "FAIL" not in proc.stdout
                   and proc.stdout.rstrip().endswith("done"))
        if not behaved:
            print(proc.stderr[-2000:], end="")
            good = False
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
