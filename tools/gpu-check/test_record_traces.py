#!/usr/bin/env python3
"""Tests of record_traces.py's conversion from a snapshot's trace entries to
a trace v1 file, on hand-made snapshots (no torch, no GPU), and of its
"not run" path without a GPU.

    python3 tools/gpu-check/test_record_traces.py [TRACE_OUT]

(plain unittest; `python3 -m pytest tools/gpu-check/test_record_traces.py`
runs it too). With TRACE_OUT, the trace of the hand-made snapshot is
written there, for `crates/cuda/tests/gpu_tools.rs` to parse with the
crate's trace parser.
"""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import record_traces as rt  # noqa: E402


def snapshot():
    """A run as `_snapshot()["device_traces"][0]` would hold it: the input's
    copy, two activations, a workspace that outlives the run (cuBLAS's), a
    free of a block made before the run, a free requested and not completed,
    and allocator events that are not allocations."""
    E = lambda action, addr, size=0, stream=0: dict(action=action, addr=addr, size=size, stream=stream, frames=[])
    return [
        E("segment_alloc", 0x1000, 2 << 20),
        E("alloc", 0x1000, 600),          # id 0: the input's copy
        E("alloc", 0x1400, 1000),         # id 1
        E("free_requested", 0x1000, 600),
        E("free_completed", 0x1000, 600),  # free 0
        E("alloc", 0x1000, 512),          # id 2: the same address, reused
        E("alloc", 0x9000, 4096),         # id 3: a workspace kept by the process
        E("free_completed", 0x7000, 100),  # a block of before the run
        E("free_requested", 0x1400, 1000),
        E("free_completed", 0x1400, 1000),  # free 1
        E("alloc", 0x1400, 0),            # a zero-byte alloc: left out
        E("alloc", 0x2000, 300),          # id 4: freed, not completed
        E("free_requested", 0x2000, 300),
        E("snapshot", 0),
        E("free_completed", 0x1000, 512),  # free 2
    ]


class Conversion(unittest.TestCase):
    def test_events_follow_the_rules(self):
        r = rt.run_events(snapshot())
        self.assertEqual(r["allocs"], 5)
        self.assertEqual(r["events"], [
            ("alloc", 0, 600), ("alloc", 1, 1000), ("free", 0), ("alloc", 2, 512),
            ("alloc", 3, 4096), ("free", 1), ("alloc", 4, 300), ("free", 2),
            ("free", 3), ("free", 4)])
        self.assertEqual(r["alive_at_end"], [(3, 4096, False), (4, 300, True)])
        self.assertEqual(r["earlier_frees"], 1)
        self.assertEqual(r["zero_size"], 1)
        self.assertEqual(r["segment_allocs"], 1)
        self.assertEqual(r["peak"], 1000 + 512 + 4096)  # before 1 dies
        self.assertEqual(r["streams"], 1)
        # Every alloc freed exactly once.
        allocs = [e[1] for e in r["events"] if e[0] == "alloc"]
        frees = [e[1] for e in r["events"] if e[0] == "free"]
        self.assertEqual(sorted(allocs), sorted(frees))
        self.assertEqual(allocs, list(range(len(allocs))))

    def test_text_restarts_ids_and_says_what_it_did(self):
        a = rt.run_events(snapshot())
        b = rt.run_events([dict(action="alloc", addr=0x5000, size=64, stream=7),
                           dict(action="alloc", addr=0x6000, size=64, stream=8),
                           dict(action="free_completed", addr=0x5000, size=64),
                           dict(action="free_completed", addr=0x6000, size=64)])
        text = rt.trace_text("torch-x", [("16x3x224x224", a), ("1x3x224x224", b)], ["source: a test"])
        lines = text.splitlines()
        self.assertEqual(lines[0], "# trace v1 model=torch-x input=16x3x224x224,1x3x224x224")
        self.assertEqual(lines[1], "# source: a test")
        self.assertIn("2 blocks alive at the run's end, 4396 bytes (ids 3,4; 1 of them with a free "
                      "requested, not completed), freed at the run's end here", lines[2])
        self.assertIn("1 frees of blocks made before the run, left out", lines[2])
        self.assertIn("1 zero-byte allocs, left out", lines[2])
        self.assertIn("allocations on 2 streams", lines[3])
        body = [ln for ln in lines if not ln.startswith("#")]
        self.assertEqual(body[0], "run 16x3x224x224")
        second = body.index("run 1x3x224x224")
        self.assertEqual(body[second + 1:], ["alloc 0 64", "alloc 1 64", "free 0", "free 1"])
        check_v1(self, text)

    def test_impossible_entries_are_refused(self):
        with self.assertRaises(ValueError):
            rt.run_events([dict(action="alloc", addr=16, size=8), dict(action="alloc", addr=16, size=8)])
        with self.assertRaises(ValueError):
            rt.run_events([dict(action="alloc", addr=-1, size=8)])
        with self.assertRaises(ValueError):
            rt.run_events([dict(action="alloc", addr=16, size="8")])

    def test_labels(self):
        self.assertEqual(rt.label_of("bert", 512, 8), "8x512")
        self.assertEqual(rt.label_of("densenet121", 16, 8), "16x3x224x224")


