"""Learnable Fourier features: the init kernel by Monte Carlo, Algorithm 1 against NumPy,
variants."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cape.augment import Augmentation
from cape.encodings.fourier import LearnableFourierFeatures
from cape.functional.fourier import fourier_features, learnable_fourier_features, lff_kernel

_erf = np.vectorize(math.erf)


def np_gelu(x: np.ndarray) -> np.ndarray:
    """Exact GeLU, x Phi(x), written from its definition."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def np_algorithm1(X, Wr, W1=None, B1=None, W2=None, B2=None):
    """Algorithm 1 in float64 NumPy. X: [N, G, M] -> [N, D]."""
    X = np.asarray(X, np.float64)
    if Wr is None:
        feats = X
    else:
        Wr = np.asarray(Wr, np.float64)
        phase = X @ Wr.T  # [N, G, F/2]
        feats = np.concatenate([np.cos(phase), np.sin(phase)], -1) / math.sqrt(2 * Wr.shape[0])
    if W1 is None:
        Y = feats
    else:
        W1, B1, W2, B2 = (np.asarray(t, np.float64) for t in (W1, B1, W2, B2))
        Y = np_gelu(feats @ W1 + B1) @ W2 + B2
    return Y.reshape(X.shape[0], -1)


def mc_sigma(d2: float, gamma: float, features: int) -> float:
    """Std of (1/F) sum_{k<=F/2} cos(w_k . d) with w_k ~ N(0, gamma^-2 I)."""
    var_cos = 0.5 * (1.0 + math.exp(-2.0 * d2 / gamma**2)) - math.exp(-d2 / gamma**2)
    return math.sqrt(var_cos / (2.0 * features))


# -- the kernel at initialisation -----------------------------------------------------------------


@pytest.mark.parametrize("gamma", [0.5, 1.0, 2.0])
def test_dot_product_matches_gaussian_kernel_at_init(gamma):
    features = 20000
    torch.manual_seed(0)
    enc = LearnableFourierFeatures(features, 2, fourier_dim=features, mlp=False, gamma=gamma)
    centre = torch.tensor([0.3, -1.7])
    dists = [0.0, 0.25 * gamma, 0.5 * gamma, gamma, 1.5 * gamma, 2.5 * gamma]
    angles = torch.linspace(0.0, math.pi, len(dists))
    offsets = torch.stack([torch.cos(angles), torch.sin(angles)], -1) * torch.tensor(dists)[:, None]
    pos = torch.cat([centre[None], centre + offsets])[None]  # [1, 1 + K, 2]
    with torch.no_grad():
        r = enc(positions=pos)[0].double()
    dots = r[1:] @ r[0]
    paper_eq5_far = False
    for k, d in enumerate(dists):
        d2 = d * d
        expected = 0.5 * math.exp(-d2 / (2.0 * gamma**2))
        tol = 5.0 * mc_sigma(d2, gamma, features) + 1e-5  # 5 sigma Monte Carlo + float32 rounding
        assert abs(float(dots[k]) - expected) <= tol, (gamma, d, float(dots[k]), expected)
        assert float(lff_kernel(d2, gamma)) == pytest.approx(expected, rel=1e-6, abs=1e-7)
        paper_eq5_far |= abs(math.exp(-d2 / gamma**2) - expected) > 10 * tol
    assert paper_eq5_far  # the test tells the derived kernel from the paper's Eq. 5


def test_self_dot_is_one_half_exactly():
    torch.manual_seed(1)
    enc = LearnableFourierFeatures(512, 3, fourier_dim=512, mlp=False, gamma=0.3)
    r = enc(positions=torch.randn(2, 7, 3) * 50).double()
    torch.testing.assert_close(
        (r * r).sum(-1), torch.full((2, 7), 0.5, dtype=torch.float64), atol=2e-6, rtol=0
    )


@pytest.mark.parametrize("gamma", [0.25, 1.0, 4.0])
def test_init_std_is_one_over_gamma(gamma):
    torch.manual_seed(2)
    enc = LearnableFourierFeatures(32, 2, fourier_dim=20000, gamma=gamma)
    w = enc.w_r.detach().double()
    assert tuple(w.shape) == (10000, 2)
    assert float(w.std()) == pytest.approx(1.0 / gamma, rel=0.03)  # 20000 draws: ~0.5% error
    assert abs(float(w.mean())) < 0.05 / gamma


@settings(max_examples=20, deadline=None)
@given(st.lists(st.floats(-20, 20), min_size=2, max_size=2), st.floats(-100, 100))
def test_dot_product_is_shift_invariant(shift_xy, c):
    torch.manual_seed(3)
    weight = torch.randn(64, 2)
    x = torch.tensor([[0.5, -1.0], [2.0, 3.0]])
    shifted = x + torch.tensor(shift_xy) + c
    r, rs = fourier_features(x, weight).double(), fourier_features(shifted, weight).double()
    assert float(r[0] @ r[1]) == pytest.approx(float(rs[0] @ rs[1]), abs=2e-4)


