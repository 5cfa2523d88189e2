"""Case generators of the contract suite for cape.functional's RoPE helpers: the length
extensions and xPos (`rope_scaling`) and RoPE-ViT's 2-D frequencies (`rope2d`). Each takes a
`Draw` and returns a `Call` (see _contract.py)."""

from __future__ import annotations

import math

import torch
from _contract import Call, Draw, expect

import cape.functional as F

NAN, INF = math.nan, math.inf
BAD_EVEN = (3, 0, -4, 2.0, "4", True)
BAD_POSITIVE = (0.0, -1.0, NAN, INF, "1", True)
BAD_FACTOR = (0.5, -2.0, NAN, INF, "2", True)
POS_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64)

SCALING = ("ntk_base", "span", "midpoint", "extension", "scaled", "temperature", "zeta", "xpos")
ROPE2D = ("magnitudes", "axial", "mixed", "mixed_angles")


def _positions(d: Draw, b: int, t: int, masks: bool = True) -> tuple[object, object]:
    """1-D positions [B, T, 1] (sometimes [B, T, 2]: refused) and a mask or None."""
    pos = d.tensor("positions", (b, t, 1), dtypes=POS_DTYPES, bad_dtypes=(torch.bool,))
    if isinstance(pos, torch.Tensor) and pos.dim() == 3:
        pos = d.bad("positions", pos, (torch.cat([pos, pos], -1),))
    mask = d.mask("mask", (b, t)) if masks and d.coin(0.5) else None
    return pos, mask


def scaling(d: Draw, which: str | None = None) -> Call:
    which = which or d.choice(SCALING)
    if which == "ntk_base":
        base = d.bad("base", d.choice((10000.0, 1.0, 500.0)), (0.5, NAN, INF, "1", True))
        factor = d.bad("factor", d.choice((1.0, 2.5, 16.0)), BAD_FACTOR)
        hd = d.bad("head_dim", d.choice((4, 8, 64)), (2, *BAD_EVEN))
        return d.finish(
            "functional.ntk_base",
            lambda: F.ntk_base(base, factor, hd),
            ("base", "factor", "head_dim"),
            lambda out: None if isinstance(out, float) and math.isfinite(out) else f"got {out}",
        )
    b, t = d.dims(2, hi=4)
    if which in ("span", "midpoint"):
        pos, mask = _positions(d, b, t)
        fn = F.position_span if which == "span" else F.position_midpoint
        return d.finish(
            f"functional.{fn.__name__}",
            lambda: fn(pos, mask),
            ("positions", "mask"),
            lambda out: expect(out, (b,), torch.float32),
        )
    if which == "extension":
        length = d.tensor(
            "length", (b,), kind="positive", dtypes=POS_DTYPES, bad_dtypes=(torch.bool,)
        )
        train = d.bad("train_length", d.choice((1.0, 64.0, 6.0)), BAD_POSITIVE)
        return d.finish(
            "functional.extension_factor",
            lambda: F.extension_factor(length, train),
            ("length", "train_length"),
            lambda out: expect(out, (b,), torch.float32),
        )
    if which in ("scaled", "temperature"):
        tensor = d.coin()
        if tensor:
            values = 1.0 + d.values((b,), "positive", torch.float32).abs()
            below = torch.full_like(values, 0.5)
            wrong = (below, values.double() * NAN) if b else ()  # an empty tensor has no values
            factor = d.bad("factor", values, (*wrong, values[:, None], "s"))
        else:
            factor = d.bad("factor", d.choice((1.0, 2.0, 8.0)), BAD_FACTOR)
        if which == "temperature":
            return d.finish(
                "functional.yarn_temperature",
                lambda: F.yarn_temperature(factor),
                ("factor",),
                lambda out: expect(out, (b,), torch.float32) if tensor else None,
            )
        half = d.int(1, 4)
        omega = d.bad(
            "omega",
            F.sinusoid_frequencies(2 * half, freq_scale=d.choice((1.0, 30.0))),
            (torch.ones(2, half), torch.ones(half, dtype=torch.long), "w"),
        )
        method = d.bad("method", d.choice(("pi", "ntk", "yarn")), ("PI", "rope", None))
        kw: dict = {}
        if method == "yarn" or d.coin(0.3):
            kw["train_length"] = d.bad("train_length", d.choice((8.0, 64.0)), BAD_POSITIVE)
        if method == "yarn" and d.coin(0.3):
            kw["alpha"], kw["beta"] = 1.0, d.bad("beta", 32.0, (0.5, NAN, "b"))
        shape = (b, half) if tensor else (half,)
        return d.finish(
            "functional.scaled_frequencies",
            lambda: F.scaled_frequencies(omega, factor, method, **kw),
            ("omega", "factor", "method", "head_dim", *kw),
            lambda out: expect(out, shape, torch.float32),
        )
    hd = d.bad("head_dim", d.choice((2, 4, 16)), BAD_EVEN)
    half = hd // 2 if isinstance(hd, int) else None
    if which == "zeta":
        gamma = d.bad("gamma", d.choice((0.4, 1.0)), BAD_POSITIVE)
        return d.finish(
            "functional.xpos_zeta",
            lambda: F.xpos_zeta(hd, gamma=gamma),
            ("head_dim", "gamma"),
            lambda out: expect(out, (half,), torch.float32),
        )
    pos, _ = _positions(d, b, t, masks=False)
    kw = {}
    if d.coin(0.5):
        kw["scale_base"] = d.bad("scale_base", d.choice((512.0, 1e6)), BAD_POSITIVE)
    if d.coin(0.5):
        center = d.choice((0.0, torch.zeros(b), torch.full((1,), 3.0)))
        kw["center"] = d.bad("center", center, (torch.zeros(b + 1), torch.zeros(b, 2), "c"))
    return d.finish(
        "functional.xpos_scale",
        lambda: F.xpos_scale(pos, hd, **kw),
        ("positions", "head_dim", *kw),
        lambda out: expect(out, (b, t, hd), torch.float32),
    )


