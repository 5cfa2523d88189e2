"""Scenes for object detection, made on the machine: a few shapes of four classes on a canvas.

A scene is a function of one integer seed (its split and data seed pick the stream): a grey
background of any level (slightly tinted), 1..`max_objects` shapes (`SHAPES`: circle, square,
triangle, cross), each in its class's colour (`COLOURS`, each channel moved by up to 24): the
class is easy to tell, finding each object and its box is the task. Each shape has a side (the
longer side of its box) drawn log-uniformly in [`min_side`, `max_side`] of the image side, a stretch
of one axis (0.75-1.33, so boxes are not all square) and a rotation (not the circle's), at a
random place whose box keeps a gap from every other box (no object hides another). Every shape
is a polygon (the circle an ellipse), so its box is exact: the extremes of its vertices. The
scene is drawn at 4x `size`, shrunk once (each pixel the mean of its 4 x 4 block), then
given uniform pixel noise.

Boxes are (x0, y0, x1, y1) in [0, 1] of the image side: the same at every size the image is
resized to, as DETR's normalised targets. `make_scenes` caches a split as one `.npz` (no
pickles), built by one process under the cache lock (`cape.lab.data.cache`) and written
atomically; a second process started at the same time waits, then reads it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from cape._checks import check_float, check_int
from cape.lab.data.cache import building, remove_leftovers, whole_npz
from cape.lab.data.settings import Settings
from cape.lab.io import atomic_write, zip_problem
from cape.lab.progress import progress

__all__ = [
    "SHAPES",
    "COLOURS",
    "SPLITS",
    "SceneSettings",
    "Scenes",
    "render_scene",
    "scene_seed",
    "make_scenes",
]

SHAPES = ("circle", "square", "triangle", "cross")
"""The classes: a label is its index here."""
COLOURS = ((220, 50, 50), (50, 170, 70), (60, 90, 230), (235, 200, 40))
"""Each class's colour (red circles, green squares, blue triangles, yellow crosses)."""
SPLITS = ("train", "val", "test")
_SUPERSAMPLE = 4  # drawn at 4x the stored size, then shrunk: smooth edges at every size
_GAP = 0.02  # the least empty space between two boxes, of the image side
_TRIES = 40  # places tried per object before it is left out
_VERSION = 2  # of the drawing: part of every cache file's name


@dataclass(frozen=True)
class SceneSettings(Settings):
    """size: px of the stored images (the largest size a study resizes them to). min_objects,
    max_objects: shapes per scene (uniform). min_side, max_side: the longer side of a box, of
    the image side (log-uniform between). noise: the largest pixel noise amplitude (of 255)."""

    size: int = 96
    min_objects: int = 1
    max_objects: int = 4
    min_side: float = 0.1
    max_side: float = 0.4
    noise: int = 24

    @staticmethod
    def check(settings: Any, prefix: str = "") -> None:
        s = settings
        check_int(f"{prefix}size", s.size, minimum=8)
        check_int(f"{prefix}min_objects", s.min_objects)
        check_int(f"{prefix}max_objects", s.max_objects)
        if s.max_objects < s.min_objects:
            raise ValueError(
                f"{prefix}max_objects must be >= {prefix}min_objects, "
                f"got {s.max_objects} < {s.min_objects}"
            )
        low = check_float(f"{prefix}min_side", s.min_side, strict=True)
        high = check_float(f"{prefix}max_side", s.max_side, strict=True)
        if not low <= high <= 0.6:
            raise ValueError(
                f"{prefix}min_side <= {prefix}max_side <= 0.6 must hold (room for several "
                f"shapes), got {low}, {high}"
            )
        check_int(f"{prefix}noise", s.noise, minimum=0)
        if s.noise > 127:
            raise ValueError(f"{prefix}noise must be in [0, 127], got {s.noise}")


