"""Step 2 of the data flow: CAPE's augmentation of positions (CAPE sec. 4, appendix A).

The random draws are recovered black-box: draws do not depend on the position values, and an
amount only scales its unit draw, so runs with the same generator seed on special inputs (zeros,
ones, the same draws with another amount) isolate Delta, eps and lambda. The result is then checked
against appendix A's NumPy `augment_positions_1d` fed with the same draws.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cape.augment import (
    Augmentation,
    augment_pair,
    augment_positions,
    check_augmentation,
    mean_normalize,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def run(p, mask=None, seed=0, **kw):
    return augment_positions(p, mask, generator=gen(seed), **kw)


# -- appendix A, verbatim apart from the rng argument's default --------------------------------


def augment_positions_1d(
    positions_1d: np.ndarray,
    normalize: bool,
    max_global_shift,  # delta max
    max_local_shift,  # epsilon max
    max_scale,  # lambda max
    rng,
):
    assert max_scale >= 1
    batch_size, n_tokens = positions_1d.shape
    if normalize:
        positions_1d -= np.nanmean(positions_1d, axis=1, keepdims=True)
    delta = rng.uniform(-max_global_shift, +max_global_shift, size=[batch_size, 1])
    delta_local = rng.uniform(-max_local_shift, +max_local_shift, size=[batch_size, n_tokens])
    log_lambdas = rng.uniform(-np.log(max_scale), +np.log(max_scale), size=[batch_size, 1])

    new_positions = (positions_1d + delta + delta_local) * np.exp(log_lambdas)
    return new_positions


class ReplayRNG:
    """A NumPy-RandomState stand-in that returns given U(0, 1) draws, rescaled to [low, high)."""

    def __init__(self, unit_draws):
        self.queue = list(unit_draws)

    def uniform(self, low, high, size):
        u = self.queue.pop(0)
        assert u.shape == tuple(size)
        return low + (high - low) * u


def ks_uniform(samples: np.ndarray, low: float, high: float) -> float:
    """Kolmogorov-Smirnov statistic of `samples` against U(low, high), by hand."""
    x = np.sort((np.asarray(samples, dtype=np.float64) - low) / (high - low))
    n = len(x)
    cdf = np.clip(x, 0.0, 1.0)
    d_plus = np.max(np.arange(1, n + 1) / n - cdf)
    d_minus = np.max(cdf - np.arange(n) / n)
    return float(max(d_plus, d_minus))


def ks_critical(n: int, alpha: float = 0.001) -> float:
    return math.sqrt(-0.5 * math.log(alpha / 2)) / math.sqrt(n)


# -- recovering the draws --------------------------------------------------------------------


def recover(batch, length, axes, seed, dmax, emax, lmax, mask=None):
    """(Delta [B, 1, M], eps [B, T, M], lambda [B, T, M]) drawn by one seed, black-box."""
    zeros = torch.zeros(batch, length, axes)
    kw = dict(max_local_shift=emax, max_global_scaling=lmax, mask=mask, seed=seed)
    out0 = run(zeros, max_global_shift=dmax, **kw).double()  # (D + e) * l
    out1 = run(zeros + 1, max_global_shift=dmax, **kw).double()  # (1 + D + e) * l
    out2 = run(zeros, max_global_shift=2 * dmax, **kw).double()  # (2 D + e) * l
    lam = out1 - out0
    delta = (out2 - out0) / lam
    eps = out0 / lam - delta
    return delta, eps, lam


def test_recovered_draws_reassemble_in_paper_order():
    # p' = (p + Delta + eps) * lambda, checked with independently recovered Delta, eps, lambda
    b, t, m = 6, 9, 2
    dmax, emax, lmax = 3.0, 0.4, 2.0
    delta, eps, lam = recover(b, t, m, seed=5, dmax=dmax, emax=emax, lmax=lmax)
    p = torch.randn(b, t, m, generator=gen(1), dtype=torch.float64) * 7
    out = run(p, seed=5, max_global_shift=dmax, max_local_shift=emax, max_global_scaling=lmax)
    expected = (p + delta + eps) * lam
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
    # and not the other orders: scale first, or shifts after scaling
    assert not np.allclose(out.numpy(), (p * lam + delta + eps).numpy(), atol=1e-3)
    # global shift: one per sample and axis
    assert torch.allclose(delta, delta[:, :1].expand_as(delta), atol=1e-5)
    assert (delta[:, 0, 0] - delta[:, 0, 1]).abs().max() > 1e-3
    # lambda: one per sample, shared by the axes and tokens
    assert torch.allclose(lam, lam[:, :1, :1].expand_as(lam), rtol=1e-6)
    assert lam[:, 0, 0].std() > 1e-3
    assert delta.abs().max() <= dmax + 1e-5
    assert eps.abs().max() <= emax + 1e-5
    assert (lam >= 1 / lmax - 1e-6).all() and (lam <= lmax + 1e-6).all()


@pytest.mark.parametrize("normalize", [False, True])
def test_matches_appendix_a_with_the_same_draws(normalize):
    b, t = 5, 11
    dmax, emax, lmax = 4.0, 0.5, 1.5
    seed = 3
    g = gen(seed)  # the documented draw order: shift [B, M], scale [B], local [T, B, M]
    u_shift = torch.rand((b, 1), generator=g).double().numpy()
    u_scale = torch.rand((b,), generator=g).double().numpy()
    u_local = torch.rand((t, b, 1), generator=g).double().numpy()[:, :, 0].T
    lengths = np.array([11, 7, 1, 9, 4])
    mask = torch.arange(t)[None, :] < torch.as_tensor(lengths)[:, None]
    pos = np.random.RandomState(0).uniform(-20, 50, size=(b, t))
    pos_nan = np.where(mask.numpy(), pos, np.nan)  # appendix A: NaN marks padding
    ref = augment_positions_1d(
        pos_nan.copy(),
        normalize,
        dmax,
        emax,
        lmax,
        rng=ReplayRNG([u_shift, u_local, u_scale[:, None]]),
    )
    out = augment_positions(
        torch.tensor(pos_nan, dtype=torch.float32)[..., None],
        mask,
        max_global_shift=dmax,
        max_local_shift=emax,
        max_global_scaling=lmax,
        normalize=normalize,
        generator=gen(seed),
    )
    valid = mask.numpy()
    np.testing.assert_allclose(out[..., 0].numpy()[valid], ref[valid], rtol=1e-5, atol=1e-4)
    assert (out[..., 0].numpy()[~valid] == 0).all()


# -- bounds and sharing --------------------------------------------------------------------


def test_global_shift_bounds_and_sharing_per_sample_and_axis():
    b, t = 400, 5
    dmax = (0.25, 6.0)
    out = run(torch.zeros(b, t, 2), seed=1, max_global_shift=dmax)
    delta = out[:, 0, :]
    assert torch.equal(out, delta[:, None, :].expand_as(out))  # all tokens of a sample
    for axis in range(2):
        a = delta[:, axis].abs()
        assert a.max() <= dmax[axis]
        assert a.max() > 0.97 * dmax[axis]  # the bound is reached, not a smaller one
    assert (delta[:, 0] != delta[:, 1]).all()  # axes draw separately
    assert ks_uniform(delta[:, 1].numpy(), -6.0, 6.0) < ks_critical(b)


def test_local_shift_bounds_and_independence():
    b, t = 20, 100
    out = run(torch.zeros(b, t, 3), seed=2, max_local_shift=0.3)
    assert out.abs().max() <= 0.3
    assert out.abs().max() > 0.29
    assert ks_uniform(out.flatten().numpy(), -0.3, 0.3) < ks_critical(out.numel())
    # per token and per axis: no two tokens share their shift
    assert out.flatten().unique().numel() > 0.99 * out.numel()


def test_scale_bounds_sharing_and_log_uniform_ks():
    n, lmax = 4000, 3.0
    out = run(torch.ones(n, 4, 2), seed=7, max_global_scaling=lmax)
    lam = out[:, 0, 0]
    assert torch.equal(out, lam[:, None, None].expand_as(out))  # tokens and axes share lambda
    assert lam.min() >= 1 / lmax - 1e-6 and lam.max() <= lmax + 1e-6
    log_l = np.log(lam.double().numpy())
    stat = ks_uniform(log_l, -math.log(lmax), math.log(lmax))
    assert stat < ks_critical(n)
    # the test has power: lambda itself is not uniform on [1/L, L]
    assert ks_uniform(lam.double().numpy(), 1 / lmax, lmax) > ks_critical(n)


def test_amounts_scale_the_same_unit_draws():
    # the recovery above relies on this; check it directly with one axis
    p = torch.zeros(3, 4, 1)
    a = run(p, seed=0, max_local_shift=1.0)
    b = run(p, seed=0, max_local_shift=2.5)
    torch.testing.assert_close(b, 2.5 * a)


# -- order and normalisation ----------------------------------------------------------------


def test_order_preserved_when_local_shift_at_most_half_spacing():
    b, t = 50, 200
    p = torch.arange(t, dtype=torch.float32)[None, :, None].expand(b, t, 1)
    out = run(p, seed=4, max_global_shift=5.0, max_local_shift=0.5, max_global_scaling=2.0)
    assert (out.diff(dim=1) >= 0).all()
    # and the check has power: a larger local shift swaps neighbours
    out = run(p, seed=4, max_global_shift=5.0, max_local_shift=1.5, max_global_scaling=2.0)
    assert (out.diff(dim=1) < 0).any()


def test_mean_normalisation_over_valid_tokens_matches_nanmean():
    b, t, m = 4, 9, 2
    pos = np.random.RandomState(1).uniform(-30, 80, size=(b, t, m))
    lengths = np.array([9, 3, 1, 6])
    valid = np.arange(t)[None, :] < lengths[:, None]
    pos_nan = np.where(valid[..., None], pos, np.nan)
    expected = pos_nan - np.nanmean(pos_nan, axis=1, keepdims=True)
    mask = torch.as_tensor(valid)
    for fn in (
        lambda x: mean_normalize(x, mask),
        lambda x: augment_positions(x, mask, normalize=True, training=False, max_global_shift=3.0),
    ):
        out = fn(torch.tensor(pos_nan, dtype=torch.float32)).numpy()
        np.testing.assert_allclose(out[valid], expected[valid], rtol=1e-5, atol=1e-5)
    out = augment_positions(torch.tensor(pos_nan, dtype=torch.float32), mask, normalize=True)
    assert (out[~mask] == 0).all()


def test_mean_normalisation_without_mask_and_empty_sample():
    p = torch.tensor([[[1.0], [2.0], [6.0]], [[5.0], [5.0], [5.0]]])
    out = augment_positions(p, normalize=True, training=False)
    np.testing.assert_allclose(out[..., 0].numpy(), [[-2.0, -1.0, 3.0], [0.0, 0.0, 0.0]], atol=1e-6)
    mask = torch.tensor([[False, False, False], [True, True, False]])
    out = augment_positions(p, mask, normalize=True, training=False)
    assert torch.isfinite(out).all() and (out[0] == 0).all()


def test_eval_mode_is_normalisation_only_and_draws_nothing():
    p = torch.randn(3, 8, 2) * 10
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[1, 5:] = False
    g = gen(0)
    state = g.get_state()
    kw = dict(max_global_shift=5.0, max_local_shift=0.5, max_global_scaling=2.0)
    out = augment_positions(p, mask, training=False, generator=g, **kw)
    assert torch.equal(out, torch.where(mask[..., None], p, 0.0))
    out = augment_positions(p, mask, training=False, normalize=True, generator=g, **kw)
    torch.testing.assert_close(out, torch.where(mask[..., None], mean_normalize(p, mask), 0.0))
    assert torch.equal(g.get_state(), state)


# -- padding invariance, reproducibility, devices ------------------------------------------


def _padded_pair(seed):
    torch.manual_seed(seed)
    p = torch.randn(3, 7, 2) * 10
    mask = torch.rand(3, 7) > 0.3
    mask[:, 0] = True
    p2 = torch.cat([p, torch.randn(3, 13, 2) * 100], dim=1)
    mask2 = torch.cat([mask, torch.zeros(3, 13, dtype=torch.bool)], dim=1)
    return p, mask, p2, mask2


@pytest.mark.parametrize("training", [False, True])
def test_padding_invariance_exact_without_normalisation(training):
    p, mask, p2, mask2 = _padded_pair(0)
    kw = dict(max_global_shift=2.0, max_local_shift=0.5, max_global_scaling=2.0, training=training)
    a = run(p, mask, seed=11, **kw)
    b = run(p2, mask2, seed=11, **kw)
    assert torch.equal(a, b[:, :7])
    assert (b[:, 7:] == 0).all()


@pytest.mark.parametrize("training", [False, True])
def test_padding_invariance_with_normalisation(training):
    # the masked mean must not depend on how much padding follows (not even in the last bit)
    kw = dict(
        max_global_shift=2.0,
        max_local_shift=0.5,
        max_global_scaling=2.0,
        training=training,
        normalize=True,
    )
    for seed in range(30):
        p, mask, p2, mask2 = _padded_pair(seed)
        a = run(p, mask, seed=seed, **kw)
        b = run(p2, mask2, seed=seed, **kw)
        assert torch.equal(a, b[:, :7]), f"seed {seed}"
        assert (b[:, 7:] == 0).all()


def test_reproducible_with_generator():
    p = torch.randn(4, 10, 2)
    kw = dict(max_global_shift=2.0, max_local_shift=0.5, max_global_scaling=1.5, normalize=True)
    a, b, c = run(p, seed=1, **kw), run(p, seed=1, **kw), run(p, seed=2, **kw)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    # the global RNG is used (and advanced) without a generator
    torch.manual_seed(9)
    d = augment_positions(p, **kw)
    e = augment_positions(p, **kw)
    assert not torch.equal(d, e)
    torch.manual_seed(9)
    assert torch.equal(augment_positions(p, **kw), d)


def test_train_mode_draws_per_sample():
    p = torch.arange(6.0)[None, :, None].expand(4, 6, 1)
    out = run(p, seed=0, max_global_shift=3.0, max_global_scaling=1.5)
    for i in range(4):
        for j in range(i + 1, 4):
            assert not torch.allclose(out[i], out[j])


def test_draws_on_positions_device_meta():
    pm = torch.zeros(2, 3, 1, device="meta")
    out = augment_positions(pm, max_local_shift=1.0, max_global_shift=1.0, max_global_scaling=2.0)
    assert out.device.type == "meta" and out.shape == (2, 3, 1)
    with pytest.raises(ValueError, match="generator"):
        augment_positions(pm, max_local_shift=1.0, generator=torch.Generator())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_draws_on_positions_device_cuda():
    p = torch.zeros(2, 3, 1, device="cuda")
    out = augment_positions(
        p, max_local_shift=1.0, generator=torch.Generator("cuda").manual_seed(0)
    )
    assert out.device.type == "cuda"
    with pytest.raises(ValueError, match="generator"):
        augment_positions(p, max_local_shift=1.0, generator=torch.Generator())
    with pytest.raises(ValueError, match="generator"):
        augment_positions(p.cpu(), max_local_shift=1.0, generator=torch.Generator("cuda"))


# -- amounts --------------------------------------------------------------------------------


def test_per_sample_tensor_amounts():
    emax = torch.tensor([[0.1, 1.0], [2.0, 0.5], [0.0, 3.0]])
    out = run(torch.zeros(3, 400, 2), seed=3, max_local_shift=emax)
    bound = out.abs().amax(dim=1)  # [B, M]
    assert (bound <= emax).all()
    assert (bound >= 0.95 * emax).all()
    dmax = torch.tensor([[0.1], [4.0], [1.0]])  # [B, 1]: per sample, shared by axes
    delta = run(torch.zeros(3, 2, 2), seed=3, max_global_shift=dmax)[:, 0, :]
    assert (delta.abs() <= dmax).all()
    dper_axis = torch.tensor([0.0, 2.0])  # [M]: per axis
    delta = run(torch.zeros(50, 2, 2), seed=3, max_global_shift=dper_axis)[:, 0, :]
    assert (delta[:, 0] == 0).all() and (delta[:, 1].abs() <= 2.0).all()
    assert delta[:, 1].abs().max() > 1.5


def test_per_axis_tuple_amounts():
    out = run(torch.zeros(2, 300, 2), seed=0, max_local_shift=(0.01, 1.0))
    assert out[..., 0].abs().max() <= 0.01 and out[..., 1].abs().max() > 0.9
    with pytest.raises(ValueError, match="max_local_shift"):
        run(torch.zeros(2, 3, 2), max_local_shift=(0.1, 0.2, 0.3))
    with pytest.raises(ValueError, match="max_global_shift"):
        run(torch.zeros(2, 3, 3), max_global_shift=(0.1, 0.2))
    with pytest.raises(ValueError, match="max_global_shift"):
        Augmentation(max_global_shift=())(torch.zeros(2, 3, 1))


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(max_global_shift=-1.0), "max_global_shift"),
        (dict(max_local_shift=-0.1), "max_local_shift"),
        (dict(max_local_shift=(0.1, -0.1)), "max_local_shift"),
        (dict(max_global_shift=math.nan), "max_global_shift"),
        (dict(max_local_shift=math.inf), "max_local_shift"),
        (dict(max_global_scaling=0.9), "max_global_scaling"),
        (dict(max_global_scaling=0.0), "max_global_scaling"),
        (dict(max_global_scaling=math.inf), "max_global_scaling"),
    ],
)
def test_bad_amounts_raise_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Augmentation(**kwargs)
    with pytest.raises(ValueError, match=name):
        augment_positions(torch.zeros(2, 3, 2), **kwargs)
    with pytest.raises(ValueError, match=name):
        augment_pair(torch.zeros(2, 3, 2), torch.zeros(2, 4, 2), **kwargs)


def test_bad_inputs():
    with pytest.raises(TypeError, match="positions"):
        augment_positions(torch.zeros(2, 3, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="positions"):
        augment_positions(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="mask"):
        augment_positions(torch.zeros(2, 3, 1), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        augment_positions(torch.zeros(2, 3, 1), torch.ones(2, 3))
    with pytest.raises(TypeError, match="normalize"):
        Augmentation(normalize=1)


def test_output_float32_and_augmentation_object_matches_function():
    p = torch.randn(2, 5, 1, dtype=torch.float64)
    assert augment_positions(p).dtype == torch.float32
    aug = Augmentation(2.0, 0.3, 1.2, normalize=True)
    assert aug.random and not Augmentation(normalize=True).random
    a = aug(p, generator=gen(4))
    b = augment_positions(
        p,
        max_global_shift=2.0,
        max_local_shift=0.3,
        max_global_scaling=1.2,
        normalize=True,
        generator=gen(4),
    )
    assert torch.equal(a, b)
    assert torch.equal(Augmentation()(p), p.float())  # nothing on: identity


# -- encoder-decoder pairs ------------------------------------------------------------------


def _pair(seed=0, s=6, t=9, b=5, **kw):
    src = torch.zeros(b, s, 1)
    tgt = torch.zeros(b, t, 1)
    return augment_pair(src, tgt, generator=gen(seed), **kw)


def test_pair_same_global_shift_and_scale():
    s_out, t_out = _pair(max_global_shift=5.0)
    delta = s_out[:, :1]
    assert torch.equal(s_out, delta.expand_as(s_out)) and torch.equal(t_out, delta.expand_as(t_out))
    assert delta.abs().max() <= 5.0 and delta.std() > 0.1
    ones_s, ones_t = torch.ones(5, 6, 1), torch.ones(5, 9, 1)
    s_out, t_out = augment_pair(ones_s, ones_t, max_global_scaling=2.0, generator=gen(1))
    lam = t_out[:, :1]
    assert torch.equal(t_out, lam.expand_as(t_out))
    torch.testing.assert_close(s_out, lam.expand_as(s_out))
    assert lam.std() > 0.01


def test_pair_independent_local_shifts():
    s_out, t_out = _pair(s=8, t=8, max_local_shift=0.5)
    assert s_out.abs().max() <= 0.5 and t_out.abs().max() <= 0.5
    assert not torch.allclose(s_out, t_out)
    # within a sample, tokens differ
    assert s_out[0].unique().numel() == 8


def test_pair_alpha_and_no_normalisation():
    src = torch.arange(1.0, 8.0)[None, :, None].expand(2, 7, 1)
    tgt = torch.arange(1.0, 10.0)[None, :, None].expand(2, 9, 1)
    s_out, t_out = augment_pair(src, tgt, alpha=1.25, training=False, max_global_shift=5.0)
    torch.testing.assert_close(s_out, src * 1.25)  # not centred
    assert torch.equal(t_out, tgt)
    # train: source scaled by alpha, then the shared shift and scale
    s_out, t_out = augment_pair(
        src, tgt, alpha=1.25, max_global_shift=5.0, max_global_scaling=1.5, generator=gen(2)
    )
    lam = (t_out[:, 1] - t_out[:, 0])[:, None]  # unit spacing in the target
    shift_t = t_out / lam - tgt
    shift_s = s_out / lam - 1.25 * src
    torch.testing.assert_close(shift_s, shift_t[:, :1].expand_as(shift_s), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shift_t, shift_t[:, :1].expand_as(shift_t), rtol=1e-5, atol=1e-5)


def test_pair_masks_and_errors():
    src, tgt = torch.ones(2, 4, 1), torch.ones(2, 5, 1)
    sm = torch.tensor([[True] * 4, [True, True, False, False]])
    tm = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    s_out, t_out = augment_pair(
        src,
        tgt,
        sm,
        tm,
        max_global_shift=1.0,
        max_local_shift=0.1,
        max_global_scaling=1.5,
        generator=gen(0),
    )
    assert (s_out[~sm] == 0).all() and (t_out[~tm] == 0).all()
    assert (s_out[sm] != 0).all()
    with pytest.raises(ValueError, match="alpha"):
        augment_pair(src, tgt, alpha=0.0)
    with pytest.raises(ValueError):
        augment_pair(torch.ones(3, 4, 1), tgt)
    with pytest.raises(ValueError):
        augment_pair(torch.ones(2, 4, 2), tgt)


def test_check_augmentation_takes_an_augmentation_or_none_and_names_the_argument():
    aug = Augmentation(max_global_shift=1.0)
    assert check_augmentation(aug) is aug and check_augmentation(None) is None
    for bad in ({"max_global_shift": 1.0}, "aug", 3, (1.0, 0.5)):
        with pytest.raises(TypeError, match=r"^position_aug must be a cape\.Augmentation or None"):
            check_augmentation(bad, "position_aug")


def test_augmentation_pair_is_augment_pair_with_its_fields() -> None:
    aug = Augmentation(max_global_shift=3.0, max_local_shift=0.4, max_global_scaling=1.5)
    src, tgt = torch.randn(2, 5, 1), torch.randn(2, 4, 1)
    got = aug.pair(src, tgt, alpha=1.2, generator=torch.Generator().manual_seed(0))
    want = augment_pair(
        src, tgt, alpha=1.2, max_global_shift=3.0, max_local_shift=0.4, max_global_scaling=1.5,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(got[0], src * 1.2)  # something was drawn
