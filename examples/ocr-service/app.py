"""An OCR service on tensor-arena: FastAPI + rapidocr-onnxruntime, with the
deployment settings of docs/python-deploy.md.

    POST /ocr      the image's bytes (PNG, JPEG) as the body
                   -> 200 {"lines": [{"text", "score", "box"}], ...}
                   -> 413 for a request whose runs cannot fit in the
                      memory limit even alone (the message says what they
                      need and what the limit leaves), or a body over
                      OCR_MAX_BODY bytes
                   -> 400 for a body that is not an image
    GET  /healthz  200 once the sessions are made
    GET  /memory   the process's RSS and peak, the arenas' limit and stats

Run it (from this folder, after install.sh), with as many worker
processes as the machine has cores:

    MALLOC_ARENA_MAX=2 python -m uvicorn app:app --host 0.0.0.0 --port 8000 --workers 2

Nothing here is sized by hand. What keeps the container's memory bounded:
- ``with ta.patch():`` around making ``RapidOCR()``: its det, cls and rec
  sessions are tensor-arena's, so their tensors come from the pool's
  arenas, under the container's memory limit (``ta.memory_limit()``).
- tensor-arena admits each run by what it will need (its plan, or the
  largest run of the model so far): under a container's limit, every
  worker process of the server shares one limit, less what the rest of
  each process holds (measured as it runs), so a run waits its turn
  instead of the kernel killing a worker. A run that runs out of memory
  beside others runs again alone; one that cannot fit even alone fails at
  once with ``OutOfMemory`` (-> 413 here). The number of workers is an
  upper bound; memory decides how many run at once.
- What is left to the application, because tensor-arena cannot see it:
  its own decoding and preprocessing. A request decodes its image inside
  ``ta.reserve(..., for_run=True)``, sized from the image's header before
  anything is decoded: the decode waits its turn under the same limit as
  the runs of every worker process, together with the room of the
  request's first run (a page too large to decode at all gets 413), and
  that run takes the reservation over. So no process decodes requests
  whose runs have no room beside them: decoded pages never pile up while
  their runs wait. The executor below bounds how many requests are in
  flight in a process, and OCR_MAX_BODY bounds a body.
- ``ta.out_of_memory`` finds our ``OutOfMemory`` in the ``__cause__``
  chain: rapidocr re-raises every error of a run as its own
  ``ONNXRuntimeError``.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from io import BytesIO

import tensor_arena.onnxruntime as ta
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from PIL import Image, UnidentifiedImageError

# Runs at once at most (the pool's workers) and requests decoding at once.
WORKERS = int(os.environ.get("OCR_WORKERS", "4"))
MAX_BODY = int(os.environ.get("OCR_MAX_BODY", str(16 << 20)))

# The sessions first (only those made inside the block are tensor-arena's).
with ta.patch():
    from rapidocr_onnxruntime import RapidOCR
    from rapidocr_onnxruntime.utils.load_image import LoadImage, LoadImageError

    engine = RapidOCR()

# rapidocr's own decoding (PIL, then BGR), done here so that it is reserved.
load_image = LoadImage()
# What decoding holds at its peak, per pixel: PIL's image (4 bytes for RGB),
# numpy's copy (3) and the BGR conversion (3).
DECODE_BYTES_PER_PIXEL = 10

ta.configure(workers=WORKERS)


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


@asynccontextmanager
async def lifespan(app: FastAPI):
    # Made here, on the server's event loop: at most WORKERS requests
    # decode, preprocess and run at once; the others wait in its queue.
    app.state.executor = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="ocr")
    try:
        yield
    finally:
        app.state.executor.shutdown(wait=True)


app = FastAPI(title="tensor-arena OCR example", lifespan=lifespan)


def _ocr(body: bytes) -> dict:
    with Image.open(BytesIO(body)) as header:  # reads the header only
        width, height = header.size
    # The decode and the request's first run (det) are admitted together:
    # the reservation holds both, and det's run takes it over.
    with ta.reserve(width * height * DECODE_BYTES_PER_PIXEL, for_run=True):
        image = load_image(body)
        # The decoded image is BGR already: rapidocr takes it as it is.
        result, elapse = engine(image)
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
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(request.app.state.executor, _ocr, body)
    except Exception as e:  # rapidocr wraps ours: look in the chain
        oom = ta.out_of_memory(e)
        if oom is not None:
            # Admitted by its need and retried alone: it does not fit.
            return JSONResponse(
                {"error": f"too large for this server's memory: {oom}"}, status_code=413
            )
        if isinstance(e, Image.DecompressionBombError):
            return JSONResponse({"error": f"image too large: {e}"}, status_code=413)
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
        "workers": WORKERS,
        "arena": {
            k: s[k]
            for k in (
                "reserved_current", "reserved_peak", "ooms", "runs", "admission_room",
                "admitted_peak", "runs_in_flight_peak", "queued", "admission_waits",
                "retried_alone", "refused", "processes_sharing_limit",
            )
        },
    }