def rope2d(d: Draw, which: str | None = None) -> Call:
    which = which or d.choice(ROPE2D)
    if which == "mixed_angles":
        b, t = d.dims(2, hi=4)
        h, half = d.int(1, 3), 2 * d.int(1, 3)
        pos = d.tensor("positions", (b, t, 2), dtypes=POS_DTYPES, bad_dtypes=(torch.bool,))
        if isinstance(pos, torch.Tensor) and pos.dim() == 3:
            pos = d.bad("positions", pos, (pos[..., :1],))
        freqs = torch.randn(h, 2, half) * d.choice((1.0, 100.0))
        freqs = d.bad("freqs", freqs, (freqs[0], freqs[:, :1], freqs.long(), "f"))
        return d.finish(
            "functional.mixed_angles",
            lambda: F.mixed_angles(pos, freqs),
            ("positions", "freqs"),
            lambda out: expect(out, (b, h, t, half), torch.float32),
        )
    hd = d.bad("head_dim", d.choice((4, 8, 16)), (2, 6, 0, 4.0, "8"))
    q = hd // 4 if isinstance(hd, int) else None
    theta = d.bad("theta", d.choice((100.0, 10.0, 1.0)), (0.5, NAN, INF, "t", True))
    if which == "magnitudes":
        return d.finish(
            "functional.rope2d_magnitudes",
            lambda: F.rope2d_magnitudes(hd, theta),
            ("head_dim", "theta"),
            lambda out: expect(out, (q,), torch.float32),
        )
    kw: dict = {"theta": theta}
    if d.coin(0.5):
        spacing = d.choice(((1.0, 1.0), (2 / 7, 0.5), [0.1, 3.0]))
        kw["spacing"] = d.bad("spacing", spacing, ((1.0,), (0.0, 1.0), (1.0, NAN), 1.0, "s"))
    if which == "axial":
        return d.finish(
            "functional.axial_frequencies",
            lambda: F.axial_frequencies(hd, **kw),
            ("head_dim", "theta", "spacing"),
            lambda out: expect(out, (2, 2 * q), torch.float32),
        )
    heads = d.bad("heads", d.int(1, 3), (0, -1, 2.5, "2"))
    if d.coin(0.3):
        kw["generator"] = d.bad("generator", torch.Generator().manual_seed(d.int(0, 99)), (3, "g"))
    return d.finish(
        "functional.mixed_frequencies",
        lambda: F.mixed_frequencies(hd, heads, **kw),
        ("head_dim", "heads", "theta", "spacing", *kw),
        lambda out: expect(out, (heads, 2, 2 * q), torch.float32),
    )
