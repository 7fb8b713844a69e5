#!/usr/bin/env python3
"""The model as a Ray Serve deployment with two replicas, on a local Ray
cluster that this script starts and stops:

    python ray_app.py --port 8000 [--replicas 2] [--num-cpus 2] [--temp-dir DIR]

`ray.init` starts a fresh local cluster (never joins a running one): no
dashboard, `--num-cpus` CPUs, a 100 MiB object store, its files in a
temporary folder (`--temp-dir`, made here if not given, removed at the
end). Serve's HTTP proxy answers on 127.0.0.1:PORT:

POST /infer {"seed": 1, "batch": 4} -> {"sha256": ..., "pid": ...};
GET /memory -> the answering replica's RSS, peak and arena (model.py).

Each replica is a Ray worker process that the raylet starts from scratch
(spawned, not forked from this driver): it imports model.py, which makes
its sessions, in its constructor. The driver never makes sessions. What
the replicas need from the environment (SERVER_RUNTIME, SERVER_MODEL,
SERVER_RUN_THREADS, TENSOR_ARENA_*, MALLOC_*) is passed in the deployment's
`runtime_env["env_vars"]`, as on a cluster whose raylets were started by
`ray start` and do not share this process's environment.

Runs until SIGTERM or SIGINT, then `serve.shutdown()`, `ray.shutdown()`,
and kills any process of the cluster left (one that this driver had
started, or whose command line names the temporary folder) before
removing the folder."""

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent

# No usage report from a test or a benchmark (this machine may have no
# network at all).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# What a replica needs from this process's environment.
FORWARDED_PREFIXES = ("SERVER_", "TENSOR_ARENA_", "MALLOC_", "GLIBC_TUNABLES", "OMP_")


def forwarded_env() -> dict:
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}


def _stat(pid: int):
    """(ppid, session id, start time) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[3]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def descendants(root: int) -> dict:
    """{pid: start time} of every live process descended from `root`."""
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st:
                stats[int(d)] = st
    out, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, _, start) in stats.items():
            if ppid == parent and pid not in out:
                out[pid] = start
                todo.append(pid)
    return out


def ray_processes(temp_dir: str, session: int = 0, known: dict = None) -> list:
    """Pids of the processes (other than this one) of a cluster started
    with `temp_dir`: those whose command line names it (GCS, raylet, the
    agents' launchers), those of session `session` if given (a driver
    started as a session leader: the raylet's workers have process groups
    of their own, and a title, `ray::...`, in place of their command line),
    and those of `known` ({pid: start time}, from `descendants`) still
    alive."""
    needle = temp_dir.encode()
    known = known or {}
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        pid = int(d)
        st = _stat(pid)
        if st is None:
            continue
        if (session and st[1] == session) or known.get(pid) == st[2]:
            out.append(pid)
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if needle in f.read():
                    out.append(pid)
        except OSError:
            continue
    return out


def kill_leftovers(temp_dir: str, session: int = 0, known: dict = None, grace_s: float = 5.0) -> list:
    """SIGTERM, then SIGKILL, for what `ray_processes` finds; returns the
    pids that had to be signalled."""
    pids = ray_processes(temp_dir, session, known)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and ray_processes(temp_dir, session, known):
            time.sleep(0.1)
        if not ray_processes(temp_dir, session, known):
            break
    return pids


def deployment(num_replicas: int):
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    @serve.deployment(
        num_replicas=num_replicas,
        # Serve's default is one CPU per replica; the cluster has few.
        ray_actor_options={"num_cpus": 0.5, "runtime_env": {"env_vars": forwarded_env()}},
        max_ongoing_requests=8,
    )
    class Model:
        def __init__(self, servers_dir: str):
            # This class is pickled by value (it lives in the driver's
            # __main__); model.py is imported from the folder here.
            sys.path.insert(0, servers_dir)
            import model

            self.model = model
            # SERVER_RUN_THREADS=N: runs on N threads of the replica's own
            # (fewer threads, fewer glibc heaps); unset or 0: asyncio's
            # default executor (min(32, cores + 4) threads).
            n = int(os.environ.get("SERVER_RUN_THREADS") or 0)
            self.executor = ThreadPoolExecutor(max_workers=n, thread_name_prefix="run") if n > 0 else None

        async def __call__(self, request: Request):
            path = request.url.path
            try:
                if path == "/infer" and request.method == "POST":
                    req = await request.json()
                    # The run releases the GIL: a thread runs it, the
                    # replica's event loop goes on.
                    return await asyncio.get_running_loop().run_in_executor(
                        self.executor, self.model.infer, int(req["seed"]), int(req.get("batch", 1)))
                if path == "/memory":
                    return self.model.memory()
            except (KeyError, ValueError, TypeError) as e:
                return JSONResponse({"error": str(e)}, status_code=400)
            return JSONResponse({"error": "not found"}, status_code=404)

    return Model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--temp-dir", help="Ray's folder (short: Ray's socket paths live under it)")
    a = ap.parse_args()

    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise SystemExit(f"ray_app: {e}: pip install 'ray[serve]' (pinned in crates/python/tests/requirements.txt)")

    temp_dir = a.temp_dir or tempfile.mkdtemp(prefix="ta-ray-", dir="/tmp")
    os.makedirs(temp_dir, exist_ok=True)
    stop = threading.Event()

    def on_signal(*_):
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    try:
        ray.init(
            address="local",
            num_cpus=a.num_cpus,
            include_dashboard=False,
            object_store_memory=100 * 1024 * 1024,
            _temp_dir=temp_dir,
            namespace="tensor-arena-servers",
        )
        # ray.init installs its own SIGTERM handlers (a Python one that
        # exits, and its core worker's fatal-signal handler, under which a
        # SIGTERM aborted this driver during ray.shutdown()): ours again,
        # so that a stop is the orderly shutdown below.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        serve.start(http_options={"host": "127.0.0.1", "port": a.port})
        serve.run(deployment(a.replicas).bind(str(HERE)), name="model", route_prefix="/")
        print(f"ray_app: serving on 127.0.0.1:{a.port}, {a.replicas} replicas, temp dir {temp_dir}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        # What this driver started (the raylet's workers among them), seen
        # before the shutdown orphans anything.
        started = descendants(os.getpid())
        # Each step on its own: a failed one must not keep the next from
        # running.
        for step in ("serve", "ray"):
            try:
                if not ray.is_initialized():
                    break
                if step == "serve":
                    serve.shutdown()
                else:
                    ray.shutdown()
            except Exception as e:  # noqa: BLE001 (reported, then the next step)
                print(f"ray_app: {step}.shutdown() failed: {e!r}", file=sys.stderr, flush=True)
        left = kill_leftovers(temp_dir, known=started)
        if left:
            print(f"ray_app: killed {len(left)} process(es) left after ray.shutdown()", file=sys.stderr, flush=True)
        if not a.temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
