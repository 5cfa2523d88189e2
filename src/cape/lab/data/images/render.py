"""Offline character images (0-9 A-Z) rendered with Pillow from Debian fonts.

Every sample is a function of one integer seed: the seed picks the class (``seed % 36``), the font,
and, through its own random stream, the font size, rotation, offset, colours and noise. The
character is drawn on a large canvas (`CANVAS` px) with its noise, and only then shrunk to the
requested size with Pillow's LANCZOS filter, so one seed is the same object at every resolution.

Caches are compressed ``.npz`` files (no pickles), written atomically in shards so an interrupted
run resumes where it stopped. One process renders a cache file at a time (`cape.lab.data.cache`:
a lock beside it); others started at the same time wait for it and read what it wrote:

- ``make_split``: images uint8 ``[N, S, S, 3]``, labels int64 ``[N]``, seeds int64 ``[N]``;
- ``make_native_sizes``: images of their own random sizes, stored as one flat uint8 buffer
  ``pixels`` with ``offsets`` int64 ``[N + 1]`` and ``sizes`` int64 ``[N]`` (image i is
  ``pixels[offsets[i]:offsets[i + 1]].reshape(sizes[i], sizes[i], 3)``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from cape.lab.data.cache import building, fork_context, remove_leftovers, whole_npz
from cape.lab.data.images.fonts import CHARSET, FontSplit, font_split
from cape.lab.data.images.glyphs import CANVAS, contrasting_colours, finish, glyph_mask
from cape.lab.data.images.relations import render_relation
from cape.lab.io import atomic_write, zip_problem
from cape.lab.progress import progress

__all__ = [
    "CANVAS",
    "SPLITS",
    "TASKS",
    "load_native_sizes",
    "load_split",
    "make_native_sizes",
    "make_split",
    "render_char",
    "render_sample",
    "sample_spec",
    "split_seeds",
]

SPLITS = ("train", "val", "test", "test_fonts")
TASKS = ("chars", "relations")
_SEED_GROUPS = {"train": 0, "val": 1, "test": 2, "test_fonts": 3, "native": 4}
_SEED_STRIDE = 1 << 40  # seeds of one (split, seed) pair: [base, base + 2**40)
_MAX_SEED = 1 << 19
_CACHE_VERSION = 1


# ----------------------------------------------------------------------------------- rendering


def render_char(
    char: str, font_path: str | Path, seed: int, size: int = 32, canvas: int = CANVAS
) -> np.ndarray:
    """Draw `char` with the font at `font_path`: uint8 ``[size, size, 3]``.

    The font size, rotation (+-20 degrees), offset, colours (luma contrast >= 80/255) and pixel
    noise come from `seed` only; all is drawn on a `canvas` px square and shrunk to `size` at the
    end (LANCZOS), so one seed gives the same object at every `size`.
    """
    if not isinstance(char, str) or len(char) != 1:
        raise ValueError(f"char must be one character, got {char!r}")
    if not isinstance(size, int) or not 1 <= size <= canvas:
        raise ValueError(f"size must be an int in [1, canvas={canvas}], got {size!r}")
    if not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    rng = np.random.default_rng(int(seed))
    px = int(rng.uniform(0.45, 0.75) * canvas)
    angle = float(rng.uniform(-20.0, 20.0))
    fx, fy = rng.uniform(0.0, 1.0, size=2)
    bg, fg = contrasting_colours(rng)
    amp = int(rng.integers(0, 33))
    glyph = glyph_mask(char, font_path, px, angle, int(canvas * 0.96))
    margin = canvas // 50
    room_x = max(canvas - 2 * margin - glyph.width, 0)
    room_y = max(canvas - 2 * margin - glyph.height, 0)
    mask = Image.new("L", (canvas, canvas), 0)
    mask.paste(glyph, (margin + int(fx * room_x), margin + int(fy * room_y)))
    return finish(mask, fg, bg, amp, rng, size)


def sample_spec(seed: int, fonts: Sequence[str | Path]) -> tuple[int, Path]:
    """The class (``seed % 36``) and the font (drawn from `seed`) of sample `seed`."""
    if not fonts:
        raise ValueError("fonts must not be empty")
    idx = int(np.random.default_rng([int(seed), 1]).integers(len(fonts)))
    return int(seed) % len(CHARSET), Path(fonts[idx])


def _native_size(seed: int, low: int, high: int) -> int:
    return int(np.random.default_rng([int(seed), 2]).integers(low, high + 1))


def render_sample(seed: int, fonts: Sequence[str | Path], size: int = 32) -> tuple[np.ndarray, int]:
    """Sample `seed` at `size` px: (uint8 ``[size, size, 3]``, label in [0, 36))."""
    label, font = sample_spec(seed, fonts)
    return render_char(CHARSET[label], font, int(seed), size), label


def split_seeds(split: str, count: int, seed: int = 0) -> np.ndarray:
    """The `count` sample seeds of `split`: int64, disjoint between splits and between `seed`s."""
    if split not in _SEED_GROUPS:
        raise ValueError(f"split must be one of {sorted(_SEED_GROUPS)}, got {split!r}")
    if not isinstance(count, int) or not 0 <= count < _SEED_STRIDE:
        raise ValueError(f"count must be an int in [0, 2**40), got {count!r}")
    if not isinstance(seed, int) or not 0 <= seed < _MAX_SEED:
        raise ValueError(f"seed must be an int in [0, 2**19), got {seed!r}")
    base = (seed * len(_SEED_GROUPS) + _SEED_GROUPS[split]) * _SEED_STRIDE
    return base + np.arange(count, dtype=np.int64)


# ------------------------------------------------------------------------------------- caching


def _fonts_for(split: str, fonts: FontSplit | Sequence[str | Path] | None) -> list[Path]:
    if fonts is None:
        fonts = font_split()
    if isinstance(fonts, FontSplit):
        chosen = fonts.held_out if split == "test_fonts" else fonts.train
    else:
        chosen = tuple(fonts)
    if not chosen:
        raise ValueError(f"no fonts for split {split!r}")
    return [Path(p) for p in chosen]


def _cache_key(*parts: object) -> str:
    blob = json.dumps([_CACHE_VERSION, CANVAS, *parts], default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:10]


def _savez(path: Path, **arrays: np.ndarray) -> None:
    # atomic_write's temporary name keeps the .npz suffix, so numpy writes exactly there
    atomic_write(path, lambda tmp: np.savez_compressed(tmp, **arrays))


def _render_shard(
    seeds: np.ndarray,
    fonts: list[str],
    size: int | None,
    low: int,
    high: int,
    out: str,
    task: str = "chars",
) -> int:
    render = render_relation if task == "relations" else render_sample
    rendered = [render(s, fonts, size or _native_size(s, low, high)) for s in seeds.tolist()]
    images = [image for image, _ in rendered]
    labels_arr = np.asarray([label for _, label in rendered], dtype=np.int64)
    seeds_arr = np.asarray(seeds, dtype=np.int64)
    if size is not None:
        stack = np.stack(images) if images else np.zeros((0, size, size, 3), np.uint8)
        _savez(Path(out), images=stack, labels=labels_arr, seeds=seeds_arr)
    else:
        sizes = np.asarray([im.shape[0] for im in images], dtype=np.int64)
        pixels = (
            np.concatenate([im.reshape(-1) for im in images]) if images else np.zeros(0, np.uint8)
        )
        _savez(Path(out), pixels=pixels, sizes=sizes, labels=labels_arr, seeds=seeds_arr)
    return len(seeds)


def _generate(
    path: Path,
    seeds: np.ndarray,
    fonts: list[Path],
    size: int | None,
    low: int,
    high: int,
    shard_size: int,
    workers: int | None,
    keep_shards: bool,
    desc: str,
    task: str = "chars",
) -> Path:
    """`path`, rendered unless whole on disk: by one process at a time (the others wait on the
    lock beside it, then read it), through shards that a killed run leaves to resume from."""
    if not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard_size must be a positive int, got {shard_size!r}")
    workers = min(2, os.cpu_count() or 1) if workers is None else workers
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    shard_dir = path.with_name(path.stem + ".shards")
    whole = path.exists() and zip_problem(path) is None
    if whole and (keep_shards or not shard_dir.exists()):
        return path  # made before: read it without waiting for any lock
    with building(path):
        if not whole_npz(path):  # a damaged file is set aside (only the lock's holder does that)
            remove_leftovers(path.parent, path.name)
            shards = _shard_jobs(shard_dir, seeds, shard_size)
            _render_shards(shards, fonts, size, low, high, workers, desc, task)
            _merge_shards(path, shards, size)
        if not keep_shards:  # also what a builder killed after its merge left behind
            shutil.rmtree(shard_dir, ignore_errors=True)
    return path


def _shard_jobs(
    shard_dir: Path, seeds: np.ndarray, shard_size: int
) -> list[tuple[Path, np.ndarray]]:
    """(shard path, seeds) of every shard; the folder made, a killed writer's temporaries gone."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    remove_leftovers(shard_dir)
    return [
        (shard_dir / f"shard_{k:05d}.npz", seeds[start : start + shard_size])
        for k, start in enumerate(range(0, max(len(seeds), 1), shard_size))
    ]