# -- Algorithm 1 against NumPy --------------------------------------------------------------------


def test_fourier_features_match_numpy():
    g = torch.Generator().manual_seed(4)
    pos, weight = torch.randn(5, 3, 2, generator=g) * 3, torch.randn(8, 2, generator=g)
    out = fourier_features(pos, weight)
    assert out.dtype == torch.float32 and tuple(out.shape) == (5, 3, 16)
    ref = np_algorithm1(pos.numpy(), weight.numpy()).reshape(5, 3, 16)
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-6)


@pytest.mark.parametrize("groups, m", [(1, 4), (2, 2), (4, 1)])
def test_algorithm1_matches_numpy(groups, m):
    g = torch.Generator().manual_seed(5)
    f, h, d = 12, 8, 16
    pos = torch.randn(6, groups, m, generator=g)
    wr, w1, b1 = (
        torch.randn(f // 2, m, generator=g),
        torch.randn(f, h, generator=g),
        torch.randn(h, generator=g),
    )
    w2, b2 = torch.randn(h, d // groups, generator=g), torch.randn(d // groups, generator=g)
    out = learnable_fourier_features(pos, wr, w1, b1, w2, b2)
    ref = np_algorithm1(pos.numpy(), wr.numpy(), w1.numpy(), b1.numpy(), w2.numpy(), b2.numpy())
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-5, rtol=1e-5)
    mlp_only = learnable_fourier_features(pos, None, torch.randn(m, h), b1, w2, b2)
    assert tuple(mlp_only.shape) == (6, d)


def test_module_matches_numpy_with_its_parameters():
    torch.manual_seed(6)
    enc = LearnableFourierFeatures(32, 2, groups=2, fourier_dim=10, hidden_dim=6, gamma=0.7)
    pos = torch.randn(2, 5, 2, 2)
    out = enc(positions=pos)
    p = {k: v.detach().numpy() for k, v in enc.state_dict().items()}
    ref = np_algorithm1(pos.reshape(10, 2, 2).numpy(), p["w_r"], p["w1"], p["b1"], p["w2"], p["b2"])
    np.testing.assert_allclose(out.detach().reshape(10, 32).numpy(), ref, atol=1e-5, rtol=1e-5)
    # [B, T, G*M] flattened positions give the same result
    torch.testing.assert_close(enc(positions=pos.flatten(2)), out)


# -- module variants ------------------------------------------------------------------------------


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_box_shapes_for_each_grouping(groups):
    enc = LearnableFourierFeatures(64, 4 // groups, groups=groups, fourier_dim=16, hidden_dim=8)
    assert enc.pos_dim == 4
    out = enc(torch.zeros(3, 7, 64), positions=torch.rand(3, 7, 4))
    assert tuple(out.shape) == (3, 7, 64)
    assert tuple(enc.w2.shape) == (8, 64 // groups)


def test_groups_share_weights():
    torch.manual_seed(7)
    enc = LearnableFourierFeatures(24, 2, groups=3, fourier_dim=8, hidden_dim=5)
    pos = torch.randn(2, 4, 3, 2)
    perm = [2, 0, 1]
    out = enc(positions=pos).unflatten(-1, (3, 8))
    out_perm = enc(positions=pos[:, :, perm]).unflatten(-1, (3, 8))
    torch.testing.assert_close(out_perm, out[:, :, perm])


def test_gradient_reaches_learnable_wr_and_fixed_wr_is_a_buffer():
    enc = LearnableFourierFeatures(16, 2, fourier_dim=8, hidden_dim=4)
    enc(positions=torch.randn(1, 3, 2)).square().sum().backward()
    assert isinstance(enc.w_r, torch.nn.Parameter) and enc.w_r.grad is not None
    assert float(enc.w_r.grad.abs().sum()) > 0

    fixed = LearnableFourierFeatures(16, 2, fourier_dim=8, hidden_dim=4, learnable=False)
    assert "w_r" in dict(fixed.named_buffers()) and "w_r" not in dict(fixed.named_parameters())
    assert "w_r" in fixed.state_dict()
    fixed(positions=torch.randn(1, 3, 2)).square().sum().backward()
    assert not fixed.w_r.requires_grad and fixed.w_r.grad is None
    assert fixed.w1.grad is not None


def test_mlp_only_and_fourier_only():
    torch.manual_seed(8)
    mlp = LearnableFourierFeatures(12, 3, fourier=False, hidden_dim=5)
    assert mlp.w_r is None and tuple(mlp.w1.shape) == (3, 5)
    pos = torch.randn(2, 4, 3)
    ref = torch.nn.functional.gelu(pos @ mlp.w1 + mlp.b1) @ mlp.w2 + mlp.b2
    torch.testing.assert_close(mlp(positions=pos), ref)

    four = LearnableFourierFeatures(12, 1, groups=2, fourier_dim=6, mlp=False)
    assert four.w1 is None and len(list(four.parameters())) == 1
    pos = torch.randn(2, 4, 2)
    ref = torch.cat(
        [fourier_features(pos[..., :1], four.w_r), fourier_features(pos[..., 1:], four.w_r)], -1
    )
    torch.testing.assert_close(four(positions=pos), ref)


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(dim=30, groups=4), ValueError, ["dim", "groups"]),
        (dict(dim=32, fourier_dim=7), ValueError, ["fourier_dim"]),
        (dict(dim=32, groups=2, fourier_dim=8, mlp=False), ValueError, ["fourier_dim", "16"]),
        (dict(dim=32, mlp=False, fourier=False), ValueError, ["mlp", "fourier"]),
        (dict(dim=32, gamma=0.0), ValueError, ["gamma"]),
        (dict(dim=32, hidden_dim=0), ValueError, ["hidden_dim"]),
        (dict(dim=32, groups=1.5), TypeError, ["groups"]),
        (dict(dim=32, learnable=1), TypeError, ["learnable"]),
        (dict(dim=32, pos_dim=0), ValueError, ["pos_dim"]),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, exc, words):
    with pytest.raises(exc) as info:
        LearnableFourierFeatures(**kwargs)
    assert all(w in str(info.value) for w in words)


def test_bad_positions_and_functional_arguments():
    enc = LearnableFourierFeatures(16, 2, groups=2, fourier_dim=8, hidden_dim=4)
    bad = torch.zeros(1, 3, 4)
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="positions"):
        enc(positions=bad)
    with pytest.raises(ValueError, match="positions"):
        enc(positions=torch.zeros(1, 3, 2, 3))  # [B, T, G, M] with the wrong M
    with pytest.raises(ValueError, match="positions"):
        enc(positions=torch.zeros(1, 3, 3))
    with pytest.raises(ValueError, match="reads 4-D positions"):
        enc(torch.zeros(1, 3, 16))
    with pytest.raises(ValueError, match="gamma"):
        lff_kernel(1.0, -1.0)
    with pytest.raises(ValueError, match="positions"):
        fourier_features(torch.zeros(3, 3), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="mlp"):
        learnable_fourier_features(torch.zeros(2, 1, 2), None, mlp=False)
    with pytest.raises(ValueError, match="w1"):
        learnable_fourier_features(
            torch.zeros(2, 1, 2),
            torch.zeros(3, 2),
            torch.zeros(5, 4),
            torch.zeros(4),
            torch.zeros(4, 2),
            torch.zeros(2),
        )


