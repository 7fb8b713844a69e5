"""Rendered text images of varied sizes (the renderer of tools/ocr-stream.py,
cut down): pages, receipts, screenshots and signs of random words, in
DejaVu fonts (PIL's default font where those are missing)."""

import random

from PIL import Image, ImageDraw, ImageFont

WORDS = (
    "tensor arena memory budget invoice total amount due date receipt item qty price "
    "tax subtotal cash change thank you welcome order number table server model batch "
    "2026 11 24 15:30 $12.50 #4471 42 7 100% 3.14 ACME Corp. Ltd. Inc. No. Tel. Fax"
).split()
FONTS = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf",
]
KINDS = {
    "page": ((600, 1000), (800, 1280), (8, 28), (14, 26)),
    "receipt": ((320, 480), (700, 1280), (10, 30), (14, 20)),
    "screenshot": ((900, 1280), (500, 800), (4, 16), (16, 30)),
    "sign": ((200, 640), (80, 240), (1, 3), (24, 48)),
}


def font(rng, size):
    try:
        return ImageFont.truetype(rng.choice(FONTS), size)
    except OSError:
        return ImageFont.load_default()


def render(rng, kind):
    (w0, w1), (h0, h1), (l0, l1), (f0, f1) = KINDS[kind]
    w, h = rng.randint(w0, w1), rng.randint(h0, h1)
    bg = rng.randint(215, 255)
    img = Image.new("RGB", (w, h), (bg, bg, max(0, bg - rng.randint(0, 20))))
    draw = ImageDraw.Draw(img)
    y = rng.randint(4, 40)
    for _ in range(rng.randint(l0, l1)):
        size = rng.randint(f0, f1)
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9)))
        ink = rng.randint(0, 70)
        draw.text((rng.randint(4, max(5, w // 6)), y), text, fill=(ink, ink, ink), font=font(rng, size))
        y += int(size * rng.uniform(1.3, 2.4))
        if y > h - size:
            break
    return img


def images(n, seed=42):
    """`n` images as RGB uint8 arrays (BGR order, as OpenCV gives them)."""
    import numpy as np

    rng = random.Random(seed)
    kinds = list(KINDS)
    return [np.ascontiguousarray(np.asarray(render(rng, kinds[i % len(kinds)]))[..., ::-1]) for i in range(n)]
