"""Case generators of the contract suite for the augmentations of `cape.position_sampling`
(randomized positions, PoSE, random float sampling): each class built with drawn options (now
and then a refused one), called on drawn positions, or its `pair` (`cape.PositionAugmentation`'s)
called on a drawn source and target, as CAPE's `Augmentation` is in _contract_api.py. Each takes
a `Draw` and returns a `Call` (see _contract.py)."""

from __future__ import annotations

import functools
import math

import torch
from _contract import Call, Draw, expect

import cape

NAN, INF = math.nan, math.inf
FLOATS_ALL = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
BAD_LENGTH = (0, -3, 2.5, True, "8", None)
BAD_REAL = (0.0, -1.0, NAN, INF, "1", True)


def _options(d: Draw, which: str) -> tuple[type, dict]:
    """The class `which` and drawn constructor options (valid, edges, or one refused)."""
    if which == "randomized":
        opts = {"max_length": d.bad("max_length", d.choice((1, 6, 64, 10**6)), BAD_LENGTH)}
        if d.coin(0.4):
            opts["spacing"] = d.bad("spacing", d.choice((1.0, 0.01, 1e30)), BAD_REAL)
        return cape.RandomizedPositions, opts
    if which == "pose":
        opts = {"target_length": d.bad("target_length", d.choice((1, 6, 64, 10**6)), BAD_LENGTH)}
        if d.coin(0.4):
            opts["chunks"] = d.bad("chunks", d.choice((2, 3, 5)), (1, 0, 2.0, "2"))
        if d.coin(0.3):
            opts["spacing"] = d.bad("spacing", d.choice((1.0, 0.02, 1e30)), BAD_REAL)
        return cape.PoSE, opts
    length = d.bad("train_length", d.choice((1.0, 6.0, 1e3, 1e37)), BAD_REAL)
    return cape.RandomFloatPositions, {"train_length": length}


def _call_options(d: Draw) -> dict:
    kw: dict = {"training": d.bad("training", d.coin(0.7), ("yes", None))}
    if d.coin(0.3):
        kw["generator"] = d.bad("generator", torch.Generator().manual_seed(0), ("gen", 3))
    return kw


def sampled_positions(d: Draw, which: str) -> Call:
    """One of the classes called on positions [B, T, M] (M = 1 mostly: 2 is refused)."""
    cls, opts = _options(d, which)
    b, t = d.dims(2, hi=8)
    m = d.choice((1, 1, 1, 2))
    if m == 2:
        d.invalid.append("M = 2")  # they sample 1-D positions
    pos = d.tensor("positions", (b, t, m), kind=d.choice(("index", "pos")), dtypes=FLOATS_ALL)
    mask = d.mask("mask", (b, t)) if d.coin(0.4) else None
    kw = _call_options(d)

    def fn() -> torch.Tensor:
        return cls(**opts)(pos, mask, **kw)

    return d.finish(
        f"cape.{cls.__name__}",
        fn,
        ("positions", "mask", *opts, *kw),
        lambda out: expect(out, (b, t, m), torch.float32),
    )


def sampled_pair(d: Draw, which: str) -> Call:
    """`pair` (the base class's: each side drawn in turn) on a source and a target."""
    cls, opts = _options(d, which)
    b, s, t = d.dims(3, hi=6)
    src = d.tensor("source", (b, s, 1), kind="index")
    tgt = d.tensor("target", (b, t, 1), kind="index")
    kw = _call_options(d)
    if d.coin(0.4):
        kw["source_mask"] = d.mask("source_mask", (b, s))
    if d.coin(0.4):
        kw["target_mask"] = d.mask("target_mask", (b, t))
    if d.coin(0.3):
        kw["alpha"] = d.bad("alpha", d.choice((1.0, 1.2, 1e30)), BAD_REAL)

    def fn() -> tuple[torch.Tensor, torch.Tensor]:
        return cls(**opts).pair(src, tgt, **kw)

    return d.finish(
        "cape.PositionAugmentation",
        fn,
        ("source", "target", *opts, *kw),
        lambda out: (
            expect(out[0], (b, s, 1), torch.float32) or expect(out[1], (b, t, 1), torch.float32)
        ),
    )


def from_mapping(d: Draw) -> Call:
    """`cape.build(name, dim, augmentation={"kind": ...})`, the form config files write."""
    which = d.choice(("randomized", "pose", "random-float", "cape", "nope"))
    if which == "nope":
        d.invalid.append("kind nope")
    key = {"randomized": "max_length", "pose": "target_length", "random-float": "train_length"}
    mapping: dict = {"kind": which}
    if which in key:
        mapping[key[which]] = d.bad(key[which], 16, (0, "x"))
    elif which == "cape":
        mapping["max_global_shift"] = d.bad("max_global_shift", 2.0, (-1.0,))
    if d.coin(0.05):
        mapping["foo"] = 1
        d.invalid.append("foo")
    name = d.choice(("rotary", "alibi", "cape1d", "fire"))
    dim = 2 if name in ("alibi", "fire") else 8

    def fn() -> torch.Tensor:
        enc = cape.build(name, dim, augmentation=mapping)
        return torch.tensor(float(enc.augmentation is not None))

    return d.finish("cape.build", fn, ("augmentation", "kind", *mapping, "foo"))


KINDS = ("randomized", "pose", "random-float")
GENERATORS = {
    "augment": [
        *(functools.partial(sampled_positions, which=w) for w in KINDS),
        *(functools.partial(sampled_pair, which=w) for w in KINDS),
        from_mapping,
    ]
}
