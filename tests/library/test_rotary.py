"""Rotary embeddings over continuous / 2D / CAPE-augmented positions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cape.augment import Augmentation
from cape.encodings.rotary import Rotary
from cape.functional.rotary import apply_rotary, rotary_angles

finite = st.floats(-100.0, 100.0, allow_nan=False, allow_infinity=False)


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def logit(q_vec, k_vec, q_pos, k_pos, mode="1d"):
    """<R(p) q, R(p') k> for one query and one key; positions [M]."""
    hd = q_vec.shape[-1]
    qa = rotary_angles(torch.tensor([[q_pos]], dtype=torch.float32), hd, mode=mode)
    ka = rotary_angles(torch.tensor([[k_pos]], dtype=torch.float32), hd, mode=mode)
    qr = apply_rotary(q_vec.view(1, 1, 1, hd), qa)
    kr = apply_rotary(k_vec.view(1, 1, 1, hd), ka)
    return float((qr * kr).sum())


# -- functional ---------------------------------------------------------------------------


def test_angles_1d_match_numpy():
    pos = np.array([[0.0, 0.37, 5.0, -12.25]], dtype=np.float64)
    got = rotary_angles(
        torch.tensor(pos[..., None], dtype=torch.float32), 16, base=100.0, freq_scale=30.0
    )
    omega = 30.0 * 100.0 ** (-np.arange(8) * 2 / 16)
    np.testing.assert_allclose(got.numpy(), pos[..., None] * omega, rtol=1e-5, atol=1e-4)
    assert got.dtype == torch.float32 and got.shape == (1, 4, 8)


def test_angles_2d_match_appendix_formula():
    hd, half = 12, 6
    xy = np.random.default_rng(0).uniform(-1, 1, size=(2, 5, 2))
    rho = 10 ** (np.arange(1, half + 1) / half)
    w_x, w_y = rho * np.cos(np.arange(half)), rho * np.sin(np.arange(half))
    expected = np.pi * (w_x * xy[..., :1] + w_y * xy[..., 1:])
    got = rotary_angles(torch.tensor(xy, dtype=torch.float32), hd, mode="2d")
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_angles_from_freqs_of_any_number_of_axes(m):
    """freqs [M, hd/2]: angle_c = sum_m p_m w_m,c, in float64 numpy; M sets the positions'
    last size whatever the mode."""
    rng = np.random.default_rng(m)
    pos = rng.uniform(-20, 20, size=(2, 5, m))
    w = rng.uniform(-3, 3, size=(m, 6))
    got = rotary_angles(
        torch.tensor(pos, dtype=torch.float32), 12, freqs=torch.tensor(w, dtype=torch.float32)
    )
    np.testing.assert_allclose(got.numpy(), pos @ w, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match=rf"end with {m} coordinate\(s\) for freqs"):
        rotary_angles(torch.zeros(1, 4, m + 1), 12, freqs=torch.tensor(w, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"freqs must have shape \[M, 6\]"):
        rotary_angles(torch.zeros(1, 4, m), 12, freqs=torch.zeros(m, 5))
    with pytest.raises(TypeError, match="freqs must be a floating"):
        rotary_angles(torch.zeros(1, 4, m), 12, freqs=torch.zeros(m, 6, dtype=torch.long))


def test_angles_from_freqs_refuse_phases_beyond_float32():
    """the phase check reads the given frequencies, not freq_scale (unused with freqs)."""
    w = torch.full((3, 4), 1e3)
    rotary_angles(torch.full((1, 2, 3), 1e33), 8, freqs=w)  # 3e36: within float32
    with pytest.raises(ValueError, match="phases"):
        rotary_angles(torch.full((1, 2, 3), 1e36), 8, freqs=w)


def test_apply_rotary_is_complex_multiplication():
    x = rand(2, 3, 4, 8)
    ang = rand(2, 4, 4, seed=1) * 10
    z = (x[..., :4] + 1j * x[..., 4:]).numpy().astype(np.complex128)
    expected = z * np.exp(1j * ang.numpy()[:, None].astype(np.float64))
    got = apply_rotary(x, ang)
    np.testing.assert_allclose(got[..., :4].numpy(), expected.real, atol=1e-5)
    np.testing.assert_allclose(got[..., 4:].numpy(), expected.imag, atol=1e-5)


def test_norm_preserved_and_zero_angle_is_identity():
    x = rand(2, 3, 5, 16)
    ang = rotary_angles(rand(2, 5, 1, seed=2) * 50, 16)
    out = apply_rotary(x, ang)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(apply_rotary(x, torch.zeros(5, 8)), x)


@settings(max_examples=40, deadline=None)
@given(p=finite, p2=finite, shift=finite)
def test_1d_logit_depends_only_on_difference(p, p2, shift):
    q, k = rand(16), rand(16, seed=1)
    torch.testing.assert_close(
        logit(q, k, [p + shift], [p2 + shift]), logit(q, k, [p - p2], [0.0]), atol=2e-3, rtol=1e-3
    )


@settings(max_examples=30, deadline=None)
@given(a=st.tuples(finite, finite), b=st.tuples(finite, finite), s=st.tuples(finite, finite))
def test_2d_logit_depends_only_on_displacement(a, b, s):
    q, k = rand(16), rand(16, seed=1)
    # scale to image-like coordinates: the highest 2D frequency is 10 pi per unit
    a, b, s = ([c / 50 for c in t] for t in (a, b, s))
    moved = logit(q, k, [a[0] + s[0], a[1] + s[1]], [b[0] + s[0], b[1] + s[1]], mode="2d")
    ref = logit(q, k, [a[0] - b[0], a[1] - b[1]], [0.0, 0.0], mode="2d")
    assert moved == pytest.approx(ref, abs=2e-3, rel=1e-3)


def test_2d_planes_mix_both_axes():
    ang_x = rotary_angles(torch.tensor([[[1.0, 0.0]]]), 16, mode="2d")
    ang_y = rotary_angles(torch.tensor([[[0.0, 1.0]]]), 16, mode="2d")
    # all planes but k = 0 (direction angle 0) turn with y as well as with x
    assert (ang_x.abs() > 0).all() and (ang_y[..., 1:].abs() > 0).all()


def test_bf16_in_bf16_out():
    q = rand(2, 2, 30, 32)
    ang = rotary_angles((torch.arange(30.0) * 37.3)[None, :, None], 32)
    ref = apply_rotary(q, ang)
    low = apply_rotary(q.bfloat16(), ang)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), ref, atol=3e-2, rtol=2e-2)


