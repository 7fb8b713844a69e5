#!/usr/bin/env python3
"""Starts a server of this folder, sends it requests, checks every answer
against onnxruntime in this process, and reports each worker's memory:
before the runtime is imported, with the sessions made, its peak (VmHWM),
after the load, and after idle.
The server is stopped (its whole process group) on every path.

    python load.py uvicorn  [--runtime ta|ort] [--requests 200] [--clients 8] [--idle 15] [--model ppocr_cls.onnx]
    python load.py gunicorn [--runtime ta|ort] ...
    python load.py ray      [--runtime ta|ort] ...

uvicorn: `uvicorn fastapi_app:app --workers 2` (workers spawned, each
makes its sessions); gunicorn: `gunicorn --preload --workers 2 --threads 4
wsgi_app:app` (sessions made in the master, workers forked); ray:
`ray_app.py`, a Ray Serve deployment with 2 replicas on a local cluster
(each replica a Ray worker process the raylet starts, which makes its
sessions; found by the pids the replicas answer with, since they are not
the driver's children). Prints one JSON line."""

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(kind: str, port: int, workers: int, temp_dir: str = "") -> list:
    if kind == "uvicorn":
        return [sys.executable, "-m", "uvicorn", "--app-dir", str(HERE), "fastapi_app:app",
                "--workers", str(workers), "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    if kind == "gunicorn":
        return [sys.executable, "-m", "gunicorn", "--chdir", str(HERE), "--preload", "--workers", str(workers),
                "--threads", "4", "--bind", f"127.0.0.1:{port}", "--log-level", "warning", "wsgi_app:app"]
    if kind == "ray":
        return [sys.executable, str(HERE / "ray_app.py"), "--port", str(port), "--replicas", str(workers),
                "--num-cpus", "2", "--temp-dir", temp_dir]
    raise SystemExit(f"unknown server {kind!r}")


def call(port: int, path: str, body=None, timeout=60.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def workers_of(master: int) -> list:
    """The server's worker processes: children of the master that serve
    (uvicorn's are spawned `spawn_main`; multiprocessing's resource tracker
    is left out)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == master and "resource_tracker" not in cmd:
            out.append(int(d))
    return sorted(out)


def replicas_of(port: int, workers: int, tries: int = 400) -> list:
    """Ray Serve's replicas: the pids that /memory answers with, asked
    until `workers` distinct ones have answered (Serve's router chooses
    the replica). Each must be a process of this machine (a local
    cluster)."""
    seen = set()
    for _ in range(tries):
        seen.add(call(port, "/memory")["pid"])
        if len(seen) >= workers:
            break
    for p in seen:
        if not os.path.exists(f"/proc/{p}/status"):
            raise RuntimeError(f"replica pid {p} is not a process of this machine")
    return sorted(seen)


def stop(proc, kind: str, temp_dir: str) -> None:
    """Stops the server and everything it started. uvicorn, gunicorn: the
    process group, SIGTERM then SIGKILL. ray: SIGTERM to the driver alone
    (it runs serve.shutdown() and ray.shutdown()), then SIGKILL to its
    group, and to any process of its session (the driver was started as a
    session leader; Ray's workers have process groups of their own) or
    whose command line names the cluster's temporary folder, which is then
    removed."""
    first = proc.terminate if kind == "ray" else (lambda: os.killpg(proc.pid, signal.SIGTERM))
    try:
        first()
        proc.wait(60 if kind == "ray" else 15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    if kind == "ray":
        from ray_app import kill_leftovers

        left = kill_leftovers(temp_dir, session=proc.pid)
        shutil.rmtree(temp_dir, ignore_errors=True)
        if left:
            print(f"load.py: killed {len(left)} Ray process(es) left by the driver", file=sys.stderr)


def expected(seeds, batch_of, model_path) -> dict:
    import numpy as np
    import onnxruntime

    sess = onnxruntime.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    out = {}
    for s in seeds:
        x = np.random.default_rng(s).random((batch_of(s), 3, 48, 192), dtype=np.float32)
        out[s] = hashlib.sha256(sess.run(None, {"x": x})[0].tobytes()).hexdigest()
    return out


def arenas(port: int, pids: list, runtime: str, field: str = "reserved") -> dict:
    """Each worker's arena (bytes reserved now, or `field` of /memory),
    asking /memory until every worker has answered (which worker answers
    is the server's choice)."""
    if runtime != "ta":
        return {}
    seen = {}
    for _ in range(200):
        m = call(port, "/memory")
        seen[m["pid"]] = m[field]
        if set(pids) <= set(seen):
            break
    return seen


def run(kind: str, runtime: str, requests: int, clients: int, idle: float, workers: int = 2,
        ready_s: float = 120.0, settle_s: float = 0.0, log=None, model: str = "ppocr_cls.onnx") -> dict:
    """The load and the figures; after `idle` seconds, with `settle_s`,
    polls up to that long more until every worker's arena reserves
    nothing (tensor-arena only). `model`: an asset taking
    `(batch, 3, 48, 192)` as `x` (ppocr_cls.onnx, ppocr_rec.onnx)."""
    port = free_port()
    env = dict(os.environ, SERVER_RUNTIME=runtime)
    env.setdefault("TENSOR_ARENA_ORT_ASSETS", str(HERE.parents[3] / "target" / "ort-assets"))
    model_path = os.path.join(env["TENSOR_ARENA_ORT_ASSETS"], model)
    env["SERVER_MODEL"] = model_path

    def batch_of(s: int) -> int:
        return 1 + s % 8

    seeds = list(range(requests))
    want = expected(seeds, batch_of, model_path)
    # Ray's folder: short (its sockets live under it), ours to remove.
    temp_dir = tempfile.mkdtemp(prefix="ta-ray-", dir="/tmp") if kind == "ray" else ""
    proc = subprocess.Popen(command(kind, port, workers, temp_dir), env=env, start_new_session=True,
                            stdout=log or subprocess.DEVNULL, stderr=log or subprocess.DEVNULL)
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{kind} exited with {proc.returncode} before serving")
            try:
                call(port, "/memory", timeout=5)
                break
            except OSError:
                if time.monotonic() - t0 > ready_s:
                    raise RuntimeError(f"{kind} did not answer within {ready_s} s")
                time.sleep(0.3)
        pids = replicas_of(port, workers) if kind == "ray" else workers_of(proc.pid)
        if len(pids) != workers and kind == "ray":
            raise RuntimeError(f"{len(pids)} of {workers} Ray Serve replicas answered: {pids}")
        if len(pids) != workers:
            # uvicorn may still be starting one: wait for all.
            deadline = time.monotonic() + ready_s
            while len(pids) != workers and time.monotonic() < deadline:
                time.sleep(0.3)
                pids = workers_of(proc.pid)
        sessions, start = {}, {}
        for _ in range(100):
            m = call(port, "/memory")
            sessions[m["pid"]] = m["sessions_rss_kib"]
            start[m["pid"]] = m["start_rss_kib"]
            if set(pids) <= set(sessions):
                break
        with ThreadPoolExecutor(clients) as pool:
            got = list(pool.map(lambda s: call(port, "/infer", {"seed": s, "batch": batch_of(s)}), seeds))
        identical = all(g["sha256"] == want[s] for s, g in zip(seeds, got))
        served = {p: sum(g["pid"] == p for g in got) for p in pids}
        after = {p: status_kib(p, "VmRSS") for p in pids}
        time.sleep(idle)
        reserved = arenas(port, pids, runtime)
        reserved_peak = arenas(port, pids, runtime, "reserved_peak")
        t1 = time.monotonic()
        while settle_s and any(reserved.get(p, 1) for p in pids) and time.monotonic() - t1 < settle_s:
            time.sleep(0.5)
            reserved = arenas(port, pids, runtime)
        per = [{"pid": p, "served": served[p], "start_mib": round(start.get(p, 0) / 1024, 1),
                "sessions_mib": round(sessions.get(p, 0) / 1024, 1),
                "peak_mib": round(status_kib(p, "VmHWM") / 1024, 1),
                "after_load_mib": round(after[p] / 1024, 1),
                "idle_mib": round(status_kib(p, "VmRSS") / 1024, 1),
                "reserved": reserved.get(p),
                "reserved_peak_mib": None if p not in reserved_peak else round(reserved_peak[p] / 2**20, 1)}
               for p in pids]
        out = {"server": kind, "runtime": runtime, "model": model, "requests": requests, "clients": clients,
               "idle_s": idle, "identical": identical, "workers": per}
        if kind == "ray":
            # By the time this is returned, the folder is removed and no
            # process of the driver's session (its pid) is left.
            out["temp_dir"], out["driver_pid"] = temp_dir, proc.pid
        return out
    finally:
        stop(proc, kind, temp_dir)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("server", choices=["uvicorn", "gunicorn", "ray"])
    ap.add_argument("--runtime", choices=["ta", "ort"], default="ta")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--idle", type=float, default=15.0)
    ap.add_argument("--model", default="ppocr_cls.onnx",
                    help="an asset of TENSOR_ARENA_ORT_ASSETS taking (batch, 3, 48, 192) as x")
    a = ap.parse_args()
    print(json.dumps(run(a.server, a.runtime, a.requests, a.clients, a.idle, model=a.model)))


if __name__ == "__main__":
    main()
