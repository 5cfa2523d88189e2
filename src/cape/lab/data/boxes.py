"""Procedural "screens" of boxes: the LFF paper's sparse spatial structures (sec. 4.4) offline.

A screen is a set of N boxes (N in [min_boxes, max_boxes]) on an integer canvas, each box
(top, left, bottom, right) edge coordinates (top < bottom, left < right, values in
[0, canvas - 1]) with a widget type among `WIDGETS`. One box is the query; a question asks for
the widget type of the box in one spatial relation to it, or "none" (`NONE`):

- above:        of the boxes wholly above the query (bottom <= query top) that overlap it
                horizontally, the lowest (largest bottom);
- left-aligned: the box whose left edge equals the query's;
- contains:     of the boxes containing the query (shared edges count), the smallest (area);
- nearest:      the box at the smallest gap distance dx^2 + dy^2 (dx, dy: the empty space
                between the boxes, 0 where they overlap), ties broken by the squared distance
                between the centres.

Well-defined answers: a screen whose rule still leaves two or more boxes is dropped and drawn
again (whatever their types), so every answer is a function of the set of boxes. Content alone
cannot give it: widget types are drawn independently of the geometry, so without positions the
best guess is the commonest type on the screen or "none" (`content_only_accuracy`, the exact
Bayes-optimal content-only predictor; `majority_accuracy`). "above", "left-aligned" and
"contains" are each answered by a planted box with probability `plant`, else by chance.

Seen and unseen coordinates. Screens are drawn on a grid of canvas/2 lines and mapped to
coordinates 2 g + parity: train, val and test_seen use parity 0 (even values only),
test_unseen parity 1 (odd values only), so no coordinate value of test_unseen occurs in
training. Why interleaved values rather than a held-out region of the canvas: (1) it is the
paper's situation (its Figure 4: unseen values lie between frequent ones, inside the range);
(2) a held-out region tests extrapolation, which every encoding does badly and which CAPE's own
experiments cover; (3) every relation is invariant under translation, and test_unseen is
drawn from test_seen's seed: it is test_seen moved by one cell, with the same questions and
answers, so any gap between the two is due to the coordinate values alone.

Everything is vectorised numpy and deterministic by seed: candidates are drawn in chunks of a
fixed size, so the first n screens of a stream do not depend on how many are asked for.
100k screens take well under a second; nothing is cached.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from cape._checks import check_float, check_int
from cape.lab.data.settings import Settings

__all__ = [
    "WIDGETS",
    "QUESTIONS",
    "NONE",
    "SPLITS",
    "Screens",
    "ScreenSettings",
    "answer_questions",
    "generate",
    "make_splits",
    "majority_accuracy",
    "content_only_accuracy",
    "BoxDataset",
]

WIDGETS = ("button", "icon", "text", "image", "checkbox", "switch", "input", "slider")
QUESTIONS = ("above", "left-aligned", "contains", "nearest")
NONE = len(WIDGETS)  # the answer index of "none"; answers take NONE + 1 values
SPLITS = ("train", "val", "test_seen", "test_unseen")
_ABOVE, _ALIGNED, _CONTAINS, _NEAREST = range(4)
_CHUNK = 4096  # candidates per draw: fixed, so that streams are prefix-stable


@dataclass(frozen=True)
class Screens:
    """n screens padded to N = max_boxes boxes.

    boxes: [n, N, 4] int64 (top, left, bottom, right), 0 at padding. types: [n, N] int64
    widget types, 0 at padding. mask: [n, N] bool, True at real boxes. query: [n] index of the
    query box. question: [n] index into `QUESTIONS`. answer: [n] widget type or `NONE`.
    """

    boxes: np.ndarray
    types: np.ndarray
    mask: np.ndarray
    query: np.ndarray
    question: np.ndarray
    answer: np.ndarray
    canvas: int

    def __len__(self) -> int:
        return len(self.answer)

    def positions(self) -> np.ndarray:
        """[n, N, 4] float32 coordinates / (canvas - 1), in [0, 1]; 0 at padding."""
        return (self.boxes / (self.canvas - 1)).astype(np.float32)


def _pick(cand: np.ndarray, *keys: np.ndarray) -> np.ndarray:
    """Keep, per row, the candidates with the smallest keys (lexicographic). cand: [B, N]."""
    for key in keys:
        big = np.inf if np.issubdtype(key.dtype, np.floating) else np.iinfo(key.dtype).max
        best = np.where(cand, key, big).min(axis=1, keepdims=True)
        cand = cand & (key == best)
    return cand


def answer_questions(
    boxes: np.ndarray, mask: np.ndarray, query: np.ndarray, types: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The answer to every question for every screen (module docstring for the rules).

    boxes: [B, N, 4] coordinates (ints; floats work too, e.g. augmented positions),
    mask: [B, N] bool, query: [B], types: [B, N] ->
    (answers [B, 4] int64: widget type or NONE, valid [B, 4] bool: at most one box fits)."""
    boxes = np.asarray(boxes)
    rows, types = np.arange(len(query)), np.asarray(types)
    top, left, bot, right = (boxes[..., k] for k in range(4))
    qt, ql, qb, qr = (boxes[rows, query, k][:, None] for k in range(4))
    other = np.asarray(mask, bool).copy()
    other[rows, query] = False
    zero = np.zeros_like(top)
    dx = np.maximum(np.maximum(left - qr, ql - right), 0)
    dy = np.maximum(np.maximum(top - qb, qt - bot), 0)
    centre = (top + bot - qt - qb) ** 2 + (left + right - ql - qr) ** 2  # (2 x centre dist.)^2
    chosen = [
        _pick(other & (bot <= qt) & (left < qr) & (ql < right), -bot),
        _pick(other & (left == ql), zero),
        _pick(
            other & (top <= qt) & (left <= ql) & (bot >= qb) & (right >= qr),
            (bot - top) * (right - left),
        ),
        _pick(other, dx * dx + dy * dy, centre),
    ]
    answers, valid = [], []
    for cand in chosen:
        count = cand.sum(axis=1)
        answers.append(np.where(count == 0, NONE, types[rows, cand.argmax(axis=1)]))
        valid.append(count <= 1)
    return np.stack(answers, 1).astype(np.int64), np.stack(valid, 1)