# -- module -------------------------------------------------------------------------------


def test_module_default_positions_and_padding():
    mod = Rotary(8)
    q, k = rand(2, 3, 5, 8), rand(2, 3, 5, 8, seed=1)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    qr, kr = mod(q, k, mask=mask)
    ang = rotary_angles(torch.arange(5.0)[None, :, None], 8)
    torch.testing.assert_close(qr[0], apply_rotary(q, ang)[0])
    torch.testing.assert_close(kr[1, :, :3], apply_rotary(k, ang)[1, :, :3])
    torch.testing.assert_close(qr[1, :, 3:], q[1, :, 3:])  # padding sits at position 0
    assert "head_dim=8" in repr(mod)


def test_train_augmentation_changes_angles_eval_only_normalizes():
    aug = Augmentation(
        max_global_shift=5.0, max_local_shift=0.5, max_global_scaling=1.5, normalize=True
    )
    mod = Rotary(16, augmentation=aug)
    pos = (torch.arange(10.0) + 3.0)[None].expand(2, 10)
    mod.eval()
    torch.testing.assert_close(
        mod.angles(pos), rotary_angles((pos - pos.mean(dim=1, keepdim=True))[..., None], 16)
    )
    mod.train()
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    train = mod.angles(pos, generator=g1)
    assert not torch.allclose(train, mod.eval().angles(pos))
    manual = rotary_angles(aug(pos[..., None], training=True, generator=g2), 16)
    torch.testing.assert_close(train, manual)


