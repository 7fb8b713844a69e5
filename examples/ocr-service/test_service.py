"""The OCR service (app.py) as a client sees it: started with uvicorn in its
own process (the service's own virtual environment: tools/python-check.sh
installs it with install.sh), a few requests, the answers checked, and the
server stopped on every path (a finally: terminate, then kill).

- rendered text images get 200 and their words back;
- a body that is not an image gets 400, and the service goes on;
- under TENSOR_ARENA_MEMORY_LIMIT=32M an OCR run of a page cannot fit even
  alone: rapidocr wraps our OutOfMemory in its ONNXRuntimeError, the
  service answers 413 naming the run's need and the limit, and goes on
  answering (/healthz, /memory, another 413); /memory shows the limit and
  where it came from, and the refusal or the retry alone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

HERE = Path(os.environ.get("OCR_SERVICE_DIR") or Path(__file__).resolve().parent)
sys.path.insert(0, str(HERE))
from load import WORDS, render  # noqa: E402

START_S = 180  # loading three models on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: bytes | None = None):
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.headers, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.load(e)


@contextmanager
def service(tmp_path: Path, **env):
    port = free_port()
    log = open(tmp_path / f"server-{port}.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=HERE,
        env={**os.environ, "OCR_WORKERS": "2", **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"the service exited with {proc.returncode}:\n{log.read()}")
            try:
                if request(url + "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"the service did not answer within {START_S} s:\n{log.read()}")
            time.sleep(0.5)
        yield url, proc
        assert proc.poll() is None, "the service exited during the test"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()


def images(n: int):
    import random

    rng = random.Random(11)
    return [render(rng, i) for i in range(n)]


def test_ocr_answers_and_bad_input(tmp_path):
    with service(tmp_path) as (url, _):
        for img in images(3):
            code, _, body = request(url + "/ocr", img)
            assert code == 200, body
            words = {w for line in body["lines"] for w in line["text"].split()}
            assert words & set(WORDS), body
            for line in body["lines"]:
                assert len(line["box"]) == 4 and 0.0 <= line["score"] <= 1.0
        code, _, body = request(url + "/ocr", b"not an image")
        assert code == 400, body
        code, _, mem = request(url + "/memory")
        assert code == 200 and mem["arena"]["runs"] > 0, mem
        # No variable: the cgroup's limit or MemTotal's share.
        assert mem["limit"] is None or mem["limit"]["source"] in ("cgroup", "memtotal"), mem


def test_a_request_that_cannot_fit_alone_is_413_and_the_service_goes_on(tmp_path):
    with service(tmp_path, TENSOR_ARENA_MEMORY_LIMIT="32M") as (url, _):
        img = images(1)[0]
        code, headers, body = request(url + "/ocr", img)
        assert code == 413, body
        msg = body["error"]
        assert "too large" in msg and "needs" in msg and "bytes" in msg, body
        assert request(url + "/healthz")[0] == 200
        code, _, mem = request(url + "/memory")
        assert mem["limit"] == {"bytes": 32 << 20, "source": "environment", "file": None}, mem
        arena = mem["arena"]
        assert arena["ooms"] + arena["refused"] >= 1, mem
        code, _, body = request(url + "/ocr", img)
        assert code == 413, body
