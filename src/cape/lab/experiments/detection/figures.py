"""The detection report's picture of found boxes: a few test scenes, drawn again from their
seeds (`cape.lab.data.scenes`), with the boxes each row's model found on them (results'
"examples", the first seed) at the largest training size and at the largest size."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from cape.lab.data.scenes import COLOURS, SHAPES, SceneSettings, render_scene, scene_seed

__all__ = ["scene_images", "plot_examples"]

# a box in its class's colour (the scenes' own): a box of another colour than its object has
# the wrong class
_COLOURS = tuple("#{:02x}{:02x}{:02x}".format(*rgb) for rgb in COLOURS)


def scene_images(
    data: Mapping[str, Any], count: int, size: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The first `count` test scenes of data config `data` (results' config["data"]) at `size`
    px (bilinear from the stored size, as the model's input): (image [size, size, 3], boxes,
    labels)."""
    settings = SceneSettings(
        size=max(data["sizes"]),
        min_objects=data["min_objects"],
        max_objects=data["max_objects"],
        min_side=data["min_side"],
        max_side=data["max_side"],
        noise=data["noise"],
    )
    out = []
    for i in range(count):
        image, boxes, labels = render_scene(scene_seed("test", i, data["seed"]), settings)
        if size != settings.size:
            image = np.asarray(Image.fromarray(image).resize((size, size), Image.BILINEAR))
        out.append((image, boxes, labels))
    return out


def _draw(
    ax: Any, image: np.ndarray, found: Mapping[str, Sequence[Any]], truth: np.ndarray
) -> None:
    from matplotlib.patches import Rectangle

    side = image.shape[0]
    ax.imshow(image, interpolation="nearest")
    for x0, y0, x1, y1 in np.asarray(truth).reshape(-1, 4) * side:
        ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False,
                               edgecolor="white", linestyle=":", linewidth=1.0))  # fmt: skip
    for box, score, label in zip(found["boxes"], found["scores"], found["labels"], strict=True):
        x0, y0, x1, y1 = np.asarray(box) * side
        colour = _COLOURS[int(label) % len(_COLOURS)]
        ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False,
                               edgecolor=colour, linewidth=1.4))  # fmt: skip
        ax.text(x0, y0 - 1, f"{score:.2f}", color=colour, fontsize=5, va="bottom")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_examples(
    examples: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
    data: Mapping[str, Any],
    rows: Sequence[str],
    path: str | Path,
) -> Path:
    """A grid: one line per row of `rows` (that has examples), one column per (size, scene):
    each scene with its objects (white, dotted) and the boxes the row found (in their class's
    colour, with the score). Written atomically as PNG."""
    from cape.lab.viz.plots import _pyplot, _save

    rows = [r for r in rows if r in examples]
    sizes = sorted({int(s) for r in rows for s in examples[r]})
    count = max(len(examples[r][str(s)]) for r in rows for s in sizes)
    scenes = {s: scene_images(data, count, s) for s in sizes}
    plt = _pyplot()
    cols = len(sizes) * count
    fig, axes = plt.subplots(len(rows), cols, figsize=(1.3 * cols, 1.4 * len(rows) + 0.4),
                             squeeze=False)  # fmt: skip
    for i, row in enumerate(rows):
        for j, size in enumerate(sizes):
            for k, found in enumerate(examples[row][str(size)]):
                ax = axes[i][j * count + k]
                image, truth, _ = scenes[size][k]
                _draw(ax, image, found, truth)
                if i == 0:
                    ax.set_title(f"{size} px", fontsize=7)
        axes[i][0].set_ylabel(row, fontsize=7)
    handles = [
        plt.Line2D([], [], color=c, linewidth=2, label=name)
        for c, name in zip(_COLOURS, SHAPES, strict=True)
    ]
    fig.legend(handles=handles, loc="lower center", ncol=len(SHAPES), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return _save(fig, path)
