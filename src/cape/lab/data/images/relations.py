"""Two-glyph scenes whose class is WHERE things are: is the X left of, right of, above or below the
O? A task that a model without positions cannot solve.

Every scene is a function of one integer seed: the class is ``seed % 4`` (balanced), and the
seed's own random stream picks the font (one for both glyphs), the glyphs' size and rotation,
where the O stands and where the X stands from it, the colours and the noise. Both glyphs are
drawn on a large canvas and the scene is shrunk once to the requested size, so one seed is the
same scene at every resolution, as for the rendered characters.

The X is placed from the O along the class's axis, at a distance of 0.35-0.60 of the canvas,
with a sideways offset of at most 0.6 of that distance (so the class's axis always dominates:
the angle from the axis is under 31 degrees). Nothing but the layout depends on the class: the
same fonts, sizes, rotations and colour statistics occur in every class, so a model that sees
the image as a bag of patches (no positions) is at chance, 25%.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from cape.lab.data.images.glyphs import CANVAS, contrasting_colours, finish, glyph_mask

__all__ = ["RELATIONS", "render_relation", "relation_spec"]

RELATIONS = ("left", "right", "above", "below")
"""The classes: where the X is relative to the O."""
_AXES = {0: (-1.0, 0.0), 1: (1.0, 0.0), 2: (0.0, -1.0), 3: (0.0, 1.0)}  # image y grows down
_GLYPHS = ("X", "O")


def relation_spec(seed: int, fonts: Sequence[str | Path]) -> tuple[int, Path]:
    """The class (``seed % 4``) and the font (drawn from `seed`) of scene `seed`."""
    if not fonts:
        raise ValueError("fonts must not be empty")
    idx = int(np.random.default_rng([int(seed), 1]).integers(len(fonts)))
    return int(seed) % len(RELATIONS), Path(fonts[idx])


def _layout(rng: np.random.Generator, label: int, sizes: tuple[int, int], canvas: int):
    """Top-left corners of the X and the O boxes (w, h each), both inside the canvas and apart."""
    (wx, hx), (wo, ho) = sizes
    ax, ay = _AXES[label]
    margin = canvas // 50
    for _ in range(1000):
        dist = rng.uniform(0.35, 0.60) * canvas
        side = rng.uniform(-0.6, 0.6) * dist
        dx, dy = ax * dist - ay * side, ay * dist + ax * side  # along the axis, plus sideways
        ox = rng.uniform(margin + wo / 2, canvas - margin - wo / 2)
        oy = rng.uniform(margin + ho / 2, canvas - margin - ho / 2)
        cx, cy = ox + dx, oy + dy
        inside = (
            margin + wx / 2 <= cx <= canvas - margin - wx / 2
            and margin + hx / 2 <= cy <= canvas - margin - hx / 2
        )
        apart = abs(cx - ox) >= (wx + wo) / 2 or abs(cy - oy) >= (hx + ho) / 2
        if inside and apart:
            return (int(cx - wx / 2), int(cy - hx / 2)), (int(ox - wo / 2), int(oy - ho / 2))
    raise RuntimeError("no layout found for a relation scene (glyphs too large for the canvas)")


def render_relation(
    seed: int, fonts: Sequence[str | Path], size: int = 32, canvas: int = CANVAS
) -> tuple[np.ndarray, int]:
    """Scene `seed` at `size` px: (uint8 ``[size, size, 3]``, class in [0, 4): `RELATIONS`)."""
    if not isinstance(size, int) or not 1 <= size <= canvas:
        raise ValueError(f"size must be an int in [1, canvas={canvas}], got {size!r}")
    if not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    label, font = relation_spec(seed, fonts)
    rng = np.random.default_rng([int(seed), 3])
    px = int(rng.uniform(0.30, 0.40) * canvas)
    angles = rng.uniform(-20.0, 20.0, size=2)
    glyphs = [
        glyph_mask(c, font, px, float(a), canvas // 3) for c, a in zip(_GLYPHS, angles, strict=True)
    ]
    bg, fg = contrasting_colours(rng)
    amp = int(rng.integers(0, 33))
    corners = _layout(rng, label, tuple(g.size for g in glyphs), canvas)
    mask = Image.new("L", (canvas, canvas), 0)
    for glyph, corner in zip(glyphs, corners, strict=True):
        mask.paste(glyph, corner, glyph)  # the glyph's own mask: boxes may touch, strokes add up
    return finish(mask, fg, bg, amp, rng, size), label
