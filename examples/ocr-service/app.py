"""An OCR service on tensor-arena: FastAPI + rapidocr-onnxruntime, with the
deployment settings of docs/python-deploy.md.

    POST /ocr      the image's bytes (PNG, JPEG) as the body
                   -> 200 {"lines": [{"text", "score", "box"}], ...}
                   -> 503 (Retry-After: 1) when the run was refused memory
                   -> 400 for a body that is not an image, 413 for one over
                      OCR_MAX_BODY bytes
    GET  /healthz  200 once the sessions are made
    GET  /memory   the process's RSS and peak, the arenas' limit (the
                   default and the pool's budget) and stats

Run it (from this folder, after install.sh):

    MALLOC_ARENA_MAX=2 python -m uvicorn app:app --host 0.0.0.0 --port 8000

What makes the process's memory bounded, not only the arena's:
- ``with ta.patch():`` around making ``RapidOCR()``: its det, cls and rec
  sessions are tensor-arena's, so their tensors come from the pool's
  arenas, under the process's memory limit (``ta.memory_limit()``: 75 % of
  the container's, unless ``TENSOR_ARENA_MEMORY_LIMIT`` says otherwise).
- under a container's memory limit, the arenas' budget is what the rest
  of the process leaves (``_fitted_budget``), so that a request
  the container cannot hold is refused by the arena, not killed by the
  kernel with every other request;
- a concurrency cap the size of the pool (``OCR_WORKERS``, default 4): at
  most that many requests decode, preprocess and run at once, on that many
  threads of the service's own executor. Without it every waiting request
  holds its decoded image and preprocessing buffers (the pool bounds only
  the runs), and every thread of the server's thread pool grows a glibc
  heap of its own.
- ``OutOfMemory`` -> 503: rapidocr re-raises every error of a run as its
  own ``ONNXRuntimeError`` (``raise ... from e``); ``ta.out_of_memory``
  finds ours in the ``__cause__`` chain. The run failed alone; the service
  goes on.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import tensor_arena.onnxruntime as ta
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from PIL import UnidentifiedImageError

WORKERS = int(os.environ.get("OCR_WORKERS", "4"))
MAX_BODY = int(os.environ.get("OCR_MAX_BODY", str(16 << 20)))
# What one request in flight holds outside the arenas (its body, decoded
# image, resized and normalised copies, crops, results): about 35 MiB
# measured on large pages, so 64 MiB with a margin (docs/python-deploy.md).
RESERVE_PER_REQUEST = int(os.environ.get("OCR_RESERVE_PER_REQUEST", str(64 << 20)))

# The sessions first (only those made inside the block are tensor-arena's),
# then the pool, sized and limited (below), before any run.
with ta.patch():
    from rapidocr_onnxruntime import RapidOCR
    from rapidocr_onnxruntime.utils.load_image import LoadImageError

    engine = RapidOCR()


def _rss_kib() -> dict:
    """VmRSS, VmHWM (its peak), RssAnon and RssFile (the mapped files:
    libraries, models) of this process, in KiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0])
    return out


def _fitted_budget():
    """Under a memory cgroup (a container's ``--memory``), a budget of what
    the rest of the process leaves the arenas: the group's limit less the
    RSS now (the sessions made) and RESERVE_PER_REQUEST per request in
    flight. tensor-arena's own default (75 % of the group) assumes the rest
    fits in a quarter; for this service at 8 workers in 1 GiB it did not
    (the kernel killed it: BENCHMARKS.md). None (the default limit) where
    the limit is not the cgroup's: TENSOR_ARENA_MEMORY_LIMIT, if set, wins."""
    lim = ta.memory_limit()
    if lim is None or lim["source"] != "cgroup":
        return None
    with open(lim["file"]) as f:
        group = int(f.read().split()[0])
    rest = _rss_kib()["VmRSS"] * 1024 + WORKERS * RESERVE_PER_REQUEST
    return ta.Budget(max(group - rest, 32 << 20))


ta.configure(workers=WORKERS, budget=_fitted_budget())


@asynccontextmanager
async def lifespan(app: FastAPI):
    # Made here, on the server's event loop.
    app.state.cap = asyncio.Semaphore(WORKERS)
    app.state.executor = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="ocr")
    try:
        yield
    finally:
        app.state.executor.shutdown(wait=True)


app = FastAPI(title="tensor-arena OCR example", lifespan=lifespan)


def _ocr(body: bytes) -> dict:
    result, elapse = engine(body)
    lines = [
        {"text": text, "score": float(score), "box": [[float(x), float(y)] for x, y in box]}
        for box, text, score in (result or [])
    ]
    return {"lines": lines, "seconds": elapse}


@app.post("/ocr")
async def ocr(request: Request):
    body = await request.body()
    if not body:
        return JSONResponse({"error": "empty body: send the image's bytes"}, status_code=400)
    if len(body) > MAX_BODY:
        return JSONResponse({"error": f"body over {MAX_BODY} bytes"}, status_code=413)
    # The cap: decoding, preprocessing and the runs of at most WORKERS
    # requests at once; the others wait here holding only their bytes.
    async with request.app.state.cap:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(request.app.state.executor, _ocr, body)
        except Exception as e:  # rapidocr wraps ours: look in the chain
            if ta.out_of_memory(e) is not None:
                return JSONResponse(
                    {"error": "out of memory: the request was refused, retry later"},
                    status_code=503,
                    headers={"Retry-After": "1"},
                )
            if isinstance(e, (LoadImageError, UnidentifiedImageError)):
                return JSONResponse({"error": f"not an image: {e}"}, status_code=400)
            raise


@app.get("/healthz")
def healthz():
    return {"ok": True}


@app.get("/memory")
def memory():
    s = ta.stats()
    return {
        "rss_kib": _rss_kib(),
        "limit": ta.memory_limit(),
        "budget": (lambda b: b.limit if b else None)(ta.config()["budget"]),
        "workers": WORKERS,
        "arena": {k: s[k] for k in ("reserved_current", "reserved_peak", "ooms", "runs")},
    }