def test_self_attention_uses_one_draw_for_q_and_k():
    mod = Rotary(16, augmentation=Augmentation(max_local_shift=0.5, max_global_scaling=2.0))
    mod.train()
    x = rand(2, 2, 9, 16)
    qr, kr = mod(x, x, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(qr, kr, atol=0, rtol=0)
    ang = mod.angles(
        torch.arange(9.0)[None].expand(2, 9), generator=torch.Generator().manual_seed(0)
    )
    torch.testing.assert_close(qr, apply_rotary(x, ang))


def test_global_shift_leaves_logits_unchanged():
    q, k = rand(2, 2, 12, 32), rand(2, 2, 12, 32, seed=1)
    plain = Rotary(32)
    shifted = Rotary(32, augmentation=Augmentation(max_global_shift=50.0)).train()
    qr0, kr0 = plain(q, k)
    qr1, kr1 = shifted(q, k, generator=torch.Generator().manual_seed(3))
    assert not torch.allclose(qr0, qr1)  # the rotations did move
    torch.testing.assert_close(
        qr1 @ kr1.transpose(-1, -2), qr0 @ kr0.transpose(-1, -2), atol=1e-3, rtol=1e-4
    )


def test_cross_attention_shares_global_draws():
    pos = torch.rand(2, 6, generator=torch.Generator().manual_seed(0)) * 20
    x = rand(2, 2, 6, 16)
    mod = Rotary(
        16, augmentation=Augmentation(max_global_shift=10.0, max_global_scaling=2.0)
    ).train()
    qr, kr = mod(
        x, x, positions=pos, k_positions=pos.clone(), generator=torch.Generator().manual_seed(1)
    )
    torch.testing.assert_close(qr, kr)  # same global shift and scale on both sides
    local = Rotary(16, augmentation=Augmentation(max_local_shift=0.4)).train()
    qr, kr = local(x, x, positions=pos, k_positions=pos.clone())
    assert not torch.allclose(qr, kr)  # independent local shifts


def test_cross_attention_normalize_keeps_relative_positions():
    q, k = rand(1, 2, 4, 16), rand(1, 2, 7, 16, seed=1)
    qp, kp = torch.tensor([[1.0, 2.5, 3.0, 9.0]]), torch.arange(7.0)[None] + 100.0
    plain = Rotary(16)(q, k, positions=qp, k_positions=kp)
    norm = Rotary(16, augmentation=Augmentation(normalize=True)).eval()(
        q, k, positions=qp, k_positions=kp
    )
    torch.testing.assert_close(
        norm[0] @ norm[1].transpose(-1, -2),
        plain[0] @ plain[1].transpose(-1, -2),
        atol=1e-3,
        rtol=1e-4,
    )


def test_2d_module_and_autocast():
    mod = Rotary(16, pos_dim=2)
    pos = torch.rand(2, 6, 2) * 2 - 1
    q = rand(2, 2, 6, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ang = mod.angles(pos)
        qr, _ = mod(q.bfloat16(), q.bfloat16(), positions=pos)
    assert ang.dtype == torch.float32 and qr.dtype == torch.bfloat16
    torch.testing.assert_close(ang, rotary_angles(pos, 16, mode="2d"))


def test_bad_arguments():
    for kwargs, error, name in [
        ({"head_dim": 7}, ValueError, "head_dim"),
        ({"head_dim": 8.0}, TypeError, "head_dim"),
        ({"head_dim": 8, "pos_dim": 3}, ValueError, "pos_dim"),
        ({"head_dim": 8, "base": 0.5}, ValueError, "base"),
        ({"head_dim": 8, "freq_scale": 0}, ValueError, "freq_scale"),
        ({"head_dim": 8, "augmentation": {"max_local_shift": 1}}, TypeError, "augmentation"),
    ]:
        with pytest.raises(error, match=name):
            Rotary(**kwargs)
    q = rand(1, 1, 4, 8)
    with pytest.raises(ValueError, match="positions"):
        Rotary(8, pos_dim=2)(q, q)
    with pytest.raises(ValueError, match="k_positions"):
        Rotary(8)(q, rand(1, 1, 5, 8))
    with pytest.raises(ValueError, match="q"):
        Rotary(16)(q, q)
    with pytest.raises(ValueError, match="positions"):
        Rotary(8)(q, q, positions=torch.tensor([[0.0, math.nan, 1.0, 2.0]]))
    with pytest.raises(ValueError, match="mode"):
        rotary_angles(torch.zeros(1, 4, 1), 8, mode="3d")
    with pytest.raises(ValueError, match="positions"):
        rotary_angles(torch.zeros(1, 4, 2), 8, mode="1d")
    with pytest.raises(ValueError, match="angles"):
        apply_rotary(q, torch.zeros(1, 4, 3))