class NoGpu(unittest.TestCase):
    def test_not_run_without_a_gpu(self):
        """Without torch, or with the stand-in (tools/gpu-check/fake): says
        so and exits 0, or 1 with --require-gpu; writes nothing."""
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "fake"), PYTHONDONTWRITEBYTECODE="1")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "traces")
            for extra, code in (([], 0), (["--require-gpu"], 1)):
                p = subprocess.run([sys.executable, os.path.join(HERE, "record_traces.py"), out] + extra,
                                   env=env, capture_output=True, text=True)
                self.assertEqual(p.returncode, code, p.stdout + p.stderr)
                self.assertIn("record_traces: not run: no GPU", p.stdout)
            self.assertFalse(os.path.exists(out))


# A stand-in for torch with an allocation history (only what
# record_traces.py's child calls): every device tensor of `n` units is an
# alloc of n * 512 bytes at a fresh address, logged with its free while
# _record_memory_history is on; the first forward makes a workspace that
# lives for the process (as cuBLAS's does). Not PyTorch.
MOCK_TORCH = """
import contextlib
__version__ = "mock"
class version: cuda = "0.0"
class _B: pass
backends = _B(); backends.cudnn = _B()
_hist, _state = [None], dict(addr=0x100000, in_use=0, peak=0)
def manual_seed(s): pass
def device(d): return d
class Generator:
    def manual_seed(self, s): return self
def _log(action, addr, size):
    if _hist[0] is not None:
        _hist[0].append(dict(action=action, addr=addr, size=size, stream=0, frames=[]))
class Tensor:
    def __init__(self, n, dev=False):
        self.n, self.addr = n, None
        if dev:
            self.addr = _state["addr"]; _state["addr"] += n * 512 + 4096
            _state["in_use"] += n * 512; _state["peak"] = max(_state["peak"], _state["in_use"])
            _log("alloc", self.addr, n * 512)
    def to(self, d): return Tensor(self.n, True)
    def cpu(self): return Tensor(self.n)
    def __del__(self):
        if self.addr is not None:
            _state["in_use"] -= self.n * 512
            _log("free_requested", self.addr, self.n * 512)
            _log("free_completed", self.addr, self.n * 512)
def randn(b, *shape, generator=None): return Tensor(b)
def randint(lo, hi, shape, generator=None): return Tensor(shape[0] * shape[1] // 64)
@contextlib.contextmanager
def no_grad(): yield
class _Memory:
    @staticmethod
    def _record_memory_history(enabled="all", context=None, stacks="all", max_entries=0, clear_history=False):
        if enabled is None: _hist[0] = None
        elif clear_history or _hist[0] is None: _hist[0] = []
    @staticmethod
    def _snapshot():
        return {"segments": [], "device_traces": [list(_hist[0] or [])]}
class cuda:
    memory = _Memory
    is_available = staticmethod(lambda: True)
    current_device = staticmethod(lambda: 0)
    get_device_name = staticmethod(lambda: "mock")
    synchronize = staticmethod(lambda: None)
    memory_allocated = staticmethod(lambda: _state["in_use"])
    max_memory_allocated = staticmethod(lambda: _state["peak"])
    max_memory_reserved = staticmethod(lambda: _state["peak"] + (1 << 20))
    @staticmethod
    def reset_peak_memory_stats(): _state["peak"] = _state["in_use"]
"""
MOCK_MODEL = """
import torch
_kept = []
class _Model:
    def to(self, d):
        self.w = torch.Tensor(40, True); return self
    def eval(self): return self
    def __call__(self, x):
        if not _kept: _kept.append(torch.Tensor(8, True))  # the workspace
        a = torch.Tensor(x.n * 3, True); b = torch.Tensor(x.n * 2, True)
        del a
        c = torch.Tensor(x.n * 4, True)
        del b, c
        return torch.Tensor(x.n, True)
class models:
    densenet121 = staticmethod(lambda weights=None: _Model())
    resnet50 = staticmethod(lambda weights=None: _Model())
class BertConfig: pass
class _Out:
    def __init__(self, t): self.last_hidden_state = t
class BertModel(_Model):
    def __init__(self, config): pass
    def __call__(self, input_ids): return _Out(_Model.__call__(self, input_ids))
"""