def _render_shards(
    jobs: list[tuple[Path, np.ndarray]],
    fonts: list[Path],
    size: int | None,
    low: int,
    high: int,
    workers: int,
    desc: str,
    task: str,
) -> None:
    """Render the shards of `jobs` that are not whole on disk (the others are kept)."""
    font_strs = [str(p) for p in fonts]
    todo = [(p, s) for p, s in jobs if not whole_npz(p)]
    total = sum(len(s) for _, s in jobs)
    bar = progress(total=total, desc=desc, unit="img")
    bar.update(total - sum(len(s) for _, s in todo))
    with bar:
        if workers == 1 or len(todo) <= 1:
            for p, s in todo:
                bar.update(_render_shard(s, font_strs, size, low, high, str(p), task))
        else:
            with ProcessPoolExecutor(min(workers, len(todo)), mp_context=fork_context()) as ex:
                futures = [
                    ex.submit(_render_shard, s, font_strs, size, low, high, str(p), task)
                    for p, s in todo
                ]
                for f in futures:
                    bar.update(f.result())


def _merge_shards(path: Path, jobs: list[tuple[Path, np.ndarray]], size: int | None) -> None:
    """Write the shards of `jobs`, concatenated, atomically to `path`."""
    parts = []
    for p, _ in jobs:
        with np.load(p, allow_pickle=False) as z:
            parts.append({k: z[k] for k in z.files})
    merged = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
    if size is None:
        nbytes = 3 * merged["sizes"] ** 2
        merged["offsets"] = np.concatenate([[0], np.cumsum(nbytes)]).astype(np.int64)
    _savez(path, **merged)


