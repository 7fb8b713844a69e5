#!/usr/bin/env python3
"""Makes the OCR request stream of `tensor-arena ort-pool` from real images.

Each request is what RapidOCR (rapidocr-onnxruntime 1.4.4) runs for one
image: PP-OCRv4 det on the image, then the text-line crops det finds go
through the angle classifier (cls) and the recognizer (rec) in batches.
The images are rendered here with PIL (DejaVu fonts): pages, receipts,
screenshots and signs of random text, long side 320 to 1280 pixels. The
crops' count and widths come from det's real output on each image, post-
processed as RapidOCR does (threshold, connected regions, boxes grown by
the unclip ratio), so the stream has the shapes a real OCR server sees.

The shapes follow RapidOCR 1.4.4's defaults:
- det: the image resized so both sides are multiples of 32, the long side
  kept within [320, 1280] (its `limit_side_len` range for this stream);
- cls: batches of 6 crops, each 3x48x192;
- rec: crops sorted by aspect ratio, batches of 6, each batch's width
  48 * max(320/48, the widest crop's w/h in the batch).

Output, one request per line (the format `ort-pool` reads):
    det 1x3xHxW cls BxCxHxW ... rec BxCxHxW ...
Lines starting with '#' are comments. Deterministic for a given --seed.

Needs numpy, pillow, scipy and onnxruntime (a venv outside the repo):
    python3 -m venv /tmp/ocrvenv
    /tmp/ocrvenv/bin/pip install numpy pillow scipy onnxruntime==1.31.1
    /tmp/ocrvenv/bin/python tools/ocr-stream.py --det target/ort-assets/ppocr_det.onnx \
        --images 64 > crates/cli/data/ocr-stream.txt
"""

import argparse
import math
import random
import sys

import numpy as np
import onnxruntime as ort
from PIL import Image, ImageDraw, ImageFont
from scipy import ndimage

WORDS = (
    "tensor arena memory budget invoice total amount due date receipt item qty price "
    "tax subtotal cash change thank you welcome order number table server model batch "
    "shape inference runtime worker pool latency request page chapter section figure "
    "north south east west street avenue road open closed exit entrance floor room "
    "2026 11 24 15:30 $12.50 #4471 42 7 100% 3.14 ACME Corp. Ltd. Inc. No. Tel. Fax"
).split()

FONTS = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
]

# Kinds of image: (width range, height range, lines range, font size range).
KINDS = {
    "page": ((600, 1000), (800, 1280), (8, 28), (14, 26)),
    "receipt": ((320, 480), (700, 1280), (10, 30), (14, 20)),
    "screenshot": ((900, 1280), (500, 800), (4, 16), (16, 30)),
    "sign": ((320, 800), (240, 500), (1, 4), (32, 72)),
}


def render(rng, kind):
    (w0, w1), (h0, h1), (l0, l1), (f0, f1) = KINDS[kind]
    w, h = rng.randint(w0, w1), rng.randint(h0, h1)
    bg = rng.randint(215, 255)
    img = Image.new("RGB", (w, h), (bg, bg, max(0, bg - rng.randint(0, 20))))
    draw = ImageDraw.Draw(img)
    y = rng.randint(4, 40)
    for _ in range(rng.randint(l0, l1)):
        size = rng.randint(f0, f1)
        font = ImageFont.truetype(rng.choice(FONTS), size)
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9)))
        x = rng.randint(4, max(5, w // 6))
        ink = rng.randint(0, 70)
        draw.text((x, y), text, fill=(ink, ink, ink), font=font)
        y += int(size * rng.uniform(1.3, 2.4))
        if y > h - size:
            break
    return img


def det_size(w, h, limit_max=1280, limit_min=320):
    """RapidOCR's resize: long side within [limit_min, limit_max], both
    sides rounded to multiples of 32."""
    ratio = 1.0
    if max(w, h) > limit_max:
        ratio = limit_max / max(w, h)
    elif max(w, h) < limit_min:
        ratio = limit_min / max(w, h)
    rw = max(32, int(round(w * ratio / 32)) * 32)
    rh = max(32, int(round(h * ratio / 32)) * 32)
    return rw, rh


def det_boxes(sess, img):
    w, h = img.size
    rw, rh = det_size(w, h)
    x = np.asarray(img.resize((rw, rh)), dtype=np.float32) / 255.0
    x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array(
        [0.229, 0.224, 0.225], np.float32
    )
    x = x.transpose(2, 0, 1)[None]
    prob = sess.run(None, {sess.get_inputs()[0].name: x})[0][0, 0]
    mask = prob > 0.3
    labels, n = ndimage.label(mask)
    boxes = []
    for k, sl in enumerate(ndimage.find_objects(labels), start=1):
        if sl is None:
            continue
        ys, xs = sl
        bh, bw = ys.stop - ys.start, xs.stop - xs.start
        if min(bh, bw) < 3:
            continue
        region = labels[sl] == k
        score = float(prob[sl][region].mean())
        if score < 0.5:  # RapidOCR's box_thresh
            continue
        # Unclip (ratio 1.6): grow by area * ratio / perimeter on each side.
        d = bw * bh * 1.6 / (2 * (bw + bh))
        bw, bh = bw + 2 * d, bh + 2 * d
        # Back to the original image's pixels.
        boxes.append((bw * w / rw, bh * h / rh))
    return (rw, rh), boxes


def batches(n, size=6):
    return [min(size, n - i) for i in range(0, n, size)]


def request_line(det_wh, boxes):
    rw, rh = det_wh
    parts = [f"det 1x3x{rh}x{rw}"]
    crops = [(bw, bh) for bw, bh in boxes]
    # RapidOCR turns tall crops (h/w >= 1.5) upright before cls and rec.
    crops = [(bh, bw) if bh / bw >= 1.5 else (bw, bh) for bw, bh in crops]
    if crops:
        parts.append("cls " + " ".join(f"{b}x3x48x192" for b in batches(len(crops))))
        ratios = sorted(bw / bh for bw, bh in crops)
        rec = []
        for i in range(0, len(ratios), 6):
            chunk = ratios[i : i + 6]
            width = int(48 * max(320 / 48, max(chunk)))
            rec.append(f"{len(chunk)}x3x48x{width}")
        parts.append("rec " + " ".join(rec))
    return " ".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--det", required=True, help="ppocr_det.onnx")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(args.det, opts)
    kinds = list(KINDS)
    print(f"# tensor-arena ort-pool OCR request stream: {args.images} images, seed {args.seed}")
    print("# made by tools/ocr-stream.py (rendered images, PP-OCRv4 det's own boxes)")
    for i in range(args.images):
        kind = kinds[i % len(kinds)] if i < len(kinds) else rng.choice(kinds)
        img = render(rng, kind)
        det_wh, boxes = det_boxes(sess, img)
        line = request_line(det_wh, boxes)
        print(line)
        print(f"{i + 1}/{args.images} {kind} {img.size} -> {len(boxes)} crops", file=sys.stderr)


if __name__ == "__main__":
    main()
