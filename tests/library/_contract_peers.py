"""Case generators of the contract suite for the peers' surface (issue 42, item 5): xPos in
float16 and bfloat16, the rotary scalings through `Rotary`, 2-D rotary through attention and
the stacks, `fit_grid` on every encoding that takes it, and `count_aliased` on grids with an
axis of one sample. Each takes a `Draw` and returns a `Call` (see _contract.py)."""

from __future__ import annotations

import math

import torch
from _contract import Call, Draw, expect

import cape
from cape.models import MultiheadAttention, TransformerEncoder

NAN, INF = math.nan, math.inf
HALF = (torch.float32, torch.float16, torch.bfloat16)


def xpos(d: Draw) -> Call:
    """Rotary with xPos (and a scaling, now and then) on q and k of float16 / bfloat16: finite
    outputs, or a ValueError naming the positions or the scale base."""
    dtype = d.choice(HALF)
    t = d.choice((4, 64, 1000, 10000))
    options: dict = {"xpos": True}
    options["xpos_scale_base"] = d.bad(
        "xpos_scale_base", d.choice((1.0, 8.0, 512.0)), (0.0, -1.0, NAN, "1")
    )
    if d.coin(0.3):
        options.update(scaling=d.choice(("pi", "ntk", "yarn")), factor=d.choice((2.0, 8.0)))
        if options["scaling"] == "yarn":
            options["train_length"] = 64.0  # its ramp reads the training length
    scale = d.choice((1.0, 0.01, 30.0))
    q = torch.randn(1, 2, t, 8, dtype=dtype)
    positions = torch.arange(t, dtype=torch.float32)[None] * scale

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        return cape.Rotary(8, **options)(q, q.clone(), positions=positions)

    return d.finish(
        "peers.xpos", call, ("positions", "xpos_scale_base", "factor"),
        lambda out: expect(out[0], (1, 2, t, 8), dtype),
    )  # fmt: skip


def rotary2d_attention(d: Draw) -> Call:
    """2-D rotary (and RoPE-Axial / RoPE-Mixed) in attention or a stack, with positions of
    1, 2 or 3 coordinates per token: valid with 2, else a ValueError naming them."""
    name = d.choice(("rotary2d", "rope-axial", "rope-mixed"))
    options = {"heads": 4} if name == "rope-mixed" else {}
    coords = d.bad("q_positions", 2, (1, 3))
    b, t = d.int(1, 3), d.int(1, 6)
    shape = (b, t) if coords == 1 else (b, t, coords)
    positions = torch.randn(*shape) * d.choice((1.0, 10.0))
    x = torch.randn(b, t, 32)
    if d.coin(0.5):
        attn = MultiheadAttention(32, 4, rotary=cape.build(name, 8, **options))
        label = "peers.attention 2-D rotary"

        def call() -> torch.Tensor:
            return attn(x, q_positions=positions)
    else:
        stack = TransformerEncoder(1, 32, 4, 64, position=name, position_options=options)
        label = "peers.stack 2-D rotary"

        def call() -> torch.Tensor:
            return stack(x, positions=positions)

    return d.finish(label, call, ("q_positions", "positions"), lambda out: expect(out, (b, t, 32)))


FITTED = ("cape2d", "sinpos2d", "sine-2d", "rotary2d", "rope-axial", "rope-mixed")


def fit_grid(d: Draw) -> Call:
    """Every encoding that fits its frequencies to a grid, on grids of 1-16 samples a side and
    widths from the smallest: an encoding whose frequencies alias on none of the grid's axes
    (`count_aliased` on that grid is 0: a step of exactly pi counts as aliased, by the
    sampling theorem), or a ValueError naming fit_grid."""
    name = d.choice(FITTED)
    grid = (d.int(1, 16), d.int(1, 16))
    grid = d.bad("fit_grid", grid, ((0, 3), (2.5, 3), "4x4", (2, 3, 4)))
    rotates = name in ("rotary2d", "rope-axial", "rope-mixed")
    dim = d.choice((2, 4, 8, 16) if rotates else (2, 4, 6, 8, 16, 32, 64))
    options = {"heads": 2} if name == "rope-mixed" else {}
    if name in ("cape2d", "sinpos2d", "sine-2d", "rotary2d") and d.coin(0.3):
        options["augmentation"] = cape.Augmentation(max_global_scaling=d.choice((1.2, 2.0)))

    def call() -> tuple[torch.Tensor, int]:
        enc = cape.build(name, dim, fit_grid=grid, **options)
        freqs = enc.frequencies if hasattr(enc, "frequencies") else enc.head_freqs
        return freqs, cape.count_aliased(enc, grid) if hasattr(enc, "frequencies") else 0

    def check(out: tuple[torch.Tensor, int]) -> str | None:
        return None if out[1] == 0 else f"{out[1]} frequencies alias on the grid fitted to"

    return d.finish(f"peers.fit_grid {name}", call, ("fit_grid", "dim", "head_dim"), check)


def count_aliased(d: Draw) -> Call:
    """count_aliased on grids with an axis of one sample: that axis has no phase step, so it
    counts no more than the other axis alone, and a 1 x 1 grid counts 0."""
    name = d.choice(("cape2d", "sinpos2d", "rotary2d"))
    enc = cape.build(name, 8 if name == "rotary2d" else 32)
    n = d.int(1, 12)
    grid = d.choice(((1, n), (n, 1), (1, 1)))

    def check(out: int) -> str | None:
        if grid == (1, 1) and out != 0:
            return f"a 1 x 1 grid counts {out} aliased frequencies"
        return None if 0 <= out <= enc.frequencies.shape[1] else f"got {out}"

    return d.finish("peers.count_aliased", lambda: cape.count_aliased(enc, grid), ("grid",), check)


GENERATORS = {"peers": [xpos, rotary2d_attention, fit_grid, count_aliased]}
