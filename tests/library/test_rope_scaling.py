"""Rotary beyond the training length (PI, NTK, YaRN) and xPos: `Rotary(scaling=..., xpos=...)`."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

import cape
from cape.encodings.rotary import Rotary
from cape.functional.rope_scaling import (
    ntk_base,
    position_span,
    xpos_scale,
    xpos_zeta,
    yarn_temperature,
)
from cape.functional.sinusoidal import sinusoid_frequencies

METHODS = ("pi", "ntk", "yarn")


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def interleaved(hd: int) -> torch.Tensor:
    """cape's half layout (c, c + hd/2) -> rotary-embedding-torch's pairs (2c, 2c + 1)."""
    half = torch.arange(hd // 2)
    return torch.stack([half, half + hd // 2], dim=-1).flatten()


def frequencies_of(r: Rotary, length: int = 2) -> torch.Tensor:
    """The frequencies a call over token indices 0..length-1 uses: the angles at position 1."""
    return r.angles(torch.arange(float(length))[None])[0, 1]


def logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-1, -2)


# -- against rotary-embedding-torch 0.9.1 (interleaved layout: channels permuted) -------------


@pytest.fixture
def ret():
    return pytest.importorskip("rotary_embedding_torch")


@pytest.mark.parametrize("options", [{}, {"scaling": "pi", "factor": 4.0}, {"scaling": "pi"}])
def test_rotation_and_interpolation_match_rotary_embedding_torch(ret, options):
    hd, t = 16, 12
    q, k = rand(2, 3, t, hd), rand(2, 3, t, hd, seed=1)
    if options.get("scaling") == "pi" and "factor" not in options:
        options = {**options, "train_length": t / 4}  # per call: s = 12 / 3 = 4
    ours = Rotary(hd, **options)(q, k)
    ref = ret.RotaryEmbedding(hd, interpolate_factor=4.0 if options else 1.0)
    perm = interleaved(hd)
    for mine, x in zip(ours, (q, k), strict=True):
        expected = ref.rotate_queries_or_keys(x[..., perm])
        torch.testing.assert_close(mine[..., perm], expected, atol=1e-5, rtol=1e-5)


def test_xpos_matches_rotary_embedding_torch(ret):
    hd, t, base = 8, 10, 16.0
    q, k = rand(1, 2, t, hd) * 3, rand(1, 2, t, hd, seed=1) * 3
    ref = ret.RotaryEmbedding(hd, use_xpos=True, xpos_scale_base=base)
    perm = interleaved(hd)
    seq = torch.arange(float(t))
    # its get_scale: zeta^((n - T//2) / B), which is ours with center = T//2
    ours = xpos_scale(seq[None, :, None], hd, scale_base=base, center=float(t // 2))[0]
    torch.testing.assert_close(ours[..., perm], ref.get_scale(seq), atol=1e-6, rtol=1e-5)
    q_ref, k_ref = ref.rotate_queries_and_keys(q[..., perm], k[..., perm])
    q_rot, k_rot = Rotary(hd, xpos=True, xpos_scale_base=base)(q, k)
    torch.testing.assert_close(q_rot[..., perm], q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_rot[..., perm], k_ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(q_ref, ref.rotate_queries_or_keys(q[..., perm], scale=1.0))


def test_ntk_matches_rotary_embedding_torch_theta_rescale(ret):
    hd, s = 16, 3.0
    ref = ret.RotaryEmbedding(hd, theta_rescale_factor=s)
    ours = frequencies_of(Rotary(hd, scaling="ntk", factor=s))
    torch.testing.assert_close(ours, ref.freqs.detach(), rtol=1e-5, atol=0)


# -- NTK, YaRN: closed forms and an independent float64 implementation -----------------------


def test_ntk_base_closed_form_and_frequency_ends():
    hd, s = 16, 4.0
    assert ntk_base(10000.0, s, hd) == pytest.approx(10000.0 * s ** (16 / 14), rel=1e-12)
    got = frequencies_of(Rotary(hd, scaling="ntk", factor=s)).double()
    plain = sinusoid_frequencies(hd).double()
    via_base = sinusoid_frequencies(hd, base=ntk_base(10000.0, s, hd)).double()
    torch.testing.assert_close(got, via_base, rtol=1e-6, atol=0)
    assert got[0] == plain[0]  # c = 0: unchanged
    assert float(got[-1] / plain[-1]) == pytest.approx(1 / s, rel=1e-6)  # lowest: / s
    assert bool((got <= plain).all() and (got >= plain / s * (1 - 1e-6)).all())


def yarn_reference(hd, base, s, train_length, alpha, beta):
    """YaRN sec. 3.2-3.3 in float64, written from the paper."""
    theta = base ** (-np.arange(0, hd, 2) / hd)
    wavelength = 2 * np.pi / theta
    r = train_length / wavelength
    gamma = np.where(r < alpha, 0.0, np.where(r > beta, 1.0, (r - alpha) / (beta - alpha)))
    return (1 - gamma) * theta / s + gamma * theta, r


@pytest.mark.parametrize("alpha,beta", [(1.0, 32.0), (2.0, 8.0)])
def test_yarn_frequencies_match_the_paper(alpha, beta):
    hd, train = 32, 512
    expected, r = yarn_reference(hd, 10000.0, 4.0, train, alpha, beta)
    assert (r < alpha).any() and (r > beta).any() and ((r > alpha) & (r < beta)).any()
    r_mod = Rotary(hd, scaling="yarn", train_length=train, yarn_alpha=alpha, yarn_beta=beta)
    got = frequencies_of(r_mod, 4 * train).double().numpy()  # per call: s = 2048 / 512 = 4
    np.testing.assert_allclose(got, expected, rtol=2e-6)
    theta = expected * 0 + 10000.0 ** (-np.arange(0, hd, 2) / hd)
    np.testing.assert_allclose(got[r < alpha], theta[r < alpha] / 4, rtol=2e-6)
    np.testing.assert_allclose(got[r > beta], theta[r > beta], rtol=2e-6)


def test_yarn_temperature_scales_q_and_k():
    hd, t = 8, 16
    q, k = rand(2, 2, t, hd), rand(2, 2, t, hd, seed=1)
    q_rot, k_rot = Rotary(hd, scaling="yarn", train_length=4)(q, k)  # s = 4
    m = 0.1 * math.log(4.0) + 1
    assert yarn_temperature(4.0) == pytest.approx(m)
    torch.testing.assert_close(q_rot.norm(dim=-1), q.norm(dim=-1) * m)
    torch.testing.assert_close(k_rot.norm(dim=-1), k.norm(dim=-1) * m)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("how", ["short call", "factor 1"])
def test_factor_one_is_plain_rotary(method, how):
    hd, t = 8, 10
    q, k = rand(2, 2, t, hd), rand(2, 2, t, hd, seed=1)
    pos = rand(2, t, seed=2) * 3 + 5  # span < 64
    opts = {"train_length": 64} if how == "short call" else {"factor": 1.0}
    if method == "yarn":
        opts["train_length"] = 64
    plain = Rotary(hd)(q, k, positions=pos)
    scaled = Rotary(hd, scaling=method, **opts)(q, k, positions=pos)
    for got, want in zip(scaled, plain, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


# -- relative property, xPos decay ------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("factor", [3.0, None])
def test_logits_depend_on_differences_only(method, factor):
    hd, t = 16, 9
    q, k = rand(2, 2, t, hd), rand(2, 2, t, hd, seed=1)
    pos = rand(2, t, seed=2) * 10
    r = Rotary(hd, scaling=method, train_length=3.0, factor=factor)
    base = logits(*r(q, k, positions=pos))
    shifted = logits(*r(q, k, positions=pos + 37.5))
    torch.testing.assert_close(shifted, base, atol=2e-4, rtol=1e-4)
    assert not torch.allclose(base, logits(*Rotary(hd)(q, k, positions=pos)), atol=1e-3)


def test_xpos_logits_scale_by_zeta_to_the_distance():
    hd, t, b = 8, 7, 4.0
    q, k = rand(1, 1, t, hd), rand(1, 1, t, hd, seed=1)
    pos = torch.tensor([[0.0, 1.0, 2.5, 4.0, 6.0, 9.0, 13.0]])
    plain_q, plain_k = Rotary(hd)(q, k, positions=pos)
    h = hd // 2
    pairs = [
        plain_q[..., c, None] * plain_k[..., None, c].transpose(-1, -2)
        + plain_q[..., c + h, None] * plain_k[..., None, c + h].transpose(-1, -2)
        for c in range(h)
    ]  # each [1, 1, T, T]: one rotation plane's share of the logits
    dist = (pos[0, :, None] - pos[0, None, :]).double()  # n - m
    zeta = xpos_zeta(hd).double()
    expected = sum(zeta[c] ** (dist / b) * pairs[c].double() for c in range(h))
    r = Rotary(hd, xpos=True, xpos_scale_base=b)
    got = logits(*r(q, k, positions=pos))
    torch.testing.assert_close(got.double(), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits(*r(q, k, positions=pos - 5.0)), got, atol=1e-4, rtol=1e-4)


# -- gradients, autocast, padding, compile -----------------------------------------------------


def test_gradients_flow_finite_differences():
    r = Rotary(4, scaling="yarn", train_length=2.0, xpos=True, xpos_scale_base=8.0)
    q = rand(1, 1, 3, 4, dtype=torch.float64).requires_grad_()
    k = rand(1, 1, 3, 4, seed=1, dtype=torch.float64).requires_grad_()
    pos = torch.tensor([[0.0, 1.5, 4.0]])
    # float32 maths inside: a step of 1e-2 on a function linear in q and k
    assert torch.autograd.gradcheck(
        lambda a, c: logits(*r(a, c, positions=pos)), (q, k), eps=1e-2, atol=1e-3, rtol=1e-3
    )


@pytest.mark.parametrize("method", METHODS)
def test_bf16_autocast_keeps_float32_maths(method):
    hd, t = 16, 12
    q = rand(2, 2, t, hd).to(torch.bfloat16)
    k = rand(2, 2, t, hd, seed=1).to(torch.bfloat16)
    pos = torch.arange(float(t))[None].expand(2, t) + 3000.0  # bf16 angles: off by radians
    r = Rotary(hd, scaling=method, train_length=4.0, xpos=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = r(q, k, positions=pos)
    ref = r(q.float(), k.float(), positions=pos)
    for got, want in zip(out, ref, strict=True):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("options", [{}, {"xpos": True}] + [{"scaling": m} for m in METHODS])
def test_padding_does_not_change_valid_tokens(options):
    hd, t, n = 8, 9, 5
    if "scaling" in options:
        options = {**options, "train_length": 2.0}
    r = Rotary(hd, **options)
    q, k = rand(2, 2, t, hd), rand(2, 2, t, hd, seed=1)
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[0, n:] = False
    padded = r(q, k, mask=mask)
    alone = r(q[:1, :, :n], k[:1, :, :n])
    for got, want in zip(padded, alone, strict=True):
        torch.testing.assert_close(got[:1, :, :n], want, atol=1e-6, rtol=1e-6)
    full = r(q[1:], k[1:])  # the long sample is not affected by the short one either
    torch.testing.assert_close(padded[0][1:], full[0], atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_compiled_forward_matches_eager():
    r = Rotary(8, scaling="yarn", train_length=4.0, xpos=True)
    q, k = rand(2, 2, 12, 8), rand(2, 2, 12, 8, seed=1)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 7:] = False
    start = time.monotonic()
    compiled = torch.compile(lambda a, c, m: r(a, c, mask=m), fullgraph=False)
    got = compiled(q, k, mask)
    assert time.monotonic() - start < 60.0
    for g, e in zip(got, r(q, k, mask=mask), strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


# -- refused arguments --------------------------------------------------------------------------

BAD = [
    ({"scaling": "foo"}, ValueError, "scaling"),
    ({"scaling": "pi", "train_length": 0}, ValueError, "train_length"),
    ({"scaling": "pi", "train_length": "8"}, TypeError, "train_length"),
    ({"scaling": "pi", "factor": 0.5}, ValueError, "factor"),
    ({"scaling": "pi", "factor": math.nan}, ValueError, "factor"),
    ({"scaling": "pi"}, ValueError, "train_length"),
    ({"scaling": "yarn", "factor": 2.0}, ValueError, "train_length"),
    ({"scaling": "yarn", "train_length": 8, "yarn_alpha": 32.0}, ValueError, "yarn_alpha"),
    ({"scaling": "yarn", "train_length": 8, "yarn_beta": -1.0}, ValueError, "yarn_beta"),
    ({"factor": 2.0}, ValueError, "factor"),
    ({"train_length": 8}, ValueError, "train_length"),
    ({"scaling": "pi", "factor": 2.0, "pos_dim": 2}, ValueError, "scaling"),
    ({"xpos": True, "pos_dim": 2}, ValueError, "xpos"),
    ({"xpos": 1}, TypeError, "xpos"),
    ({"xpos": True, "xpos_scale_base": 0.0}, ValueError, "xpos_scale_base"),
]


@pytest.mark.parametrize("options,error,word", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_arguments_are_refused_by_name(options, error, word):
    with pytest.raises(error, match=word):
        Rotary(8, **options)


def test_ntk_needs_head_dim_4_and_xpos_refuses_overflowing_positions():
    with pytest.raises(ValueError, match="head_dim"):
        Rotary(2, scaling="ntk", factor=2.0)
    q = rand(1, 1, 2, 8)
    with pytest.raises(ValueError, match="positions"):
        Rotary(8, xpos=True)(q, q, positions=torch.tensor([[0.0, 1e6]]))


def test_registry_offers_the_options_for_rotary_only():
    opts = cape.encoding_options("rotary")
    for name in ("scaling", "train_length", "factor", "yarn_alpha", "yarn_beta", "xpos"):
        assert name in opts and name not in cape.encoding_options("rotary2d")
    assert cape.build("rotary", 8, scaling="ntk", factor=2.0).scaling == "ntk"
    with pytest.raises(TypeError, match="scaling"):
        cape.build("rotary2d", 8, scaling="pi", factor=2.0)


@pytest.mark.parametrize("method", METHODS)
def test_factor_reads_the_positions_unit(method):
    # frames 30 ms apart, trained on 6 s: a 6 s call is not extended, a 9 s one by 1.5 (the span
    # is n steps of the spacing, not max - min + 1 position unit)
    hd, hop = 8, 0.03
    r = Rotary(hd, scaling=method, train_length=6.0)
    for frames, factor in ((200, 1.0), (300, 1.5)):
        q, k = rand(1, 2, frames, hd), rand(1, 2, frames, hd, seed=1)
        pos = (torch.arange(frames, dtype=torch.float32) * hop)[None]
        fixed = Rotary(hd, scaling=method, train_length=6.0, factor=factor)
        for got, want in zip(r(q, k, positions=pos), fixed(q, k, positions=pos), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # 0.03 s in float32
    assert position_span(torch.arange(7.0)[None, :, None] * 0.5).tolist() == [3.5]