def make_split(
    root: str | Path,
    split: str,
    count: int,
    size: int = 32,
    seed: int = 0,
    fonts: FontSplit | Sequence[str | Path] | None = None,
    *,
    shard_size: int = 1000,
    workers: int | None = None,
    keep_shards: bool = False,
    task: str = "chars",
) -> Path:
    """Render (or find cached) `count` images of `split` at `size` px; returns the ``.npz`` path.

    `task`: "chars" (one character, 36 classes: `render_sample`) or "relations" (an X and an O,
    4 classes: where the X is, `cape.lab.data.images.relations`). `split`: "train", "val",
    "test" (train fonts) or "test_fonts" (held-out fonts); the splits draw from disjoint seed
    ranges (`split_seeds`). `fonts`: a `FontSplit` (default `font_split()`) or a list of font
    files used as given. The file holds images uint8 ``[N, S, S, 3]``, labels int64 ``[N]``,
    seeds int64 ``[N]``; its name carries a hash of everything that determines the pixels, so a
    changed request never reads a stale cache. Shards of `shard_size` images are written
    atomically and reused, so a killed run resumes; `workers` processes (default min(2, CPUs))
    render shards, with results independent of it.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(size, int) or not 1 <= size <= CANVAS:
        raise ValueError(f"size must be an int in [1, {CANVAS}], got {size!r}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    seeds = split_seeds(split, count, seed)
    chosen = _fonts_for(split, fonts)
    fonts_key = [str(p) for p in chosen]
    # the default task adds nothing to the key, so character caches made without one are valid
    parts = ("split", split, count, seed, fonts_key) + (() if task == "chars" else (task,))
    path = Path(root) / f"{task}_{split}_{size}px_{_cache_key(*parts)}.npz"
    return _generate(
        path,
        seeds,
        chosen,
        size,
        0,
        0,
        shard_size,
        workers,
        keep_shards,
        f"{task} {split} {size}px",
        task,
    )


def load_split(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(images uint8 ``[N, S, S, 3]``, labels int64 ``[N]``, seeds int64 ``[N]``) of a split
    file."""
    with np.load(path, allow_pickle=False) as z:
        return z["images"], z["labels"], z["seeds"]


def make_native_sizes(
    root: str | Path,
    count: int,
    seed: int = 0,
    low: int = 12,
    high: int = 128,
    fonts: FontSplit | Sequence[str | Path] | None = None,
    *,
    shard_size: int = 1000,
    workers: int | None = None,
    keep_shards: bool = False,
) -> Path:
    """Render (or find cached) `count` test images, each at its own size in [low, high] px.

    Seeds are disjoint from every split's; fonts are the train fonts of a `FontSplit` (default
    `font_split()`) or the given list. Stored without pickles as a flat uint8 buffer ``pixels``,
    ``offsets`` int64 ``[N + 1]``, ``sizes``, ``labels``, ``seeds`` int64 ``[N]``; read it
    back with `load_native_sizes`.
    """
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high <= CANVAS):
        raise ValueError(f"need ints 1 <= low <= high <= {CANVAS}, got low={low!r}, high={high!r}")
    seeds = split_seeds("native", count, seed)
    chosen = _fonts_for("native", fonts)
    key = _cache_key("native", count, seed, low, high, [str(p) for p in chosen])
    path = Path(root) / f"chars_native_{low}-{high}px_{key}.npz"
    return _generate(
        path, seeds, chosen, None, low, high, shard_size, workers, keep_shards, "native sizes"
    )


def load_native_sizes(path: str | Path) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """(images: list of uint8 ``[s_i, s_i, 3]``, labels int64 ``[N]``, seeds int64 ``[N]``)."""
    with np.load(path, allow_pickle=False) as z:
        pixels, offsets, sizes = z["pixels"], z["offsets"], z["sizes"]
        labels, seeds = z["labels"], z["seeds"]
    images = [
        pixels[offsets[i] : offsets[i + 1]].reshape(int(s), int(s), 3) for i, s in enumerate(sizes)
    ]
    return images, labels, seeds
