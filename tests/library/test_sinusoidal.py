"""Sinusoidal encodings: sinusoidal_1d / sinusoidal_2d / axial_sinusoidal and CAPE1d, CAPE2d,
SineND.

References are independent NumPy float64 re-implementations, the closed form of the dot product
(CAPE sec. 3), and appendix A's `CAPE_2d` copied verbatim.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cape.augment import Augmentation, augment_positions
from cape.encodings.axial import SineND
from cape.encodings.sinusoidal import PRESETS, CAPE1d, CAPE2d
from cape.functional.sinusoidal import (
    axial_sinusoidal,
    cape2d_frequencies,
    sinusoid_frequencies,
    sinusoidal_1d,
    sinusoidal_2d,
)
from cape.positions import timestamps, token_positions

# -- references -----------------------------------------------------------------------------


def np_omega(dim, base=10000.0, freq_scale=1.0):
    k = np.arange(dim // 2, dtype=np.float64)
    return freq_scale * base ** (-2.0 * k / dim)


def np_sinusoid_1d(p, dim, base=10000.0, freq_scale=1.0, omega=None):
    omega = np_omega(dim, base, freq_scale) if omega is None else omega
    phase = np.asarray(p, dtype=np.float64)[..., None] * omega
    return np.concatenate([np.cos(phase), np.sin(phase)], axis=-1)


def CAPE_2d(  # noqa: N802  appendix A, verbatim apart from the `rho_form` switch
    n_patches: int,  # number of patches, default in ViT is 14
    batch_size: int,
    augment: bool,
    n_channels: int,  # embedding size for one patch
    max_global_shift,  # delta max
    max_local_shift,  # epsilon max
    max_scale,  # lambda max
    rng=np.random.RandomState(42),  # noqa: B008
    rho_form="exact",
):
    """
    Prepares grid of CAPE embeddings for provided grid size
    """
    x = np.zeros([batch_size, n_patches, n_patches])
    y = np.zeros([batch_size, n_patches, n_patches])
    x += np.linspace(-1, 1, n_patches)[None, :, None]
    y += np.linspace(-1, 1, n_patches)[None, None, :]

    if augment:
        # global shift
        x += rng.uniform(-max_global_shift, +max_global_shift, size=[batch_size, 1, 1])
        y += rng.uniform(-max_global_shift, +max_global_shift, size=[batch_size, 1, 1])
        # local shift
        x += rng.uniform(-max_local_shift, +max_local_shift, size=x.shape)
        y += rng.uniform(-max_local_shift, +max_local_shift, size=y.shape)
        # scaling
        lambdas = np.exp(
            rng.uniform(-np.log(max_scale), +np.log(max_scale), size=[batch_size, 1, 1])
        )
        x *= lambdas
        y *= lambdas

    assert n_channels % 2 == 0
    half_channels = n_channels // 2
    if rho_form == "exact":
        rho = 10 ** (np.arange(1, half_channels + 1) / half_channels)
    else:
        # recommended simpler approximate implementation
        rho = 10 ** np.linspace(0, 1, half_channels)
    w_x = rho * np.cos(np.arange(half_channels))
    w_y = rho * np.sin(np.arange(half_channels))

    phase = np.pi * (w_x * x[:, :, :, None] + w_y * y[:, :, :, None])
    return np.concatenate([np.cos(phase), np.sin(phase)], axis=-1)


def CAPE_2d_xy(n_patches, batch_size, augment, max_global_shift, max_local_shift, max_scale, rng):  # noqa: N802
    """The positions `CAPE_2d` builds (its first half, verbatim): x, y [B, N, N]."""
    x = np.zeros([batch_size, n_patches, n_patches])
    y = np.zeros([batch_size, n_patches, n_patches])
    x += np.linspace(-1, 1, n_patches)[None, :, None]
    y += np.linspace(-1, 1, n_patches)[None, None, :]
    if augment:
        x += rng.uniform(-max_global_shift, +max_global_shift, size=[batch_size, 1, 1])
        y += rng.uniform(-max_global_shift, +max_global_shift, size=[batch_size, 1, 1])
        x += rng.uniform(-max_local_shift, +max_local_shift, size=x.shape)
        y += rng.uniform(-max_local_shift, +max_local_shift, size=y.shape)
        lambdas = np.exp(
            rng.uniform(-np.log(max_scale), +np.log(max_scale), size=[batch_size, 1, 1])
        )
        x *= lambdas
        y *= lambdas
    return x, y


def np_rho(half, rho_form):
    if rho_form == "exact":
        return 10 ** (np.arange(1, half + 1) / half)
    return 10 ** np.linspace(0, 1, half)


def np_cape2d_grid(height, width, dim, rho_form="exact", extent=1.0):
    """CAPE 2D sinusoid on an H x W grid, x along the width, y along the height: [H, W, D]."""
    half = dim // 2
    rho = np_rho(half, rho_form)
    w_x, w_y = rho * np.cos(np.arange(half)), rho * np.sin(np.arange(half))
    xs = np.zeros(1) if width == 1 else np.linspace(-extent, extent, width)
    ys = np.zeros(1) if height == 1 else np.linspace(-extent, extent, height)
    yy, xx = np.meshgrid(ys, xs, indexing="ij")
    phase = np.pi * (w_x * xx[..., None] + w_y * yy[..., None])
    return np.concatenate([np.cos(phase), np.sin(phase)], axis=-1)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def close(actual, expected, atol=1e-4):
    np.testing.assert_allclose(
        actual.detach().double().numpy(), np.asarray(expected, dtype=np.float64), rtol=0, atol=atol
    )


# -- 1D -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [2, 8, 64])
@pytest.mark.parametrize("freq_scale,base", [(1.0, 10000.0), (30.0, 10000.0), (1.0, 100.0)])
def test_frequencies(dim, freq_scale, base):
    omega = sinusoid_frequencies(dim, base=base, freq_scale=freq_scale)
    assert omega.dtype == torch.float32 and omega.shape == (dim // 2,)
    np.testing.assert_allclose(omega.double().numpy(), np_omega(dim, base, freq_scale), rtol=1e-7)
    assert omega[0].item() == freq_scale  # k = 0: 10000^0


@pytest.mark.parametrize("dim", [2, 8, 64])
def test_sinusoidal_1d_matches_numpy(dim):
    p = torch.empty(2, 3, 5).uniform_(-100, 100, generator=gen(dim))
    out = sinusoidal_1d(p, dim)
    assert out.shape == (2, 3, 5, dim) and out.dtype == torch.float32
    close(out, np_sinusoid_1d(p.double().numpy(), dim), atol=1e-4)
    # [cos || sin] layout
    close(out[..., : dim // 2], np.cos(p.double().numpy()[..., None] * np_omega(dim)), atol=1e-4)


def test_sinusoidal_1d_freq_scale_and_base():
    t = torch.empty(4, 7).uniform_(0, 3, generator=gen(1))  # seconds
    close(
        sinusoidal_1d(t, 32, freq_scale=30.0),
        np_sinusoid_1d(t.double().numpy(), 32, freq_scale=30.0),
    )
    close(sinusoidal_1d(t, 32, base=50.0), np_sinusoid_1d(t.double().numpy(), 32, base=50.0))
    # not the same thing as without the scale
    assert not torch.allclose(sinusoidal_1d(t, 32, freq_scale=30.0), sinusoidal_1d(t, 32))


@pytest.mark.parametrize("dim", [16, 64])
def test_dot_product_depends_only_on_offset(dim):
    omega = np_omega(dim)
    for m in (0.0, 1.0, 2.5, -7.75, 13.0):
        closed_form = np.cos(omega * m).sum()
        for n in (0.0, 3.0, 17.25, -40.5, 1000.5):
            e = sinusoidal_1d(torch.tensor([n, n + m]), dim).double()
            assert (e[0] @ e[1]).item() == pytest.approx(closed_form, abs=5e-3)
    assert (sinusoidal_1d(torch.tensor([5.0]), dim)[0].norm() ** 2).item() == pytest.approx(
        dim / 2, rel=1e-5
    )


# -- 2D -------------------------------------------------------------------------------------


def test_cape2d_frequencies_against_numpy():
    for rho_form in ("exact", "linspace"):
        for dim in (2, 4, 16, 64):
            half = dim // 2
            w = cape2d_frequencies(dim, rho=rho_form)
            rho = np_rho(half, rho_form)
            expected = np.pi * np.stack(
                [rho * np.cos(np.arange(half)), rho * np.sin(np.arange(half))]
            )
            np.testing.assert_allclose(w.double().numpy(), expected, rtol=1e-6, atol=1e-6)
    # exact rho runs from 10^(2/K) to 10 (seeds README)
    w = cape2d_frequencies(8)
    assert w[0, 0].item() == pytest.approx(math.pi * 10 ** (2 / 8), rel=1e-6)
    assert torch.hypot(w[0, -1], w[1, -1]).item() == pytest.approx(10 * math.pi, rel=1e-6)


@pytest.mark.parametrize("rho", ["exact", "linspace"])
@pytest.mark.parametrize("dim", [2, 8, 32])
def test_sinusoidal_2d_matches_appendix_a(rho, dim):
    n, b = 7, 2
    ref = CAPE_2d(n, b, False, dim, 0.0, 0.0, 1.0, rho_form=rho)
    x, y = CAPE_2d_xy(n, b, False, 0.0, 0.0, 1.0, rng=None)
    pos = torch.tensor(np.stack([x, y], axis=-1), dtype=torch.float32)  # [B, N, N, 2]
    close(sinusoidal_2d(pos, dim, rho=rho), ref, atol=1e-4)


@pytest.mark.parametrize("rho", ["exact", "linspace"])
def test_sinusoidal_2d_and_cape2d_positions_match_appendix_a_augmented(rho):
    n, b, dim = 6, 3, 16
    args = dict(max_global_shift=0.5, max_local_shift=1 / n, max_scale=1.4)
    ref = CAPE_2d(n, b, True, dim, rng=np.random.RandomState(0), rho_form=rho, **args)
    x, y = CAPE_2d_xy(n, b, True, rng=np.random.RandomState(0), **args)
    assert not np.allclose(x, CAPE_2d_xy(n, b, False, 0, 0, 1, None)[0])  # really augmented
    pos = torch.tensor(np.stack([x, y], axis=-1), dtype=torch.float32)
    close(sinusoidal_2d(pos, dim, rho=rho), ref, atol=1e-4)
    enc = CAPE2d(dim, rho=rho).eval()
    flat = enc(positions=pos.reshape(b, n * n, 2))
    close(flat, ref.reshape(b, n * n, dim), atol=1e-4)
    # a module with augmentation, in eval mode, uses given positions as they are
    aug = Augmentation(max_global_shift=0.5, max_local_shift=0.1)
    enc = CAPE2d(dim, rho=rho, augmentation=aug).eval()
    close(enc(positions=pos.reshape(b, n * n, 2)), ref.reshape(b, n * n, dim), atol=1e-4)


@pytest.mark.parametrize("rho", ["exact", "linspace"])
def test_cape2d_eval_grid_matches_appendix_a(rho):
    n, b, dim = 14, 2, 32
    ref = CAPE_2d(n, b, False, dim, 0.0, 0.0, 1.0, rho_form=rho)
    # appendix A's x varies along its axis 1, ours along the width (axis 2): transpose
    ref_hw = ref.transpose(0, 2, 1, 3)
    for enc in (CAPE2d(dim, rho=rho).eval(), CAPE2d.preset(dim, rho=rho).eval()):
        out = enc(torch.zeros(b, n, n, dim))
        assert out.shape == (b, n, n, dim)
        close(out, ref_hw)
        out = enc(torch.zeros(b, n * n, dim), grid=(n, n))
        close(out, ref_hw.reshape(b, n * n, dim))
    # a symmetric check that the transpose matters: x and y frequencies differ
    assert not np.allclose(ref, ref_hw, atol=1e-3)


@pytest.mark.parametrize("height,width", [(3, 5), (6, 2), (1, 4), (4, 1)])
@pytest.mark.parametrize("extent", [1.0, 2.0, 0.5])
def test_cape2d_non_square_grid_and_extent(height, width, extent):
    dim = 16
    expected = np_cape2d_grid(height, width, dim, "exact", extent)
    close(CAPE2d(dim, extent=extent).eval()(grid=(height, width))[0], expected.reshape(-1, dim))
    # per-call extent (Table 6 re-scaling) overrides the module's
    out = CAPE2d(dim).eval()(torch.zeros(2, height, width, dim), extent=extent)
    close(out[1], expected)


@pytest.mark.parametrize("scale", [0.4, 2.5])
def test_cape2d_freq_scale_equals_scaled_positions(scale):
    # cos(s w . p) = cos(w . (s p)): scaling every frequency is the NumPy grid over [-s, s]
    dim = 16
    w = cape2d_frequencies(dim, freq_scale=scale)
    rho = np_rho(dim // 2, "exact")
    k = np.arange(dim // 2)
    expected_w = scale * np.pi * np.stack([rho * np.cos(k), rho * np.sin(k)])
    np.testing.assert_allclose(w.double().numpy(), expected_w, rtol=1e-6)
    enc = CAPE2d(dim, freq_scale=scale).eval()
    close(enc(grid=(5, 7))[0], np_cape2d_grid(5, 7, dim, "exact", scale).reshape(-1, dim))
    assert f"freq_scale={scale}" in repr(enc)
    # 0.4 caps the largest |w| at 4 pi, the Nyquist limit of 8 patches over [-1, 1]
    top = torch.linalg.vector_norm(cape2d_frequencies(64, freq_scale=0.4), dim=0).max().item()
    assert top == pytest.approx(4 * math.pi, rel=1e-6)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="freq_scale"):
            CAPE2d(dim, freq_scale=bad)


def test_cape2d_output_dtype_and_grid_errors():
    enc = CAPE2d(8)
    with pytest.raises(ValueError):
        enc(torch.zeros(1, 3, 4, 8), grid=(4, 3))
    with pytest.raises(ValueError):
        enc(torch.zeros(1, 11, 8), grid=(3, 4))
    with pytest.raises(ValueError):
        enc(torch.zeros(1, 12, 8))
    with pytest.raises(ValueError):
        enc(grid=(3, 4), positions=torch.zeros(1, 12, 2))
    with pytest.raises(ValueError):
        enc(grid=(3, 4), mask=torch.ones(1, 12, dtype=torch.bool))
    with pytest.raises(ValueError, match="positions"):
        enc(positions=torch.zeros(1, 12, 3))
    with pytest.raises(ValueError):
        sinusoidal_2d(torch.zeros(3, 1), 8)
    assert enc(grid=(2, 3)).dtype == torch.float32


# -- Sine-ND --------------------------------------------------------------------------------


@pytest.mark.parametrize("axes,dim", [(1, 8), (2, 16), (4, 32), (4, 8)])
def test_axial_sinusoidal_concatenates_per_axis_sinusoids(axes, dim):
    p = torch.empty(3, 5, axes).uniform_(-50, 50, generator=gen(axes))
    out = axial_sinusoidal(p, dim)
    assert out.shape == (3, 5, dim)
    per = dim // axes
    for m in range(axes):
        block = out[..., m * per : (m + 1) * per]
        close(block, np_sinusoid_1d(p[..., m].double().numpy(), per), atol=1e-4)
        torch.testing.assert_close(block, sinusoidal_1d(p[..., m], per), atol=1e-5, rtol=0)
    enc = SineND(dim, pos_dim=axes)
    torch.testing.assert_close(enc(positions=p), out, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="dim"):
        axial_sinusoidal(p, dim + 2 if axes > 1 else dim + 1)  # not a multiple of 2M


def test_sine_nd_needs_positions_and_masks_padding():
    enc = SineND(16, pos_dim=2)
    with pytest.raises(ValueError):
        enc(torch.zeros(2, 3, 16))
    p = torch.rand(2, 4, 2)
    mask = torch.tensor([[True] * 4, [True, False, True, False]])
    out = enc(positions=p, mask=mask)
    assert (out[~mask] == 0).all()
    close(out[mask], axial_sinusoidal(p, 16)[mask], atol=1e-6)
    with pytest.raises(ValueError, match="dim"):
        SineND(12, pos_dim=4)


# -- CAPE1d ---------------------------------------------------------------------------------


def test_cape1d_eval_is_sinpos_of_token_indices():
    dim, t = 32, 50
    expected = np_sinusoid_1d(np.arange(t), dim)
    for enc in (
        CAPE1d(dim),
        CAPE1d(dim, augmentation=Augmentation(5.0, 0.5, 2.0)).eval(),
    ):
        out = enc(torch.zeros(3, t, dim))
        assert out.shape == (3, t, dim)
        close(out[2], expected)


def test_cape1d_eval_with_normalisation_is_sinpos_of_centred_positions():
    dim, t = 32, 12
    lengths = torch.tensor([12, 5, 1])
    enc = CAPE1d(dim, augmentation=Augmentation(5.0, 0.5, 1.5, normalize=True)).eval()
    out = enc(torch.zeros(3, t, dim), lengths=lengths)
    for b, n in enumerate(lengths.tolist()):
        pos = np.arange(n) - (n - 1) / 2
        close(out[b, :n], np_sinusoid_1d(pos, dim))
        assert (out[b, n:] == 0).all()
    # without lengths the whole sequence is centred (cached path)
    out = enc(torch.zeros(1, t, dim))
    close(out[0], np_sinusoid_1d(np.arange(t) - (t - 1) / 2, dim))


def test_cape1d_hop_is_sinusoid_of_timestamps():
    dim, t = 64, 40
    enc = CAPE1d(dim, freq_scale=30.0)
    out = enc(torch.zeros(2, t, dim), hop=0.03)
    centres = (np.arange(t) + 0.5) * 0.03
    close(out[1], np_sinusoid_1d(centres, dim, freq_scale=30.0))
    torch.testing.assert_close(
        out, sinusoidal_1d(timestamps(2, t, 0.03), dim, freq_scale=30.0)[:, :, 0]
    )
    hop = torch.tensor([0.01, 0.012])
    lengths = torch.tensor([40, 31])
    out = enc(torch.zeros(2, t, dim), hop=hop, lengths=lengths)
    for b in range(2):
        n = int(lengths[b])
        close(
            out[b, :n], np_sinusoid_1d((np.arange(n) + 0.5) * float(hop[b]), dim, freq_scale=30.0)
        )
        assert (out[b, n:] == 0).all()
    with pytest.raises(ValueError):
        enc(torch.zeros(2, t, dim), hop=0.03, positions=torch.zeros(2, t))
    with pytest.raises(ValueError, match="hop"):
        enc(torch.zeros(2, t, dim), hop=0.0)


def test_audio_preset_eval():
    assert PRESETS["audio"]["freq_scale"] == 30.0
    dim, t = 32, 20
    enc = CAPE1d.preset("audio", dim).eval()
    out = enc(torch.zeros(1, t, dim), hop=0.01)
    centres = (np.arange(t) + 0.5) * 0.01
    close(out[0], np_sinusoid_1d(centres - centres.mean(), dim, freq_scale=30.0))


def test_cape1d_given_positions_and_mask():
    dim = 16
    p = torch.tensor([[0.5, 2.25, -3.0, 100.125], [7.0, math.nan, 1.0, 0.0]])
    mask = torch.tensor([[True] * 4, [True, False, True, True]])
    out = CAPE1d(dim)(positions=p, mask=mask)
    assert out.dtype == torch.float32 and out.shape == (2, 4, dim)
    ref = np_sinusoid_1d(np.nan_to_num(p.double().numpy()), dim)
    close(out[mask], ref[mask.numpy()])
    assert (out[1, 1] == 0).all()
    with pytest.raises(ValueError, match="positions"):
        CAPE1d(dim)(positions=p)  # NaN at a real token


def test_cape1d_train_mode_augments_per_sample_reproducibly():
    dim, t, b = 32, 10, 4
    kw = dict(max_global_shift=5.0, max_local_shift=0.5, max_global_scaling=1.5)
    enc = CAPE1d(dim, augmentation=Augmentation(**kw)).train()
    x = torch.zeros(b, t, dim)
    out = enc(x, generator=gen(3))
    assert torch.equal(out, enc(x, generator=gen(3)))
    assert not torch.allclose(out, enc(x, generator=gen(4)))
    for i in range(b):
        for j in range(i + 1, b):
            assert not torch.allclose(out[i], out[j], atol=1e-3)
    assert not torch.allclose(out[0], enc.eval()(x)[0], atol=1e-3)
    # the module is the augmentation followed by the sinusoid
    pos = augment_positions(token_positions(b, t), generator=gen(3), **kw)
    close(out, np_sinusoid_1d(pos[..., 0].double().numpy(), dim), atol=2e-4)


# -- CAPE2d augmentation --------------------------------------------------------------------


def recover_xy(emb):
    """Invert a dim=4 'exact' CAPE 2D embedding with phases in (-pi, pi): [..., 4] -> [..., 2]."""
    e = emb.double().numpy()
    phase = np.arctan2(e[..., 2:], e[..., :2])  # [..., 2]
    rho = np_rho(2, "exact")
    w = np.pi * np.stack(
        [rho * np.cos(np.arange(2)), rho * np.sin(np.arange(2))], axis=1
    )  # [k, (x, y)]
    return np.linalg.solve(w, phase[..., None])[..., 0]


def test_recover_xy_inverts_the_encoding():
    p = torch.empty(50, 2).uniform_(-0.05, 0.05, generator=gen(0))
    np.testing.assert_allclose(recover_xy(sinusoidal_2d(p, 4)), p.double().numpy(), atol=1e-6)


@pytest.mark.parametrize("height,width", [(3, 5), (6, 2)])
def test_cape2d_auto_local_shift_is_extent_over_n_per_axis(height, width):
    extent = 0.02  # small, so that the phases do not wrap and positions can be read back
    enc = CAPE2d(4, auto_local_shift=True, extent=extent).train()
    out = enc(torch.zeros(64, height, width, 4), generator=gen(1))
    grid = np.stack(
        np.meshgrid(np.linspace(-extent, extent, width), np.linspace(-extent, extent, height)), -1
    )
    eps = recover_xy(out) - grid  # [B, H, W, 2]
    for axis, n in ((0, width), (1, height)):
        bound = np.abs(eps[..., axis]).max()
        assert bound <= extent / n + 1e-6
        assert bound > 0.95 * extent / n
    assert not np.allclose(eps[0, 0, 0], eps[0, 0, 1])  # per token


def test_cape2d_auto_local_shift_follows_call_extent():
    height, width, extent = 3, 5, 0.01
    enc = CAPE2d(4, auto_local_shift=True, extent=0.02).train()
    out = enc(torch.zeros(64, height, width, 4), extent=extent, generator=gen(1))
    grid = np.stack(
        np.meshgrid(np.linspace(-extent, extent, width), np.linspace(-extent, extent, height)), -1
    )
    eps = recover_xy(out) - grid
    assert np.abs(eps[..., 0]).max() <= extent / width + 1e-6


def test_cape2d_train_global_shift_and_scale_shared_by_patches():
    enc = CAPE2d(4, augmentation=Augmentation(max_global_shift=0.01), extent=0.02).train()
    out = enc(torch.zeros(8, 3, 4, 4), generator=gen(2))
    grid = np.stack(np.meshgrid(np.linspace(-0.02, 0.02, 4), np.linspace(-0.02, 0.02, 3)), -1)
    delta = recover_xy(out) - grid
    np.testing.assert_allclose(delta, np.broadcast_to(delta[:, :1, :1], delta.shape), atol=1e-6)
    assert np.abs(delta).max() <= 0.01 + 1e-6
    assert np.abs(delta[:, 0, 0, 0] - delta[:, 0, 0, 1]).max() > 1e-4  # separate x and y shifts
    enc = CAPE2d(4, augmentation=Augmentation(max_global_scaling=1.5), extent=0.02).train()
    xy = recover_xy(enc(torch.zeros(8, 3, 4, 4), generator=gen(2)))
    lam = xy / np.where(grid == 0, np.nan, grid)
    lam0 = np.nanmean(lam, axis=(1, 2, 3))
    np.testing.assert_allclose(
        lam, np.where(np.isnan(lam), np.nan, lam0[:, None, None, None]), rtol=1e-4
    )
    assert lam0.min() >= 1 / 1.5 - 1e-5 and lam0.max() <= 1.5 + 1e-5 and lam0.std() > 1e-3


def test_cape2d_auto_needs_a_grid_in_training():
    enc = CAPE2d(8, auto_local_shift=True).train()
    with pytest.raises(ValueError, match="auto"):
        enc(positions=torch.zeros(1, 4, 2))
    enc.eval()
    assert enc(positions=torch.zeros(1, 4, 2)).shape == (1, 4, 8)


# -- cache ----------------------------------------------------------------------------------


def test_cape1d_cache_survives_caller_writes():
    dim, t = 16, 9
    enc = CAPE1d(dim).eval()
    x = torch.zeros(1, t, dim)
    expected = np_sinusoid_1d(np.arange(t), dim)
    a = enc(x)
    b = enc(x)
    assert torch.equal(a, b)
    close(a[0], expected)
    a.add_(1.0)  # the caller writes into what it got
    close(enc(x)[0], expected)
    c = enc(x)
    c.detach().mul_(0.0)
    close(enc(x)[0], expected)
    # other keys: hop and dtype
    close(enc(x, hop=0.5)[0], np_sinusoid_1d((np.arange(t) + 0.5) * 0.5, dim))
    assert enc(x.to(torch.bfloat16)).dtype == torch.bfloat16
    close(enc(x)[0], expected)
    assert enc(torch.zeros(3, t, dim)).shape == (3, t, dim)


def test_cape2d_cache_survives_caller_writes():
    dim, h, w = 8, 3, 4
    enc = CAPE2d(dim).eval()
    expected = np_cape2d_grid(h, w, dim)
    a = enc(torch.zeros(1, h, w, dim))
    close(a[0], expected)
    a.sub_(5.0)
    close(enc(torch.zeros(1, h, w, dim))[0], expected)
    f = enc(torch.zeros(1, h * w, dim), grid=(h, w))
    f.zero_()
    close(enc(torch.zeros(1, h * w, dim), grid=(h, w))[0], expected.reshape(-1, dim))
    close(enc(torch.zeros(1, h, w, dim))[0], expected)


@pytest.mark.parametrize("kind", ["cape1d", "cape2d"])
def test_eval_under_inference_mode(kind):
    if kind == "cape1d":
        enc, x = CAPE1d(8).eval(), torch.zeros(2, 5, 8)
        expected = np.broadcast_to(np_sinusoid_1d(np.arange(5), 8), (2, 5, 8))
    else:
        enc, x = CAPE2d(8).eval(), torch.zeros(2, 3, 4, 8)
        expected = np.broadcast_to(np_cape2d_grid(3, 4, 8), (2, 3, 4, 8))
    with torch.inference_mode():
        out = enc(x)
        close(out, expected)
    close(enc(x), expected)  # a table built under inference mode is not reused wrongly
    xg = torch.zeros_like(x, requires_grad=True)
    enc.add_to(xg).sum().backward()  # nor breaks autograd afterwards
    assert (xg.grad == 1).all()


def test_cache_warm_then_inference_mode():
    enc = CAPE1d(8).eval()
    x = torch.zeros(2, 5, 8)
    ref = enc(x).clone()
    with torch.inference_mode():
        assert torch.equal(enc(x), ref)


def test_cache_size_zero():
    enc = CAPE1d(8, cache_size=0).eval()
    a = enc(torch.zeros(1, 5, 8))
    a.add_(1)
    close(enc(torch.zeros(1, 5, 8))[0], np_sinusoid_1d(np.arange(5), 8))


# -- add_to ---------------------------------------------------------------------------------


def _modules_and_inputs():
    kw = dict(augmentation=Augmentation(2.0, 0.3, 1.3))
    return [
        (CAPE1d(16).eval(), (2, 7, 16), {}),
        (CAPE1d(16, **kw).train(), (2, 7, 16), {}),
        (CAPE1d(16, **kw).train(), (2, 7, 16), {"lengths": torch.tensor([7, 3])}),
        (CAPE2d(16).eval(), (2, 3, 4, 16), {}),
        (CAPE2d.preset(16).train(), (2, 3, 4, 16), {}),
        (CAPE2d.preset(16).train(), (2, 12, 16), {"grid": (3, 4)}),
    ]


@pytest.mark.parametrize("case", range(6))
def test_add_to_equals_sum_and_has_identity_gradient(case):
    enc, shape, kw = _modules_and_inputs()[case]
    x = torch.randn(shape, generator=gen(case))
    expected = x + enc(x, generator=gen(9), **kw)
    xg = x.clone().requires_grad_(True)
    y = enc.add_to(xg, generator=gen(9), **kw)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    upstream = torch.randn(shape, generator=gen(100))
    y.backward(upstream)
    torch.testing.assert_close(xg.grad, upstream, rtol=0, atol=0)
    # and without autograd, add_to leaves later calls (and the cache) intact
    y2 = enc.add_to(x.clone(), generator=gen(9), **kw)
    torch.testing.assert_close(y2, expected, rtol=0, atol=0)
    torch.testing.assert_close(
        enc.add_to(x.clone(), generator=gen(9), **kw), expected, rtol=0, atol=0
    )


# -- dtypes and autocast --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cape1d_low_precision_is_float32_cast(dtype):
    dim = 32
    # given positions up to 1e5, fractional
    p = torch.cat(
        [torch.linspace(0, 1e5, 300), torch.empty(100).uniform_(9e4, 1e5, generator=gen(0))]
    )[None]
    p = p.expand(2, -1)
    x32 = torch.zeros(2, p.shape[1], dim)
    for enc in (
        CAPE1d(dim).eval(),
        CAPE1d(
            dim, augmentation=Augmentation(max_global_shift=5.0, max_global_scaling=1.2)
        ).train(),
    ):
        lo = enc(x32.to(dtype), positions=p, generator=gen(1))
        hi = enc(x32, positions=p, generator=gen(1))
        assert lo.dtype == dtype and hi.dtype == torch.float32
        assert torch.equal(lo, hi.to(dtype))
    # the float32 phases are right: positions were not rounded to the low precision
    hi = CAPE1d(dim)(positions=p)
    omega32 = np_omega(dim).astype(np.float32).astype(np.float64)
    close(hi, np_sinusoid_1d(p.double().numpy(), dim, omega=omega32), atol=2e-2)
    # token indices up to 1e5 on the cached path
    enc = CAPE1d(8).eval()
    x = torch.zeros(1, 100_001, 8)
    lo = enc(x.to(dtype))
    assert lo.dtype == dtype and torch.equal(lo, enc(x).to(dtype))
    close(
        enc(x)[0, -5:],
        np_sinusoid_1d(np.arange(99_996, 100_001), 8, omega=np_omega(8).astype(np.float32)),
        atol=2e-2,
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cape2d_and_sine_nd_low_precision_is_float32_cast(dtype):
    enc = CAPE2d(16).eval()
    x = torch.zeros(2, 5, 6, 16)
    assert torch.equal(enc(x.to(dtype)), enc(x).to(dtype))
    enc = CAPE2d.preset(16).train()
    assert torch.equal(enc(x.to(dtype), generator=gen(0)), enc(x, generator=gen(0)).to(dtype))
    p = torch.rand(2, 5, 2) * 1000
    enc = SineND(16, augmentation=Augmentation(max_global_shift=3.0)).train()
    xs = torch.zeros(2, 5, 16)
    assert torch.equal(
        enc(xs.to(dtype), positions=p, generator=gen(0)),
        enc(xs, positions=p, generator=gen(0)).to(dtype),
    )


@pytest.mark.parametrize("kind", ["cape1d", "cape2d"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_module_cast_keeps_float32_frequencies(kind, dtype):
    # model.to(bf16) / model.half() must not round the frequencies (phases stay float32)
    if kind == "cape1d":
        ref, x = CAPE1d(64), torch.zeros(1, 200, 64, dtype=dtype)
    else:
        ref, x = CAPE2d(64), torch.zeros(1, 14, 14, 64, dtype=dtype)
    cast = type(ref)(64).to(dtype)
    assert torch.equal(cast(x), ref(x))
    assert torch.equal(cast(x.float()), ref(x.float()))
    back = cast.float()
    assert torch.equal(back(x.float()), ref(x.float()))


def test_sine_nd_module_cast_to_bf16_keeps_results():
    p = torch.rand(1, 10, 2) * 100
    assert torch.equal(SineND(64).to(torch.bfloat16)(positions=p), SineND(64)(positions=p))


def test_autocast_does_not_change_phases():
    p1 = torch.empty(2, 50).uniform_(0, 5000, generator=gen(0))
    p2 = torch.empty(2, 50, 2).uniform_(-3, 3, generator=gen(1))
    cases = [
        (CAPE1d(64), dict(positions=p1)),
        (CAPE1d(64), dict(x=torch.zeros(2, 50, 64))),
        (CAPE1d(64, freq_scale=30.0), dict(x=torch.zeros(2, 50, 64), hop=0.03)),
        (CAPE2d(64), dict(positions=p2)),
        (CAPE2d(64), dict(x=torch.zeros(2, 5, 10, 64))),
        (SineND(64), dict(positions=p2)),
    ]
    for enc, kw in cases:
        plain = enc(**kw)
        if hasattr(enc, "_cache"):
            enc._cache.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = enc(**kw)
        assert auto.dtype == torch.float32
        assert torch.equal(auto, plain), type(enc).__name__


# -- bad arguments --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make,name",
    [
        (lambda: CAPE2d(7), "dim"),
        (lambda: CAPE1d(9), "dim"),
        (lambda: CAPE1d(0), "dim"),
        (
            lambda: CAPE2d(8, augmentation=Augmentation(max_global_scaling=0.5)),
            "max_global_scaling",
        ),
        (
            lambda: CAPE1d(8, augmentation=Augmentation(max_global_scaling=0.99)),
            "max_global_scaling",
        ),
        (lambda: CAPE2d(8, augmentation=Augmentation(max_global_shift=-0.1)), "max_global_shift"),
        (lambda: CAPE1d(8, augmentation=Augmentation(max_local_shift=-1.0)), "max_local_shift"),
        (
            lambda: CAPE2d(8, augmentation=Augmentation(max_local_shift=(0.1, -0.1))),
            "max_local_shift",
        ),
        (
            lambda: CAPE2d(8, augmentation=Augmentation(0.0, 0.1), auto_local_shift=True),
            "max_local_shift",
        ),
        (lambda: CAPE2d(8, rho="log"), "rho"),
        (lambda: cape2d_frequencies(8, rho="10"), "rho"),
        (lambda: CAPE2d(8, extent=0.0), "extent"),
        (lambda: CAPE2d(8, extent=-1.0), "extent"),
        (lambda: CAPE2d(8).eval()(grid=(3, 3), extent=0.0), "extent"),
        (lambda: CAPE1d(8, freq_scale=0.0), "freq_scale"),
        (lambda: CAPE1d(8, base=1.0), "base"),
        (lambda: sinusoid_frequencies(7), "dim"),
        (lambda: SineND(10, pos_dim=2), "dim"),
        (lambda: CAPE1d.preset("image", 8), "modality"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_content_with_wrong_embedding_size_raises():
    with pytest.raises(ValueError, match="x"):
        CAPE1d(8)(torch.zeros(2, 3, 6))
    with pytest.raises(ValueError, match="x"):
        CAPE2d(8)(torch.zeros(1, 2, 2, 6))
    with pytest.raises(ValueError, match="x"):
        CAPE2d(8)(torch.zeros(1, 4, 6), grid=(2, 2))
    with pytest.raises(ValueError, match="x"):
        SineND(8)(torch.zeros(1, 4, 6), positions=torch.zeros(1, 4, 2))


def test_bad_argument_types():
    with pytest.raises(TypeError, match="dim"):
        CAPE1d(8.0)
    with pytest.raises(TypeError, match="dim"):
        CAPE2d(True)
    with pytest.raises(ValueError):
        CAPE1d(8)()
    with pytest.raises(ValueError):
        CAPE1d(8)(torch.zeros(2, 8))


# -- property test --------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_property_no_crash_finite_padding_zero(data):
    kind = data.draw(st.sampled_from(["cape1d", "cape2d", "sine"]))
    b = data.draw(st.integers(1, 3))
    t = data.draw(st.integers(0, 20))
    dim = data.draw(st.integers(1, 24))
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    augment = data.draw(st.booleans())
    training = data.draw(st.booleans())
    normalize = data.draw(st.booleans())
    pos_dim = data.draw(st.integers(1, 4)) if kind == "sine" else (2 if kind == "cape2d" else 1)
    fields: dict = dict(normalize=normalize)
    opts: dict = {}
    if augment:
        fields.update(
            max_global_shift=data.draw(st.floats(0, 10)),
            max_global_scaling=data.draw(st.floats(1, 3)),
        )
        if kind == "cape2d" and data.draw(st.booleans()):
            opts["auto_local_shift"] = True
        else:
            fields["max_local_shift"] = data.draw(st.floats(0, 1))
    opts["augmentation"] = Augmentation(**fields)

    invalid_dim = dim % (2 * pos_dim if kind == "sine" else 2) != 0
    try:
        if kind == "cape1d":
            enc = CAPE1d(dim, **opts)
        elif kind == "cape2d":
            enc = CAPE2d(dim, **opts)
        else:
            enc = SineND(dim, pos_dim=pos_dim, **opts)
    except (ValueError, TypeError):
        assert invalid_dim
        return
    assert not invalid_dim
    enc.train(training)

    use_grid = kind == "cape2d" and data.draw(st.booleans())
    if use_grid:
        h = data.draw(st.integers(1, 5))
        w = data.draw(st.integers(1, 4))
        x = torch.randn(b, h, w, dim).to(dtype)
        out = enc(x, generator=gen(0))
        assert out.shape == x.shape and out.dtype == dtype
        assert torch.isfinite(out.float()).all()
        return

    lengths = torch.tensor(data.draw(st.lists(st.integers(0, t), min_size=b, max_size=b)))
    mask = torch.arange(t)[None, :] < lengths[:, None]
    x = torch.randn(b, t, dim).to(dtype)
    given_positions = kind != "cape1d" or data.draw(st.booleans())
    kwargs = {}
    if given_positions:
        scale = data.draw(st.sampled_from([1.0, 100.0, 1e4]))
        p = (torch.rand(b, t, pos_dim, generator=gen(t)) * 2 - 1) * scale
        p = torch.where(mask[..., None], p, torch.full_like(p, math.nan))  # NaN at padding is fine
        kwargs["positions"] = p
    if kind == "cape1d":
        kwargs["lengths"] = lengths
    else:
        kwargs["mask"] = mask
    needs_grid = kind == "cape2d" and opts.get("auto_local_shift", False) and training
    try:
        out = enc(x, generator=gen(1), **kwargs)
    except (ValueError, TypeError):
        assert needs_grid
        return
    assert not needs_grid
    assert out.shape == (b, t, dim) and out.dtype == dtype
    assert torch.isfinite(out.float()).all()
    assert (out[~mask] == 0).all()


# -- the deprecated flat keywords ------------------------------------------------------------

_LEGACY = [
    (CAPE1d, dict(max_global_shift=5.0, max_local_shift=0.5), {}),
    (
        CAPE1d,
        dict(max_global_shift=60.0, max_local_shift=0.015, max_global_scaling=1.1, normalize=True),
        {"freq_scale": 30.0},
    ),
    (CAPE2d, dict(max_global_shift=0.5, max_local_shift="auto", max_global_scaling=1.4), {}),
    (CAPE2d, dict(max_local_shift="auto", normalize=True), {"fit_grid": (4, 4)}),
    (CAPE2d, dict(max_global_shift=0.5, max_local_shift=(0.1, 0.2)), {}),
    (SineND, dict(max_global_shift=3.0, max_local_shift=0.5, max_global_scaling=1.3), {}),
]


def _new_form(fields: dict) -> dict:
    """The flat keywords -> augmentation= (and auto_local_shift=True for "auto")."""
    fields = dict(fields)
    auto = fields.get("max_local_shift") == "auto"
    if auto:
        del fields["max_local_shift"]
    return {"augmentation": Augmentation(**fields), **({"auto_local_shift": True} if auto else {})}


def _outputs(enc) -> list[torch.Tensor]:
    out = []
    for training in (True, False):
        enc.train(training)
        if isinstance(enc, CAPE1d):
            x = torch.zeros(3, 7, enc.dim)
            out += [
                enc(x, generator=gen(1)),
                enc(x, lengths=torch.tensor([7, 4, 1]), generator=gen(3)),
            ]
            out.append(enc(x, hop=0.03, generator=gen(2)))
        elif isinstance(enc, CAPE2d):
            out.append(enc(torch.zeros(2, 3, 5, enc.dim), generator=gen(1)))
            pos = torch.cat([enc.grid_positions(2, 3), enc.grid_positions(3, 2)])
            out.append(enc(positions=pos, grid=[(2, 3), (3, 2)], generator=gen(2)))
        else:
            pos = torch.rand(2, 6, 2, generator=gen(5)) * 4
            out.append(enc(positions=pos, generator=gen(1)))
    return out


@pytest.mark.parametrize("case", range(len(_LEGACY)))
def test_flat_keywords_still_work_warn_and_give_the_same_draws(case):
    cls, fields, rest = _LEGACY[case]
    with pytest.warns(DeprecationWarning, match=r"augmentation=cape\.Augmentation\(") as caught:
        old = cls(16, **fields, **rest)
    assert len(caught) == 1 and caught[0].filename == __file__  # the caller's line
    if fields.get("max_local_shift") == "auto":
        assert "auto_local_shift=True" in str(caught[0].message)
    new = cls(16, **_new_form(fields), **rest)
    assert old.augmentation == new.augmentation and repr(old) == repr(new)
    for a, b in zip(_outputs(old), _outputs(new), strict=True):
        assert torch.equal(a, b)


def test_flat_keywords_and_augmentation_together_are_refused():
    aug = Augmentation(max_global_shift=1.0)
    for cls in (CAPE1d, CAPE2d, SineND):
        with pytest.raises(ValueError, match=r"augmentation=.*\['max_local_shift'\].*not both"):
            cls(16, augmentation=aug, max_local_shift=0.5)
    with pytest.raises(ValueError, match="max_local_shift"):
        CAPE2d(8, max_local_shift="half")  # refused before any warning
    with pytest.raises(TypeError, match=r"augmentation must be a cape\.Augmentation or None"):
        CAPE1d(8, augmentation={"max_global_shift": 1.0})  # a mapping is cape.build's form


def test_auto_local_shift_alone_draws_and_presets_write_it_auto():
    enc = CAPE2d(8, auto_local_shift=True)
    assert enc.augmentation == Augmentation() and enc.auto_local
    x = torch.zeros(1, 3, 3, 8)
    assert not torch.equal(enc.train()(x, generator=gen(0)), enc.eval()(x))
    assert PRESETS["image"]["max_local_shift"] == "auto"
    assert CAPE2d.preset(8).auto_local and not CAPE2d.preset(8, max_local_shift=0.0).auto_local
    assert CAPE2d.preset(8, max_global_shift=0.1).augmentation == Augmentation(0.1, 0.0, 1.4)
    with pytest.raises(TypeError, match="auto_local_shift=True"):
        Augmentation(max_local_shift="auto")  # the hint names CAPE2d's keyword
