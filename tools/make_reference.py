#!/usr/bin/env python3
"""Build crates/vad/data/speech.wav and crates/vad/data/reference.json.

Usage:
    python tools/make_reference.py /work/scratch/wheel/silero_vad-6.2.3-py3-none-any.whl [--rebuild-wav]

speech.wav: synthetic English speech (Debian's espeak-ng, voice en-us) with
silences between phrases, resampled by sox to 16 kHz mono, mixed with seeded
low-level white noise (so "silence" is not digital zero), 16-bit PCM WAV. It is
built only when missing or with --rebuild-wav (espeak-ng/sox versions change the
exact samples, and reference.json must match the committed WAV).

reference.json: onnxruntime (CPU, one thread) outputs of
silero_vad/data/silero_vad_16k_sequence.onnx on speech.wav, once for the whole
file in one call and once streaming (one window per call, carrying h, c and the
64-sample context). See crates/vad/data/README.md for the window layout.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import wave
import zipfile

import numpy as np
import onnxruntime as ort

ONNX_MEMBER = "silero_vad/data/silero_vad_16k_sequence.onnx"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "crates", "vad", "data")
RATE = 16000
WINDOW = 512
CONTEXT = 64
HIDDEN = 128

# (phrase, silence after it in seconds); 0.6 s of silence before the first.
LEAD_SILENCE = 0.5
PHRASES = [
    ("The quick brown fox jumps over the lazy dog.", 0.9),
    ("Voice activity detection finds speech.", 1.0),
    ("Buffers stay warm.", 0.6),
]
NOISE_RMS = 30.0  # in int16 units, about -61 dBFS
NOISE_SEED = 8


def sig(x):
    """Round to 7 significant digits for a compact JSON."""
    return [float(f"{v:.7g}") for v in np.asarray(x, dtype=np.float64).ravel()]


def to_json(value, indent=0):
    """Pretty JSON with every numeric list on one line, so the file stays small."""
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {to_json(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    return json.dumps(value, separators=(",", ":") if isinstance(value, list) else None)


def build_wav(path):
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found: apt-get install -y espeak-ng sox")
    pieces = [np.zeros(int(LEAD_SILENCE * RATE), dtype=np.float64)]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (text, pause) in enumerate(PHRASES):
            raw = os.path.join(tmp, f"p{i}.wav")
            res = os.path.join(tmp, f"p{i}_16k.raw")
            subprocess.run(["espeak-ng", "-v", "en-us", "-s", "170", "-w", raw, text], check=True)
            # 16 kHz, mono, signed 16-bit little-endian raw samples; -D: no
            # dither (sox's dither is random, so the output would not repeat).
            subprocess.run(["sox", "-D", raw, "-r", str(RATE), "-c", "1", "-b", "16", "-e", "signed-integer",
                            "-t", "raw", "--endian", "little", res], check=True)
            speech = np.fromfile(res, dtype="<i2").astype(np.float64)
            pieces += [speech, np.zeros(int(pause * RATE), dtype=np.float64)]
    audio = np.concatenate(pieces)
    rng = np.random.default_rng(NOISE_SEED)
    audio += rng.normal(0.0, NOISE_RMS, audio.size)
    pcm = np.clip(np.round(audio), -32768, 32767).astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())
    print(f"wrote {path}: {pcm.size} samples, {pcm.size / RATE:.2f} s")


def read_wav(path):
    with wave.open(path, "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, RATE)
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / np.float32(32768.0)


def windows(audio):
    """L x 576 rows: row i = audio[512*i - 64 : 512*i + 512], zeros before sample 0."""
    n = audio.size // WINDOW
    padded = np.concatenate([np.zeros(CONTEXT, dtype=np.float32), audio[: n * WINDOW]])
    rows = np.stack([padded[i * WINDOW: i * WINDOW + CONTEXT + WINDOW] for i in range(n)])
    return rows.astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="silero_vad-6.2.3-py3-none-any.whl, or the unzipped .onnx file")
    ap.add_argument("--rebuild-wav", action="store_true", help="regenerate speech.wav with espeak-ng and sox")
    args = ap.parse_args()

    wav_path = os.path.join(DATA, "speech.wav")
    if args.rebuild_wav or not os.path.exists(wav_path):
        build_wav(wav_path)
    audio = read_wav(wav_path)

    if args.source.endswith(".whl"):
        with zipfile.ZipFile(args.source) as z:
            model_bytes = z.read(ONNX_MEMBER)
    else:
        model_bytes = open(args.source, "rb").read()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model_bytes, sess_options=opts, providers=["CPUExecutionProvider"])

    rows = windows(audio)
    n = rows.shape[0]
    zero = np.zeros((1, 1, HIDDEN), dtype=np.float32)

    # Whole file: one call with L = n.
    probs, hn, cn = sess.run(None, {"input": rows, "h": zero, "c": zero})

    # Streaming: L = 1 per call, carrying h, c and the last 64 samples.
    s_probs = []
    h, c = zero, zero
    context = np.zeros(CONTEXT, dtype=np.float32)
    for i in range(n):
        new = audio[i * WINDOW: (i + 1) * WINDOW]
        row = np.concatenate([context, new])[None, :]
        assert np.array_equal(row[0], rows[i])
        p, h, c = sess.run(None, {"input": row, "h": h, "c": c})
        s_probs.append(p[0])
        context = new[-CONTEXT:]
    s_probs = np.array(s_probs, dtype=np.float32)
    print(f"{n} windows; onnxruntime whole vs streaming max abs diff {np.abs(probs - s_probs).max():.3g}")

    ref = {
        "description": "Silero VAD v6 16 kHz (silero_vad_16k_sequence.onnx from silero-vad 6.2.3) "
                       "speech probabilities from onnxruntime on speech.wav; built by tools/make_reference.py",
        "onnxruntime": ort.__version__,
        "wav": "speech.wav",
        "sample_rate": RATE,
        "num_samples": int(audio.size),
        "sample_scale": "x = i16 / 32768 (f32)",
        "window": WINDOW,
        "context": CONTEXT,
        "num_windows": n,
        "windows": "num_windows = num_samples / 512 (integer division; the trailing partial window is "
                   "not used). Row i of the L x 576 input is 576 f32 samples: x[512*i - 64 .. 512*i + 512], "
                   "where x[k] = 0 for k < 0 (so row 0 starts with 64 zeros). Initial h = c = 0 (1x1x128).",
        "whole": {
            "how": "one call: input = all num_windows rows (L = num_windows), h = c = 0",
            "probs": sig(probs),
            "hn": sig(hn),
            "cn": sig(cn),
        },
        "streaming": {
            "how": "num_windows calls with L = 1: call i gets row i (the 64-sample context is the last 64 "
                   "samples of call i-1's 512 new samples, zeros for i = 0) and the hn, cn of call i-1 "
                   "(zeros for i = 0)",
            "probs": sig(s_probs),
            "hn": sig(h),
            "cn": sig(c),
        },
    }
    out = os.path.join(DATA, "reference.json")
    with open(out, "w", encoding="utf-8") as f:
        f.write(to_json(ref) + "\n")
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    print("probs (whole):", " ".join(f"{p:.2f}" for p in probs))


if __name__ == "__main__":
    main()