class ChildFlow(unittest.TestCase):
    def test_files_from_a_stand_in_with_a_history(self):
        """The whole child flow against a stand-in torch that keeps an
        allocation history: the files, their names, headers and rules."""
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in (("torch", MOCK_TORCH), ("torchvision", MOCK_MODEL), ("transformers", MOCK_MODEL)):
                os.makedirs(os.path.join(tmp, name))
                with open(os.path.join(tmp, name, "__init__.py"), "w") as f:
                    f.write(text)
            out = os.path.join(tmp, "traces")
            env = dict(os.environ, PYTHONPATH=tmp, PYTHONDONTWRITEBYTECODE="1",
                       GPU_CHECK_BATCHES="densenet121=16,1,4,1")
            p = subprocess.run([sys.executable, os.path.join(HERE, "record_traces.py"), out],
                               env=env, capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            names = sorted(os.listdir(out))
            self.assertEqual(names, sorted([
                "summary.json", "densenet121-mixed.trace", "densenet121-1x3x224x224.trace",
                "densenet121-4x3x224x224.trace", "densenet121-16x3x224x224.trace",
                "resnet50-mixed.trace", "resnet50-8x3x224x224.trace", "resnet50-32x3x224x224.trace",
                "resnet50-64x3x224x224.trace", "bert-mixed.trace", "bert-8x64.trace",
                "bert-8x128.trace", "bert-8x512.trace"]))
            for n in names:
                if n.endswith(".trace"):
                    with open(os.path.join(out, n)) as f:
                        check_v1(self, f.read())
            with open(os.path.join(out, "densenet121-mixed.trace")) as f:
                mixed = f.read()
            self.assertTrue(mixed.startswith(
                "# trace v1 model=torch-densenet121 input=16x3x224x224,1x3x224x224,4x3x224x224,1x3x224x224\n"))
            # The workspace: alive at the first run's end only, freed there.
            self.assertIn("# run 1 (16x3x224x224): 6 allocs", mixed)
            self.assertIn("1 blocks alive at the run's end, 4096 bytes", mixed)
            self.assertEqual(mixed.count("alive at the run's end"), 1)
            self.assertIn("not traced: the weights (20480 bytes", mixed)
            with open(os.path.join(out, "bert-8x512.trace")) as f:
                self.assertIn("run 8x512\nalloc 0 32768\n", f.read())
            import json
            with open(os.path.join(out, "summary.json")) as f:
                summary = json.load(f)
            runs = summary["densenet121"]["runs"]
            self.assertEqual([r["file"] for r in runs], ["mixed"] * 4 + ["single"] * 3)
            self.assertEqual(runs[0]["alive_at_end"], 1)
            # The trace's peak is PyTorch's over the run's start (the stand-in's
            # blocks are not rounded).
            self.assertTrue(all(r["peak"] == r["torch_run_peak"] for r in runs), runs)
            self.assertIn("densenet121  single", p.stdout)


def check_v1(test, text):
    """The format's rules (traces/README.md), checked independently."""
    lines = text.splitlines()
    test.assertTrue(lines[0].startswith("# trace v1 model="))
    labels = lines[0].split(" input=")[1].split(",")
    runs, live, seen = [], None, None
    for ln in lines[1:]:
        if ln.startswith("#") or not ln:
            continue
        f = ln.split(" ")
        if f[0] == "run":
            test.assertFalse(live, "every alloc freed before the next run")
            runs.append(f[1])
            live, seen = set(), set()
        elif f[0] == "alloc":
            i = int(f[1])
            test.assertNotIn(i, seen)
            test.assertGreater(int(f[2]), 0)
            live.add(i)
            seen.add(i)
        else:
            test.assertEqual(f[0], "free")
            test.assertIn(int(f[1]), live)
            live.remove(int(f[1]))
    test.assertFalse(live)
    test.assertEqual(runs, labels)


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        with open(sys.argv.pop(1), "w") as f:
            r = rt.run_events(snapshot())
            f.write(rt.trace_text("torch-test", [("16x3x224x224", r), ("1x3x224x224", r)],
                                  ["source: test_record_traces.py's hand-made snapshot"]))
    unittest.main(verbosity=2)
