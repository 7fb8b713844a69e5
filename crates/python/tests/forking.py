"""Run by test_fork.py in a fresh interpreter (a fork of the pytest process
would copy pytest's own state): sessions are made, run, and the process
forks, as gunicorn --preload and multiprocessing with fork do.

    python forking.py decay MODEL_DIR     # children return to the sessions' RSS
    python forking.py storm MODEL_DIR N   # N forks while 3 threads run
    python forking.py plans MODEL_DIR N DIR  # N forks while threads configure,
                                             # read config, make sessions, save

Prints one JSON line; exits non-zero on a failed check."""

import json
import multiprocessing as mp
import os
import sys
import threading
import time

import numpy as np

from tensor_arena import onnxruntime as ta


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def wait_idle(sessions_rss: int, deadline_s: float) -> dict:
    """Polls until the arenas reserve nothing and RSS is within 5% of the
    sessions' RSS (or the deadline): the figures and when they got there."""
    t0 = time.monotonic()
    reserved_at = rss_at = None
    while time.monotonic() - t0 < deadline_s:
        now = time.monotonic() - t0
        if reserved_at is None and ta.stats()["reserved_current"] == 0:
            reserved_at = now
        if rss_at is None and rss() <= sessions_rss * 1.05:
            rss_at = now
        if reserved_at is not None and rss_at is not None:
            break
        time.sleep(0.05)
    return {"reserved_zero_after_s": reserved_at, "rss_ok_after_s": rss_at,
            "reserved": ta.stats()["reserved_current"], "rss": rss()}


def decay_child(conn, sess, x, expected, run: bool, sessions_rss: int) -> None:
    out = {"pid": os.getpid(), "rss_at_fork": rss(), "reserved_at_fork": ta.stats()["reserved_current"]}
    if run:
        got = sess.run(None, {"x": x})[0]
        out["same"] = got.tobytes() == expected
    out.update(wait_idle(sessions_rss, 30.0))
    conn.send(out)


def decay(models: str) -> int:
    sess = ta.InferenceSession(os.path.join(models, "ppocr_det.onnx"))
    sessions_rss = rss()
    x = np.random.default_rng(0).random((1, 3, 960, 960), dtype=np.float32)
    expected = sess.run(None, {"x": x})[0].tobytes()
    ctx = mp.get_context("fork")
    results = []
    for run in (True, False):
        # The parent's worker holds its run's memory at the fork (its decay
        # is due in 2 s): the child's must go back there, the child running
        # or not.
        sess.run(None, {"x": x})
        assert ta.stats()["reserved_current"] > 0, "the parent's arena should hold its run's memory"
        a, b = ctx.Pipe(duplex=False)
        p = ctx.Process(target=decay_child, args=(b, sess, x, expected, run, sessions_rss))
        p.start()
        got = a.recv() if a.poll(120) else None
        p.join(30)
        if p.is_alive():
            p.kill()
        results.append({"child_ran": run, **(got or {"hung": True})})
    print(json.dumps({"sessions_rss": sessions_rss, "children": results}))
    ok = all(r.get("reserved") == 0 and r.get("rss_ok_after_s") is not None and r.get("same", True)
             for r in results)
    return 0 if ok else 1


def storm_child(sess, x, expected) -> None:
    got = sess.run(None, {"x": x})[0]
    os._exit(0 if got.tobytes() == expected else 3)


def storm(models: str, n: int) -> int:
    # Fewer workers than running threads: at most forks, every worker is
    # checked out by a thread the child will not have.
    ta.configure(workers=2)
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = int(os.environ.get("FORK_INTRA", "0"))
    sess = ta.InferenceSession(os.path.join(models, "ppocr_cls.onnx"), so)
    x = np.random.default_rng(1).random((4, 3, 48, 192), dtype=np.float32)
    expected = sess.run(None, {"x": x})[0].tobytes()
    stop = threading.Event()
    runs = [0]

    def hammer() -> None:
        while not stop.is_set():
            assert sess.run(None, {"x": x})[0].tobytes() == expected
            runs[0] += 1

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    ctx = mp.get_context("fork")
    codes = []
    hung = 0
    t0 = time.monotonic()
    for _ in range(n):
        p = ctx.Process(target=storm_child, args=(sess, x, expected))
        p.start()
        p.join(60)
        if p.is_alive():
            hung += 1
            if os.environ.get("FORK_GDB"):
                os.system(f"gdb -p {p.pid} -batch -ex 'thread apply all bt' > /tmp/hung-{p.pid}.txt 2>&1")
            p.kill()
            p.join()
        codes.append(p.exitcode)
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps({"forks": n, "hung": hung, "failed": sum(c != 0 for c in codes),
                      "parent_runs": runs[0], "seconds": round(time.monotonic() - t0, 1)}))
    return 0 if hung == 0 and all(c == 0 for c in codes) else 1


def plans_child() -> None:
    # The child's own locks work: it reads the settings and saves.
    ta.config()
    ta.save_plans()
    os._exit(0)


def plans(models: str, n: int, store: str) -> int:
    """N forks (os.fork, as gunicorn does) while other threads hold the GIL
    and ask for the plans' locks: config(), configure(plans=...), new
    sessions (each loads its store) and saves. A fork or a child that does
    not finish within PER_FORK seconds is the first hang: reported, and the
    process exits at once. A fork, or this thread waiting for the GIL,
    that takes twice that exits too (faulthandler prints where every
    thread was)."""
    import faulthandler
    per_fork = float(os.environ.get("PER_FORK", "20"))
    ta.configure(workers=2, plans=store)
    model = os.path.join(models, "ppocr_cls.onnx")
    x = np.random.default_rng(1).random((1, 3, 48, 192), dtype=np.float32)
    first = ta.InferenceSession(model)
    first.run(None, {"x": x})
    stop = threading.Event()
    calls = {"config": 0, "configure": 0, "session": 0, "save": 0}

    def config() -> None:
        while not stop.is_set():
            ta.config()
            calls["config"] += 1

    def configure() -> None:
        while not stop.is_set():
            ta.configure(plans=store)
            calls["configure"] += 1

    def session() -> None:
        while not stop.is_set():
            s = ta.InferenceSession(model)
            s.run(None, {"x": x})
            calls["session"] += 1

    def save() -> None:
        while not stop.is_set():
            ta.save_plans()
            calls["save"] += 1

    threads = [threading.Thread(target=f) for f in (config, configure, session, save)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    forks = 0
    for i in range(n):
        # A fork that never returns (a deadlock in the parent), or this
        # thread kept from the GIL (other threads taking it back first),
        # ends the process here, with every thread's stack: the watchdog
        # is a C thread, needing no GIL.
        faulthandler.dump_traceback_later(2 * per_fork, exit=True)
        pid = os.fork()
        if pid == 0:
            plans_child()
        deadline = time.monotonic() + per_fork
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                stop.set()
                print(json.dumps({"forks": forks, "hung_child": i, **calls}))
                os._exit(1)
            time.sleep(0.001)
        faulthandler.cancel_dump_traceback_later()
        if os.waitstatus_to_exitcode(status) != 0:
            stop.set()
            print(json.dumps({"forks": forks, "failed_child": i, "status": status, **calls}))
            os._exit(1)
        forks += 1
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps({"forks": forks, "seconds": round(time.monotonic() - t0, 1), **calls}))
    return 0


if __name__ == "__main__":
    what, models = sys.argv[1], sys.argv[2]
    if what == "plans":
        sys.exit(plans(models, int(sys.argv[3]), sys.argv[4]))
    sys.exit(decay(models) if what == "decay" else storm(models, int(sys.argv[3])))
