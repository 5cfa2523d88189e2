"""Drawing glyphs on a large canvas, shared by the rendered characters (`render`) and the
two-glyph scenes (`relations`): a glyph's mask, colours with enough contrast, and the finish
(composite, pixel noise, one shrink to the requested size, so a seed is the same object at
every resolution)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = ["CANVAS", "glyph_mask", "contrasting_colours", "finish"]

CANVAS = 256
"""Side in pixels of the canvas every image is drawn on before it is shrunk."""
_MIN_CONTRAST = 80.0  # luma difference between foreground and background, of 255


@functools.lru_cache(maxsize=4096)
def _font(path: str, px: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, px)


def _luma(rgb: np.ndarray) -> float:
    return float(0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2])


def glyph_mask(char: str, font_path: str | Path, px: int, angle: float, limit: int) -> Image.Image:
    """`char` at `px` pixels, rotated by `angle` degrees with its box grown to hold it, shrunk
    to fit `limit` px if larger: an "L" image, 255 on the glyph."""
    font = _font(str(font_path), px)
    x0, y0, x1, y1 = font.getbbox(char)
    glyph = Image.new("L", (max(x1 - x0, 1) + 4, max(y1 - y0, 1) + 4), 0)
    ImageDraw.Draw(glyph).text((2 - x0, 2 - y0), char, font=font, fill=255)
    glyph = glyph.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True)
    if max(glyph.size) > limit:
        k = limit / max(glyph.size)
        glyph = glyph.resize(
            (max(1, int(glyph.width * k)), max(1, int(glyph.height * k))), Image.Resampling.LANCZOS
        )
    return glyph


def contrasting_colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(background, foreground) RGB with a luma contrast of at least 80/255."""
    bg = rng.integers(0, 256, size=3)
    fg = rng.integers(0, 256, size=3)
    for _ in range(64):
        if abs(_luma(fg) - _luma(bg)) >= _MIN_CONTRAST:
            break
        fg = rng.integers(0, 256, size=3)
    else:
        fg = np.full(3, 0 if _luma(bg) > 127.5 else 255)
    return bg, fg


def finish(
    mask: Image.Image,
    fg: np.ndarray,
    bg: np.ndarray,
    amp: int,
    rng: np.random.Generator,
    size: int,
) -> np.ndarray:
    """fg where `mask`, bg elsewhere, uniform noise of +-`amp`, then one LANCZOS shrink from the
    canvas to `size` -> uint8 [size, size, 3]."""
    canvas = mask.width
    img = Image.composite(
        Image.new("RGB", (canvas, canvas), tuple(int(v) for v in fg)),
        Image.new("RGB", (canvas, canvas), tuple(int(v) for v in bg)),
        mask,
    )
    arr = np.asarray(img, dtype=np.int16)
    if amp:
        arr = arr + rng.integers(-amp, amp + 1, size=arr.shape, dtype=np.int16)
    arr = np.clip(arr, 0, 255).astype(np.uint8)
    if size != canvas:
        arr = np.asarray(Image.fromarray(arr).resize((size, size), Image.Resampling.LANCZOS))
    return np.ascontiguousarray(arr)
