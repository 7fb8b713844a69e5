"""The process's default memory limit from Python (memory_limit,
set_memory_limit; crates/ort's limit.rs) and out_of_memory, which finds an
OutOfMemory a library wrapped (rapidocr re-raises every run error as its own
ONNXRuntimeError `from` ours). The limit is read once per process, so each
case runs in a child."""

import os
import subprocess
import sys
import textwrap

import pytest

import tensor_arena.onnxruntime as ta


def child(code: str, **env) -> str:
    e = {k: v for k, v in os.environ.items() if k != "TENSOR_ARENA_MEMORY_LIMIT"}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_memory_limit_from_the_environment():
    out = child("import tensor_arena.onnxruntime as ta; print(ta.memory_limit())",
                TENSOR_ARENA_MEMORY_LIMIT="512M")
    assert out == "{'bytes': 536870912, 'source': 'environment', 'file': None}", out
    assert child("import tensor_arena.onnxruntime as ta; print(ta.memory_limit())",
                 TENSOR_ARENA_MEMORY_LIMIT="off") == "None"


def test_memory_limit_default_is_the_cgroup_or_memtotal():
    out = child("import tensor_arena.onnxruntime as ta; d = ta.memory_limit(); print(d['source'], d['bytes'] > 0)")
    assert out in ("cgroup True", "memtotal True"), out


def test_bad_environment_value_is_invalid_argument():
    out = child("""
        import tensor_arena.onnxruntime as ta
        try:
            ta.memory_limit()
        except ta.InvalidArgument as e:
            print("InvalidArgument", e)
        """, TENSOR_ARENA_MEMORY_LIMIT="lots")
    assert out.startswith("InvalidArgument") and "TENSOR_ARENA_MEMORY_LIMIT" in out, out


def test_set_memory_limit_before_the_first_run_and_not_after(assets):
    out = child(f"""
        import numpy as np
        import tensor_arena.onnxruntime as ta
        try:
            ta.set_memory_limit(0)
        except ta.InvalidArgument:
            print("zero refused")
        ta.set_memory_limit(256 << 20)
        print(ta.memory_limit())
        s = ta.InferenceSession({str(assets / "ppocr_cls.onnx")!r})
        s.run(None, {{"x": np.zeros((1, 3, 48, 192), np.float32)}})
        try:
            ta.set_memory_limit(None)
        except ta.InvalidArgument:
            print("in force")
        print(ta.memory_limit()["bytes"])
        """)
    assert out.splitlines() == [
        "zero refused",
        "{'bytes': 268435456, 'source': 'set_memory_limit', 'file': None}",
        "in force",
        "268435456",
    ], out


def test_a_reservation_for_a_run_is_taken_over_by_the_threads_run(assets):
    out = child(f"""
        import threading
        import numpy as np
        import tensor_arena.onnxruntime as ta
        s = ta.InferenceSession({str(assets / "ppocr_cls.onnx")!r})
        x = {{"x": np.zeros((1, 3, 48, 192), np.float32)}}
        s.run(None, x)   # the first run of the model (alone)
        s.run(None, x)   # a run beside others: its need is the largest
        with ta.reserve(1 << 20, for_run=True) as r:
            print("holds the run's room too:", r.nbytes > 1 << 20, r.held)
            other = []
            t = threading.Thread(target=lambda: other.append(s.run(None, x)))
            t.start(); t.join()
            print("another thread's run left it:", r.held)
            s.run(None, x)
            print("this thread's run took it:", r.held, ta.stats()["admitted_current"])
        with ta.reserve(1 << 20) as plain:
            s.run(None, x)
            print("a plain one is kept:", plain.held, plain.nbytes == 1 << 20)
        print("after:", ta.stats()["admitted_current"])
        """, TENSOR_ARENA_MEMORY_LIMIT="256M", TENSOR_ARENA_LEDGER_DIR="off")
    assert out.splitlines() == [
        "holds the run's room too: True True",
        "another thread's run left it: True",
        "this thread's run took it: False 0",
        "a plain one is kept: True True",
        "after: 0",
    ], out


class Wrapped(Exception):
    pass


def test_out_of_memory_finds_the_cause():
    oom = ta.OutOfMemory("refused")
    try:
        try:
            raise oom
        except Exception as e:
            raise Wrapped("a library's error") from e
    except Wrapped as w:
        assert ta.out_of_memory(w) is oom
    assert ta.out_of_memory(oom) is oom
    assert ta.out_of_memory(ValueError("x")) is None
    # Implicit chaining (raised while handling) counts too.
    try:
        try:
            raise oom
        except Exception:
            raise Wrapped("during handling")
    except Wrapped as w:
        assert ta.out_of_memory(w) is oom
    assert issubclass(ta.OutOfMemory, ta.Error)


def test_limit_values_are_parsed_alike_and_checked_against_the_machine():
    # The same text as TENSOR_ARENA_MEMORY_LIMIT takes; each bad value says
    # what is wrong with it; a limit over the machine's memory is refused.
    out = child("""
        import tensor_arena.onnxruntime as ta
        for v in [0, -1, "0", "-1", "lots", "1024T", 1 << 60, True, 1.5]:
            try:
                ta.set_memory_limit(v)
                print(repr(v), "taken")
            except ta.InvalidArgument as e:
                print(repr(v), "InvalidArgument:", e)
        ta.set_memory_limit("1G")
        print(ta.memory_limit())
        ta.set_memory_limit("off")
        print(ta.memory_limit())
        ta.set_memory_limit(512 << 20)
        print(ta.memory_limit()["bytes"])
        """)
    lines = out.splitlines()
    assert all("InvalidArgument" in l for l in lines[:9]), out
    assert "0 bytes" in lines[0] and "negative" in lines[1], out
    assert "machine's memory" in lines[5] and "machine's memory" in lines[6], out
    assert lines[9] == "{'bytes': 1073741824, 'source': 'set_memory_limit', 'file': None}", out
    assert lines[10:] == ["None", "536870912"], out


def test_reserve_waits_its_turn_under_the_limit_and_refuses_what_never_fits():
    out = child("""
        import threading, time
        import tensor_arena.onnxruntime as ta
        first = ta.reserve(40 << 20)
        print(first.nbytes, first.held)
        got = []
        t = threading.Thread(target=lambda: got.append(ta.reserve(40 << 20)))
        t.start()
        time.sleep(0.3)
        print("second before release:", len(got))
        first.release()
        t.join(10)
        print("second after release:", len(got), ta.stats()["admitted_current"] >> 20)
        got[0].release()
        with ta.reserve(10 << 20) as r:
            print("inside:", r.held, ta.stats()["admitted_current"] >> 20)
        print("after:", r.held, ta.stats()["admitted_current"])
        for bad in (65 << 20, -1, True, "1G"):
            try:
                ta.reserve(bad)
            except ta.OutOfMemory as e:
                print("OutOfMemory", "68157440" in str(e))
            except ta.InvalidArgument:
                print("InvalidArgument")
        """, TENSOR_ARENA_MEMORY_LIMIT="64M", TENSOR_ARENA_LEDGER_DIR="off")
    assert out.splitlines() == [
        "41943040 True",
        "second before release: 0",
        "second after release: 1 40",
        "inside: True 10",
        "after: False 0",
        "OutOfMemory True",
        "InvalidArgument",
        "InvalidArgument",
        "InvalidArgument",
    ], out
