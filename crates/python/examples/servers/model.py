"""What the servers serve: one small model (PaddleOCR's text-direction
classifier, ppocr_cls.onnx, from tools/fetch-ort-assets.sh), with the
sessions made when the module is imported: in each worker under
`uvicorn --workers N` (workers are spawned), once in the master under
`gunicorn --preload` (workers are forked from it), in each replica's
constructor under Ray Serve (ray_app.py: replicas are Ray worker
processes the raylet starts).

    SERVER_RUNTIME=ta   tensor_arena.onnxruntime (default)
    SERVER_RUNTIME=ort  onnxruntime, for comparison
    SERVER_MODEL=path   the model (default: $TENSOR_ARENA_ORT_ASSETS/ppocr_cls.onnx)

A request names a seed and a batch size; the worker makes the input from
them (so requests stay small) and answers with the output's SHA-256,
which the load script compares with onnxruntime's in its own process."""

import hashlib
import os
import resource


def rss_kib(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


# The worker's RSS before this module imports numpy and a runtime: the
# server's own (Python, and under Ray the core worker).
START_RSS_KIB = rss_kib()

import numpy as np  # noqa: E402

RUNTIME = os.environ.get("SERVER_RUNTIME", "ta")
MODEL = os.environ.get("SERVER_MODEL") or os.path.join(
    os.environ.get("TENSOR_ARENA_ORT_ASSETS", "target/ort-assets"), "ppocr_cls.onnx"
)

if RUNTIME == "ta":
    from tensor_arena.onnxruntime import InferenceSession  # noqa: E402
else:
    from onnxruntime import InferenceSession  # noqa: E402


SESSION = InferenceSession(MODEL, providers=["CPUExecutionProvider"])
SESSIONS_RSS_KIB = rss_kib()


def make_input(seed: int, batch: int) -> np.ndarray:
    """The request's input: (batch, 3, 48, 192), from its seed."""
    return np.random.default_rng(seed).random((batch, 3, 48, 192), dtype=np.float32)


def infer(seed: int, batch: int) -> dict:
    if not (1 <= batch <= 64):
        raise ValueError("batch must be 1 to 64")
    (out,) = SESSION.run(None, {"x": make_input(seed, batch)})
    return {"sha256": hashlib.sha256(out.tobytes()).hexdigest(), "pid": os.getpid()}


def memory() -> dict:
    """This worker's memory: RSS now, its peak, before the runtime was
    imported and with the sessions made (both in the process that made
    them: the master under --preload)."""
    d = {
        "pid": os.getpid(),
        "runtime": RUNTIME,
        "rss_kib": rss_kib(),
        "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "sessions_rss_kib": SESSIONS_RSS_KIB,
        "start_rss_kib": START_RSS_KIB,
    }
    if RUNTIME == "ta":
        from tensor_arena import onnxruntime as ta

        st = ta.stats()
        d["reserved"] = st["reserved_current"]
        d["reserved_peak"] = st["reserved_peak"]
    return d