@dataclass(frozen=True)
class Scenes:
    """n scenes: images uint8 [n, S, S, 3]; boxes float32 [m, 4] (x0, y0, x1, y1) in [0, 1]
    and labels int64 [m] (indices of `SHAPES`) of all objects, scene i's being rows
    offsets[i]:offsets[i + 1]; seeds int64 [n], each scene's (`render_scene`)."""

    images: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray
    seeds: np.ndarray

    def __len__(self) -> int:
        return len(self.images)

    def objects(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(boxes [k, 4], labels [k]) of scene i."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.boxes[a:b], self.labels[a:b]


def _colour(rng: np.random.Generator, label: int) -> tuple[int, int, int]:
    """The class's colour (`COLOURS`), each channel moved by up to 24."""
    jitter = rng.integers(-24, 25, size=3)
    return tuple(int(v) for v in np.clip(np.asarray(COLOURS[label]) + jitter, 0, 255))


def _outline(label: int, rng: np.random.Generator) -> np.ndarray:
    """The unit outline of a shape, stretched and rotated: vertices [k, 2] (x, y) around 0,
    scaled so that the longer side of their box is 1."""
    if label == 0:  # circle -> an axis-aligned ellipse (a rotation would change nothing else)
        t = np.linspace(0.0, 2.0 * math.pi, 64, endpoint=False)
        pts = np.stack([np.cos(t), np.sin(t)], 1)
        angle = 0.0
    elif label == 1:
        pts = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], dtype=np.float64)
        angle = rng.uniform(0.0, 0.5 * math.pi)
    elif label == 2:
        t = -0.5 * math.pi + np.arange(3) * 2.0 * math.pi / 3.0
        pts = np.stack([np.cos(t), np.sin(t)], 1)
        angle = rng.uniform(0.0, 2.0 * math.pi / 3.0)
    else:  # a plus sign, arms 0.35 wide
        a = 0.35
        pts = np.array(
            [[-a, -1], [a, -1], [a, -a], [1, -a], [1, a], [a, a],
             [a, 1], [-a, 1], [-a, a], [-1, a], [-1, -a], [-a, -a]],
            dtype=np.float64,
        )  # fmt: skip
        angle = rng.uniform(0.0, 0.5 * math.pi)
    pts = pts * np.array([rng.uniform(0.75, 1.33), 1.0])
    c, s = math.cos(angle), math.sin(angle)
    pts = pts @ np.array([[c, s], [-s, c]])
    extent = pts.max(0) - pts.min(0)
    return (pts - (pts.max(0) + pts.min(0)) / 2) / extent.max()


def _apart(box: np.ndarray, boxes: list[np.ndarray]) -> bool:
    return all(
        box[0] >= b[2] + _GAP or b[0] >= box[2] + _GAP or box[1] >= b[3] + _GAP
        or b[1] >= box[3] + _GAP
        for b in boxes
    )  # fmt: skip