def _uniform_int(rng: np.random.Generator, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Integers uniform in [low, high] elementwise (high >= low)."""
    return low + np.floor(rng.random(np.shape(low)) * (high - low + 1)).astype(np.int64)


def _draw(
    rng: np.random.Generator,
    n: int,
    grid: int,
    min_boxes: int,
    max_boxes: int,
    max_size: int,
    plant: float,
) -> dict[str, np.ndarray]:
    """n candidate screens in grid units (query = box 0, planted target = box 1)."""
    size = (n, max_boxes)
    count = rng.integers(min_boxes, max_boxes + 1, n)
    mask = np.arange(max_boxes)[None] < count[:, None]
    h = rng.integers(1, max_size + 1, size)
    w = rng.integers(1, max_size + 1, size)
    top = _uniform_int(rng, np.zeros(size, np.int64), grid - 1 - h)
    left = _uniform_int(rng, np.zeros(size, np.int64), grid - 1 - w)
    bottom, right = top + h, left + w
    types = rng.integers(0, len(WIDGETS), size)
    question = rng.integers(0, len(QUESTIONS), n)
    planted = rng.random(n) < plant
    gap = rng.integers(0, 3, n)
    margins = rng.integers(1, 4, (n, 4))
    offset = rng.random(n)
    qt, ql, qb, qr = top[:, 0], left[:, 0], bottom[:, 0], right[:, 0]
    h1, w1 = h[:, 1], w[:, 1]
    # above: box 1 ends 0-2 lines above the query and overlaps it horizontally
    b1 = qt - gap
    lo = ql - w1 + 1
    l1 = np.clip(lo + np.floor(offset * (qr - 1 - lo + 1)).astype(np.int64), 0, grid - 2)
    above = (question == _ABOVE) & planted & (b1 >= 1)
    new = {
        "above": (np.maximum(b1 - h1, 0), l1, b1, np.minimum(l1 + w1, grid - 1), above),
        "aligned": (
            top[:, 1],
            ql,
            bottom[:, 1],
            np.minimum(ql + w1, grid - 1),
            (question == _ALIGNED) & planted,
        ),
        "contains": (
            np.maximum(qt - margins[:, 0], 0),
            np.maximum(ql - margins[:, 1], 0),
            np.minimum(qb + margins[:, 2], grid - 1),
            np.minimum(qr + margins[:, 3], grid - 1),
            (question == _CONTAINS) & planted,
        ),
    }
    edges = [top, left, bottom, right]
    for *values, where in new.values():
        for edge, value in zip(edges, values, strict=True):
            edge[:, 1] = np.where(where, value, edge[:, 1])
    boxes = np.stack(edges, -1) * mask[..., None]
    return {"boxes": boxes, "types": types * mask, "mask": mask, "question": question}


@dataclass(frozen=True)
class ScreenSettings(Settings):
    """How screens are drawn. canvas: even, coordinates in [0, canvas - 1]; min_boxes to
    max_boxes boxes per screen; max_size: the largest box side in cells (even, the grid has
    canvas/2 lines); plant: probability that "above", "left-aligned" and "contains" questions
    get a planted answer box."""

    canvas: int = 64
    min_boxes: int = 5
    max_boxes: int = 9
    max_size: int = 16
    plant: float = 0.7

    @staticmethod
    def check(settings: Any, prefix: str = "") -> None:
        """Check the screen fields of `settings` (this class, or a config with fields of the
        same names: the LFF boxes `DataConfig`); `prefix` starts each name in the messages."""
        canvas, max_size, plant = settings.canvas, settings.max_size, settings.plant
        check_int(f"{prefix}canvas", canvas, minimum=8)
        if canvas % 2:
            raise ValueError(
                f"{prefix}canvas must be even (coordinates 2 g + parity), got {canvas}"
            )
        min_boxes = check_int(f"{prefix}min_boxes", settings.min_boxes, minimum=2)
        check_int(f"{prefix}max_boxes", settings.max_boxes, minimum=min_boxes)
        check_int(f"{prefix}max_size", max_size, minimum=2)
        if max_size % 2 or max_size > canvas - 2:
            raise ValueError(
                f"{prefix}max_size must be even and <= {prefix}canvas - 2 = {canvas - 2}, "
                f"got {max_size}"
            )
        if not 0.0 <= check_float(f"{prefix}plant", plant) <= 1.0:
            raise ValueError(f"{prefix}plant must lie in [0, 1], got {plant}")


def generate(
    n: int,
    *,
    seed: int,
    parity: int = 0,
    settings: ScreenSettings | None = None,
    **overrides: Any,
) -> Screens:
    """n screens, deterministic by `seed` (the same seed with parity 1 gives the same screens
    moved by one cell). settings: how they are drawn (None = `ScreenSettings()`); keywords named
    like its fields (canvas=32, plant=0.5, ...) override them."""
    check_int("n", n, minimum=0)
    check_int("seed", seed, minimum=0)
    if parity not in (0, 1):
        raise ValueError(f"parity must be 0 (even coordinates) or 1 (odd), got {parity!r}")
    s = ScreenSettings.resolve(settings, overrides)
    canvas, min_boxes, max_boxes, max_size, plant = astuple(s)
    grid = canvas // 2
    rng = np.random.default_rng(seed)
    parts: list[dict[str, np.ndarray]] = []
    kept = 0
    while kept < n:
        c = _draw(rng, _CHUNK, grid, min_boxes, max_boxes, max_size // 2, plant)
        query = np.zeros(_CHUNK, np.int64)
        answers, valid = answer_questions(c["boxes"], c["mask"], query, c["types"])
        rows = np.arange(_CHUNK)
        keep = valid[rows, c["question"]]
        c["answer"] = answers[rows, c["question"]]
        # shuffle the boxes of each screen (padding stays last); the query moves with them
        keys = np.where(c["mask"], rng.random(c["mask"].shape), 2.0)
        order = np.argsort(keys, axis=1, kind="stable")
        for k in ("boxes", "types", "mask"):
            c[k] = np.take_along_axis(c[k], order[..., None] if k == "boxes" else order, 1)
        c["query"] = np.argmax(order == 0, axis=1)
        parts.append({k: v[keep] for k, v in c.items()})
        kept += int(keep.sum())
    out = {k: np.concatenate([p[k] for p in parts])[:n] for k in parts[0]}
    coords = np.where(out["mask"][..., None], 2 * out["boxes"] + parity, 0)
    return Screens(
        coords.astype(np.int64),
        out["types"].astype(np.int64),
        out["mask"],
        out["query"].astype(np.int64),
        out["question"].astype(np.int64),
        out["answer"].astype(np.int64),
        canvas,
    )


def make_splits(
    train: int,
    val: int,
    test: int,
    *,
    seed: int = 0,
    settings: ScreenSettings | None = None,
    **overrides: Any,
) -> dict[str, Screens]:
    """train, val, test_seen (even coordinates, independent streams of `seed`) and test_unseen
    (test_seen's screens moved by one cell: odd coordinates). The settings and keywords are
    `generate`'s."""
    s = ScreenSettings.resolve(settings, overrides)
    streams = [int(v) for v in np.random.SeedSequence(seed).generate_state(3)]
    return {
        "train": generate(train, seed=streams[0], settings=s),
        "val": generate(val, seed=streams[1], settings=s),
        "test_seen": generate(test, seed=streams[2], settings=s),
        "test_unseen": generate(test, seed=streams[2], parity=1, settings=s),
    }


def majority_accuracy(train: Screens, test: Screens) -> float:
    """Accuracy (%) on `test` of answering each question type with its commonest train answer."""
    correct = 0
    for q in range(len(QUESTIONS)):
        answers = train.answer[train.question == q]
        if len(answers):
            guess = np.bincount(answers, minlength=NONE + 1).argmax()
            correct += int((test.answer[test.question == q] == guess).sum())
    return 100.0 * correct / max(len(test), 1)


def content_only_accuracy(train: Screens, test: Screens) -> float:
    """Accuracy (%) on `test` of the Bayes-optimal predictor that sees the question, the number
    of boxes and their widget types but no position: the target is any non-query box with equal
    chance (types are independent of geometry), so it answers the commonest non-query type, or
    "none" when P(none | question, N) (estimated on `train`) is larger."""

    def counts(s: Screens) -> tuple[np.ndarray, np.ndarray]:
        others = s.mask.copy()
        others[np.arange(len(s)), s.query] = False
        onehot = np.eye(len(WIDGETS), dtype=np.int64)[s.types] * others[..., None]
        return onehot.sum(1), others.sum(1)

    max_boxes = train.mask.shape[1]
    none = np.zeros((len(QUESTIONS), max_boxes + 1))
    _, k_train = counts(train)
    for q in range(len(QUESTIONS)):
        for k in range(max_boxes + 1):
            sel = (train.question == q) & (k_train == k)
            none[q, k] = (train.answer[sel] == NONE).mean() if sel.any() else 0.0
    c, k = counts(test)
    p_none = none[test.question, np.minimum(k, max_boxes)]
    p_type = (1.0 - p_none) * c.max(1) / np.maximum(k, 1)
    guess = np.where(p_none > p_type, NONE, c.argmax(1))
    return 100.0 * float((guess == test.answer).mean()) if len(test) else float("nan")


class BoxDataset(Dataset):
    """Screens as tensors for `cape.lab.train.Trainer`: items are indices, `collate` slices a batch.

    collate(indices) -> {"positions": [B, N, 4] float32 in [0, 1], "types": [B, N],
    "mask": [B, N] bool, "query": [B], "question": [B], "answer": [B]}."""

    def __init__(self, screens: Screens) -> None:
        self.tensors = {"positions": torch.from_numpy(screens.positions())}
        for key in ("types", "mask", "query", "question", "answer"):
            self.tensors[key] = torch.from_numpy(getattr(screens, key))

    def __len__(self) -> int:
        return len(self.tensors["answer"])

    def __getitem__(self, index: int) -> int:
        return index

    def collate(self, indices: list[int]) -> dict[str, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return {k: v[idx] for k, v in self.tensors.items()}