# -- plumbing: padding, augmentation, dtypes, checkpoints -----------------------------------------


def test_padding_is_zero_and_augmentation_acts_on_flattened_positions():
    torch.manual_seed(9)
    aug = Augmentation(max_global_shift=(1.0, 2.0, 3.0, 4.0), max_global_scaling=1.5)
    enc = LearnableFourierFeatures(16, 2, groups=2, fourier_dim=8, hidden_dim=4, augmentation=aug)
    pos = torch.randn(2, 5, 2, 2)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    out = enc.eval()(positions=pos, mask=mask)  # eval: no draws, positions as given
    assert float(out[1, 2:].detach().abs().sum()) == 0.0
    torch.testing.assert_close(out[0], enc.embed(pos.flatten(2))[0])
    enc.train()
    trained = enc(positions=pos, generator=torch.Generator().manual_seed(3))
    flat = aug(pos.flatten(2), training=True, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(trained, enc.embed(flat))
    assert not torch.allclose(trained, enc.eval()(positions=pos))  # the draws did change it


def test_bf16_module_computes_in_float32():
    torch.manual_seed(10)
    enc = LearnableFourierFeatures(16, 2, fourier_dim=8, hidden_dim=4).to(torch.bfloat16)
    pos = torch.randn(2, 3, 2) * 10
    out = enc(torch.zeros(2, 3, 16, dtype=torch.bfloat16), positions=pos)
    assert out.dtype == torch.bfloat16
    p = {k: v.float() for k, v in enc.state_dict().items()}
    ref = learnable_fourier_features(pos[:, :, None], p["w_r"], p["w1"], p["b1"], p["w2"], p["b2"])
    torch.testing.assert_close(out, ref.to(torch.bfloat16))


@pytest.mark.parametrize(
    "kwargs", [dict(), dict(learnable=False), dict(fourier=False), dict(mlp=False, fourier_dim=16)]
)
def test_state_dict_round_trip(kwargs):
    torch.manual_seed(11)
    a = LearnableFourierFeatures(16, 2, hidden_dim=4, **{"fourier_dim": 8, **kwargs})
    torch.manual_seed(12)
    b = LearnableFourierFeatures(16, 2, hidden_dim=4, **{"fourier_dim": 8, **kwargs})
    pos = torch.randn(2, 3, 2)
    assert not torch.equal(a(positions=pos), b(positions=pos))
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a(positions=pos), b(positions=pos), rtol=0, atol=0)