def _layout(rng: np.random.Generator, s: SceneSettings) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(label, vertices [k, 2] in [0, 1], box (x0, y0, x1, y1)) of each shape of a scene."""
    wanted = int(rng.integers(s.min_objects, s.max_objects + 1))
    placed: list[tuple[int, np.ndarray, np.ndarray]] = []
    for _ in range(wanted):
        label = int(rng.integers(len(SHAPES)))
        side = math.exp(rng.uniform(math.log(s.min_side), math.log(s.max_side)))
        pts = _outline(label, rng) * side
        half = (pts.max(0) - pts.min(0)) / 2
        for _ in range(_TRIES):
            centre = rng.uniform(half + _GAP, 1.0 - half - _GAP)
            box = np.concatenate([centre - half, centre + half])
            if _apart(box, [b for _, _, b in placed]):
                placed.append((label, pts + centre, box))
                break
    return placed


def render_scene(
    seed: int | list[int], settings: SceneSettings | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scene `seed` (an int or a list of ints for `numpy.random.default_rng`) ->
    (image uint8 [S, S, 3], boxes float32 [k, 4] (x0, y0, x1, y1) in [0, 1], labels int64 [k])."""
    s = SceneSettings() if settings is None else settings
    rng = np.random.default_rng(seed)
    bg = np.clip(rng.integers(0, 256) + rng.integers(-12, 13, size=3), 0, 255)
    canvas = s.size * _SUPERSAMPLE
    img = Image.new("RGB", (canvas, canvas), tuple(int(v) for v in bg))
    draw = ImageDraw.Draw(img)
    shapes = _layout(rng, s)
    for label, pts, box in shapes:
        colour = _colour(rng, label)
        if label == 0:
            draw.ellipse([float(v) * canvas for v in box], fill=colour)
        else:
            draw.polygon([(float(x) * canvas, float(y) * canvas) for x, y in pts], fill=colour)
    arr = np.asarray(img.reduce(_SUPERSAMPLE), dtype=np.int16)  # the mean of each 4 x 4 block
    amp = int(rng.integers(0, s.noise + 1))
    if amp:
        arr = arr + rng.integers(-amp, amp + 1, size=arr.shape, dtype=np.int16)
    image = np.clip(arr, 0, 255).astype(np.uint8)
    boxes = np.array([b for _, _, b in shapes], dtype=np.float32).reshape(-1, 4)
    labels = np.array([lab for lab, _, _ in shapes], dtype=np.int64)
    return np.ascontiguousarray(image), boxes, labels


def scene_seed(split: str, index: int, seed: int) -> list[int]:
    """The rng seed of scene `index` of `split`: the splits' streams never meet."""
    return [int(seed), SPLITS.index(split), int(index)]


def _path(root: Path, split: str, count: int, seed: int, s: SceneSettings) -> Path:
    blob = json.dumps([_VERSION, split, count, seed, asdict(s)], sort_keys=True).encode()
    key = hashlib.sha1(blob).hexdigest()[:10]
    return root / f"scenes_{split}_{s.size}px_{key}.npz"


def _render_all(split: str, count: int, seed: int, s: SceneSettings) -> dict[str, np.ndarray]:
    bar = progress(range(count), total=count, desc=f"scenes {split}", unit="img")
    scenes = [render_scene(scene_seed(split, i, seed), s) for i in bar]
    images, boxes, labels = zip(*scenes, strict=True) if scenes else ((), (), ())
    offsets = np.concatenate([[0], np.cumsum([len(lab) for lab in labels])]).astype(np.int64)
    return {
        "images": np.stack(images) if count else np.zeros((0, s.size, s.size, 3), np.uint8),
        "boxes": np.concatenate(boxes) if count else np.zeros((0, 4), np.float32),
        "labels": np.concatenate(labels) if count else np.zeros(0, np.int64),
        "offsets": offsets,
        "seeds": np.arange(count, dtype=np.int64),
    }


def _read(path: Path) -> Scenes:
    with np.load(path, allow_pickle=False) as z:
        return Scenes(*(z[k] for k in ("images", "boxes", "labels", "offsets", "seeds")))


def make_scenes(
    root: str | Path,
    split: str,
    count: int,
    settings: SceneSettings | None = None,
    seed: int = 0,
) -> Scenes:
    """The `count` scenes of `split` ("train", "val", "test"; disjoint streams) for data seed
    `seed`, rendered once into `root` and read from there afterwards. The file's name carries a
    hash of everything that decides the pixels, so other settings never read a stale cache; a
    damaged file is set aside and rendered again."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    check_int("count", count, minimum=0)
    check_int("seed", seed, minimum=0)
    s = SceneSettings.resolve(settings, {})
    path = _path(Path(root), split, count, seed, s)
    if path.exists() and zip_problem(path) is None:
        return _read(path)
    with building(path):
        if not whole_npz(path):  # another process may have made it while this one waited
            remove_leftovers(path.parent, path.name)
            arrays = _render_all(split, count, seed, s)
            atomic_write(path, lambda tmp: np.savez_compressed(tmp, **arrays))
    return _read(path)
