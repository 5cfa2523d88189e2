"""The screens of boxes: answers against a brute-force reading of the rules, splits, seeds."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from cape.lab.data.boxes import (
    NONE,
    QUESTIONS,
    WIDGETS,
    BoxDataset,
    ScreenSettings,
    answer_questions,
    content_only_accuracy,
    generate,
    majority_accuracy,
    make_splits,
)


def _brute(screen: list[tuple[int, int, int, int, int]], q: int, question: str) -> int | None:
    """The rules of the module docstring, one box at a time in plain Python. screen: (top, left,
    bottom, right, type) per real box; q: the query's index. Returns the answer, or None when
    two or more boxes fit (the generator must never emit those)."""
    qt, ql, qb, qr, _ = screen[q]
    scored = []  # (sort key, type) of every box that fits
    for i, (t, le, b, r, kind) in enumerate(screen):
        if i == q:
            continue
        if question == "above":
            if b <= qt and max(le, ql) < min(r, qr):
                scored.append(((-b,), kind))
        elif question == "left-aligned":
            if le == ql:
                scored.append(((0,), kind))
        elif question == "contains":
            if t <= qt and le <= ql and b >= qb and r >= qr:
                scored.append((((b - t) * (r - le),), kind))
        else:
            gx = max(0, le - qr, ql - r)
            gy = max(0, t - qb, qt - b)
            cx, cy = (le + r) / 2 - (ql + qr) / 2, (t + b) / 2 - (qt + qb) / 2
            scored.append(((gx**2 + gy**2, cx**2 + cy**2), kind))
    if not scored:
        return NONE
    scored.sort()
    if len(scored) > 1 and scored[0][0] == scored[1][0]:
        return None
    return scored[0][1]


def _screen(s, i):
    return [
        (*map(int, s.boxes[i, j]), int(s.types[i, j]))
        for j in range(s.mask.shape[1])
        if s.mask[i, j]
    ]


def test_generated_answers_match_brute_force():
    s = generate(400, seed=3)
    for i in range(len(s)):
        screen = _screen(s, i)
        q = int(np.flatnonzero(s.mask[i]).tolist().index(s.query[i]))
        expected = _brute(screen, q, QUESTIONS[s.question[i]])
        assert expected is not None, "an ambiguous screen was emitted"
        assert s.answer[i] == expected


def test_answer_questions_all_types_and_ambiguity_against_brute_force():
    rng = np.random.default_rng(0)
    n, size = 300, 6
    tl = rng.integers(0, 10, (n, size, 2))
    boxes = np.concatenate([tl, tl + rng.integers(1, 6, (n, size, 2))], -1)  # small grid: ties
    mask = np.arange(size)[None] < rng.integers(2, size + 1, n)[:, None]
    query = rng.integers(0, 2, n)
    types = rng.integers(0, len(WIDGETS), (n, size))
    answers, valid = answer_questions(boxes, mask, query, types)
    assert valid.all(axis=1).sum() < n  # this test does meet ambiguous screens
    for i in range(n):
        screen = [(*boxes[i, j], types[i, j]) for j in range(size) if mask[i, j]]
        for k, name in enumerate(QUESTIONS):
            expected = _brute(screen, int(query[i]), name)
            assert valid[i, k] == (expected is not None)
            if expected is not None:
                assert answers[i, k] == expected


def test_screens_are_well_formed():
    s = generate(2000, seed=1, canvas=64, min_boxes=5, max_boxes=9, max_size=16)
    real = s.boxes[s.mask]
    assert (real[:, 0] < real[:, 2]).all() and (real[:, 1] < real[:, 3]).all()
    assert real.min() >= 0 and real.max() <= 63
    # planted containers: the query grown by <= 3 grid lines (6 cells) on each side
    assert ((real[:, 2:] - real[:, :2]) <= 16 + 2 * 6).all()
    count = s.mask.sum(1)
    assert count.min() == 5 and count.max() == 9
    assert (np.sort(s.mask, axis=1)[:, ::-1] == s.mask).all()  # padding last
    assert s.mask[np.arange(len(s)), s.query].all()
    assert (s.boxes[~s.mask] == 0).all() and (s.types[~s.mask] == 0).all()
    assert set(np.unique(s.question)) == set(range(len(QUESTIONS)))
    # the query sits anywhere (the token order carries no information)
    assert len(np.unique(s.query)) == 9


def test_answers_are_balanced_and_need_positions():
    splits = make_splits(20000, 10, 4000, seed=0)
    train, test = splits["train"], splits["test_seen"]
    for q in range(len(QUESTIONS)):
        freq = np.bincount(train.answer[train.question == q], minlength=NONE + 1)
        assert freq.max() / freq.sum() < 0.4, (QUESTIONS[q], freq)
    majority = majority_accuracy(train, test)
    content = content_only_accuracy(train, test)
    assert majority < 35 and content < 45
    assert content > majority - 2  # the Bayes content-only guess beats the per-question majority


def test_content_only_predictor_is_exact_on_a_constructed_case():
    from dataclasses import replace

    s = generate(200, seed=5)
    # one widget type everywhere, only "nearest" questions (never "none"): the type is the answer
    nearest = replace(
        s, types=np.where(s.mask, 2, 0), question=np.full(len(s), 3), answer=np.full(len(s), 2)
    )
    assert content_only_accuracy(nearest, nearest) == 100.0
    assert majority_accuracy(nearest, nearest) == 100.0


def test_unseen_coordinates_never_occur_in_training():
    splits = make_splits(3000, 500, 1000, seed=7)
    seen = set()
    for name in ("train", "val", "test_seen"):
        s = splits[name]
        values = np.unique(s.boxes[s.mask])
        assert (values % 2 == 0).all()
        seen |= set(values.tolist())
    unseen = splits["test_unseen"]
    values = set(np.unique(unseen.boxes[unseen.mask]).tolist())
    assert values and not (values & seen)
    # test_unseen is test_seen moved by one cell: same screens, questions and answers
    ts = splits["test_seen"]
    assert (unseen.boxes[unseen.mask] == ts.boxes[ts.mask] + 1).all()
    for key in ("types", "mask", "query", "question", "answer"):
        assert (getattr(unseen, key) == getattr(ts, key)).all()


def test_determinism_and_prefix_stability():
    a, b = generate(300, seed=11), generate(300, seed=11)
    for key in ("boxes", "types", "mask", "query", "question", "answer"):
        assert (getattr(a, key) == getattr(b, key)).all()
    c = generate(5000, seed=11)
    assert (c.boxes[:300] == a.boxes).all() and (c.answer[:300] == a.answer).all()
    d = generate(300, seed=12)
    assert not (d.boxes == a.boxes).all()
    splits = make_splits(100, 100, 100, seed=0)
    assert not (splits["train"].boxes == splits["val"].boxes).all()


def test_generation_is_fast():
    start = time.perf_counter()
    s = generate(100_000, seed=0)
    assert len(s) == 100_000
    assert time.perf_counter() - start < 20  # seconds, on a loaded 2-core machine


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"canvas": 63}, "canvas"),
        ({"max_size": 7}, "max_size"),
        ({"parity": 2}, "parity"),
        ({"min_boxes": 1}, "min_boxes"),
        ({"max_boxes": 3}, "max_boxes"),
        ({"plant": 1.5}, "plant"),
        ({"max_size": 70}, "max_size"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, word):
    with pytest.raises((ValueError, TypeError), match=word):
        generate(10, seed=0, **kwargs)


def test_dataset_collates_batches():
    s = generate(50, seed=2, canvas=32, max_size=8)
    ds = BoxDataset(s)
    assert len(ds) == 50 and ds[7] == 7
    batch = ds.collate([3, 1, 4])
    assert batch["positions"].shape == (3, 9, 4) and batch["positions"].dtype == torch.float32
    expected = torch.from_numpy(s.boxes[[3, 1, 4]] / 31.0).float()
    torch.testing.assert_close(batch["positions"], expected)
    assert 0.0 <= float(batch["positions"].min()) and float(batch["positions"].max()) <= 1.0
    assert batch["mask"].dtype == torch.bool
    assert batch["answer"].tolist() == s.answer[[3, 1, 4]].tolist()


def test_settings_object_matches_the_keywords():
    settings = ScreenSettings(canvas=32, max_size=8, plant=0.3)
    a = generate(300, seed=9, settings=settings)
    b = generate(300, seed=9, canvas=32, max_size=8, plant=0.3)
    assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.answer, b.answer)
    split = make_splits(50, 10, 20, seed=1, settings=settings)["test_unseen"]
    assert split.canvas == 32 and np.array_equal(
        split.boxes,
        make_splits(50, 10, 20, seed=1, canvas=32, max_size=8, plant=0.3)["test_unseen"].boxes,
    )
    with pytest.raises(ValueError, match="max_size"):
        ScreenSettings(max_size=7)
    with pytest.raises(TypeError, match="settings"):
        generate(10, seed=0, settings={"canvas": 32})
