"""cape.lab.data.speech.specaugment: the paper's SpecAugment masks (CAPE app. C.2)."""

from __future__ import annotations

import pytest
import torch

from cape.lab.data.speech.specaugment import (
    MaskSettings,
    SpecAugment,
    spec_augment,
    spec_augment_masks,
)


def _runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """A 1-D bool mask -> [(start, width)] of its runs of True."""
    runs, start = [], None
    for i, v in enumerate(mask.tolist() + [False]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def test_single_masks_respect_the_limits():
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([1000, 300, 120, 9, 0])
    widths_t = {b: set() for b in range(5)}
    widths_f = set()
    for _ in range(200):
        tm, fm = spec_augment_masks(5, 1000, 80, lengths, freq_masks=1, time_masks=1, generator=g)
        for b, n in enumerate(lengths.tolist()):
            cap = min(50, int(0.1 * n))
            runs = _runs(tm[b])
            assert len(runs) <= 1
            for start, width in runs:
                assert width <= cap and start + width <= n
                widths_t[b].add(width)
            if not runs:
                widths_t[b].add(0)
            fr = _runs(fm[b])
            assert len(fr) <= 1 and all(w <= 30 for _, w in fr)
            widths_f.update(w for _, w in fr)
    # the widths are drawn over the whole allowed range: 0 ... cap
    assert max(widths_t[0]) == 50 and 0 in widths_t[0]
    assert max(widths_t[1]) == 30 and max(widths_t[2]) == 12
    assert widths_t[3] == {0} and widths_t[4] == {0}  # floor(0.1 * 9) = 0
    assert max(widths_f) == 30 and min(widths_f) <= 2


def test_masked_fraction_bounds_with_paper_defaults():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 1000, 80) + 5.0  # never exactly 0 before masking
    y = spec_augment(x, generator=g)
    masked = y == 0
    time_frac = masked.all(dim=2).float().mean(dim=1)  # frames masked on every band
    band_frac = masked.all(dim=1).float().mean(dim=1)  # bands masked on every frame
    # hard limits: 10 masks of <= 50 frames, 2 masks of <= 30 bands
    assert bool((time_frac <= 0.5).all()) and bool((band_frac <= 60 / 80).all())
    # expected: 10 masks of mean width 25 (some overlap) ~ 0.22; 2 of mean 15 bands ~ 0.35
    assert 0.17 < time_frac.mean().item() < 0.26
    assert 0.25 < band_frac.mean().item() < 0.42
    # any masked entry lies in a masked frame or a masked band
    cross = masked.all(dim=2)[:, :, None] | masked.all(dim=1)[:, None, :]
    assert torch.equal(masked, cross)


def test_padding_is_untouched_and_masks_stay_inside_lengths():
    g = torch.Generator().manual_seed(2)
    lengths = torch.tensor([400, 250, 37])
    x = torch.randn(3, 400, 40) + 3.0
    x[1, 250:] = float("nan")
    x[2, 37:] = 7.0
    y = spec_augment(x, lengths, generator=g, freq_width=10)
    assert torch.isnan(y[1, 250:]).all()
    assert (y[2, 37:] == 7.0).all()
    assert not torch.isnan(y[1, :250]).any()
    tm, _ = spec_augment_masks(3, 400, 40, lengths, generator=torch.Generator().manual_seed(2))
    for b, n in enumerate(lengths.tolist()):
        assert not tm[b, n:].any()


def test_determinism_with_a_generator_and_value():
    x = torch.randn(4, 300, 80)
    a = spec_augment(x, generator=torch.Generator().manual_seed(5), value=-1.5)
    b = spec_augment(x, generator=torch.Generator().manual_seed(5), value=-1.5)
    c = spec_augment(x, generator=torch.Generator().manual_seed(6), value=-1.5)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert ((a == -1.5) | (a == x)).all()
    assert torch.equal(x, x.clone())  # input unchanged (a new tensor is returned)


def test_unbatched_input_and_gradient():
    x = torch.randn(200, 80, requires_grad=True)
    y = spec_augment(x, generator=torch.Generator().manual_seed(0))
    assert y.shape == x.shape
    y.sum().backward()
    assert torch.equal(x.grad == 0, y.detach() == 0)  # masked entries get no gradient


def test_module_is_identity_in_eval_mode():
    module = SpecAugment()
    x = torch.randn(2, 300, 80)
    module.eval()
    assert module(x) is x
    module.train()
    y = module(x, torch.tensor([300, 200]), generator=torch.Generator().manual_seed(0))
    assert not torch.equal(y, x)
    assert torch.equal(y[1, 200:], x[1, 200:])
    assert "time_masks=10" in repr(module)


def test_zero_masks_is_identity():
    x = torch.randn(2, 50, 16)
    assert torch.equal(spec_augment(x, freq_masks=0, time_masks=0), x)


@pytest.mark.parametrize(
    "kwargs, err",
    [
        ({"time_ratio": 1.5}, ValueError),
        ({"freq_masks": -1}, ValueError),
        ({"time_width": 2.0}, TypeError),
        ({"generator": 3}, TypeError),
    ],
)
def test_argument_errors(kwargs, err):
    with pytest.raises(err):
        spec_augment(torch.randn(2, 10, 8), **kwargs)


def test_bad_features_and_lengths():
    with pytest.raises(TypeError, match="features"):
        spec_augment(torch.zeros(2, 10, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="lengths"):
        spec_augment(torch.randn(2, 10, 8), torch.tensor([11, 3]))


def test_settings_object_matches_the_keywords():
    settings = MaskSettings(freq_width=10, time_masks=3, value=-1.5)
    x, lengths = torch.randn(2, 120, 40), torch.tensor([120, 70])
    a = spec_augment(x, lengths, settings, generator=torch.Generator().manual_seed(4))
    b = spec_augment(
        x, lengths, freq_width=10, time_masks=3, value=-1.5,
        generator=torch.Generator().manual_seed(4),
    )  # fmt: skip
    assert torch.equal(a, b)
    assert (
        SpecAugment(settings).settings
        == settings
        == MaskSettings.resolve(None, {"freq_width": 10, "time_masks": 3, "value": -1.5})
    )
    with pytest.raises(ValueError, match="time_ratio"):
        MaskSettings(time_ratio=1.5)
    with pytest.raises(TypeError, match="settings"):
        spec_augment(x, lengths, {"freq_width": 10})
