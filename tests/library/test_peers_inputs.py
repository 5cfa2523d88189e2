"""The peers' inputs that a property harness found mishandled (issue 42, item 5): each now
gives a valid result or a ValueError naming the argument."""

from __future__ import annotations

import math

import pytest
import torch

import cape
from cape.models import MultiheadAttention, TransformerEncoder


def test_2d_rotary_refuses_1d_positions_by_name_in_attention_and_stacks() -> None:
    attn = MultiheadAttention(32, 4, rotary=cape.build("rotary2d", 8))
    with pytest.raises(ValueError, match="q_positions must have 2 coordinate"):
        attn(torch.randn(1, 5, 32), q_positions=torch.randn(1, 5))
    stack = TransformerEncoder(1, 32, 4, 64, position="rotary2d")
    with pytest.raises(ValueError, match="positions must have 2 coordinate"):
        stack(torch.randn(1, 5, 32), positions=torch.randn(1, 5))


@pytest.mark.parametrize("name", ["cape2d", "sinpos2d", "rotary2d"])
def test_an_axis_of_one_sample_aliases_nothing(name: str) -> None:
    enc = cape.build(name, 8 if name == "rotary2d" else 32)
    assert cape.count_aliased(enc, (1, 1)) == 0
    # one row of 8 patches: only the x axis steps; the count is that of the x frequencies alone
    freqs = enc.frequencies.to(torch.float64).abs()
    step = 2.0 / 7  # grid_positions spans [-1, 1]
    want = int((freqs[0] * step >= math.pi).sum())
    assert cape.count_aliased(enc, (1, 8)) == want
    fitted = cape.build(name, 8 if name == "rotary2d" else 32, fit_grid=(1, 8))
    assert cape.count_aliased(fitted, (1, 8)) == 0  # fitted to that grid: nothing aliases


@pytest.mark.parametrize(
    ("name", "grid", "message"),
    [
        ("cape2d", (1, 1), "at least 2 samples on some axis"),
        ("rope-axial", (1, 1), "at least 2 samples on some axis"),
        ("rope-axial", (1, 6), "at least 2 samples on every axis"),
        ("sine-2d", (5, 1), "at least 2 samples on every axis"),
    ],
)
def test_fit_grid_of_one_sample_is_refused_by_name(name: str, grid, message: str) -> None:
    dim = 8 if name.startswith("rope") else 16
    with pytest.raises(ValueError, match=f"fit_grid must have {message}"):
        cape.build(name, dim, fit_grid=grid)


def test_xpos_in_float16_is_refused_where_it_would_overflow() -> None:
    rot = cape.Rotary(64, xpos=True)
    q = torch.randn(1, 1, 10000, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="positions: xPos scales q and k by up to"):
        rot(q, q)
    short = torch.randn(1, 1, 1000, 64, dtype=torch.float16)
    out_q, out_k = rot(short, short)  # within float16's range: finite, and as in float32
    assert torch.isfinite(out_q).all() and torch.isfinite(out_k).all()
    ref_q, _ = rot(short.float(), short.float())
    torch.testing.assert_close(out_q.float(), ref_q, rtol=2e-3, atol=2e-2)
    bf16 = torch.randn(1, 1, 10000, 64, dtype=torch.bfloat16)  # float32's range: fine
    assert all(torch.isfinite(t).all() for t in rot(bf16, bf16))
    stack = TransformerEncoder(1, 64, 1, 64, position="rotary", position_options={"xpos": True})
    with pytest.raises(ValueError, match="xPos scales q and k"):  # the stack's boundary
        stack.half().eval()(torch.randn(1, 10000, 64, dtype=torch.float16))
