"""cape.lab.data.contrast_image: background -> -1, the most distinct pixel -> +1, colour-blind."""

import pytest
import torch

from cape.lab.data import TRANSFORMS, apply_transform, contrast_image


def _glyph(fg, bg, size=12):
    x = torch.empty(3, size, size)
    x[:] = torch.tensor(bg)[:, None, None]
    x[:, 4:8, 5:7] = torch.tensor(fg)[:, None, None]
    x[:, 6, 3] = (torch.tensor(fg) + torch.tensor(bg))[:] / 2  # a half-way pixel
    return x


def test_closed_form_values():
    y = contrast_image(_glyph([0.9, 0.1, 0.2], [0.1, 0.3, 0.8]))
    assert y.shape == (3, 12, 12) and torch.equal(y[0], y[1]) and torch.equal(y[1], y[2])
    assert torch.all(y[0, 0] == -1) and torch.all(y[0, 4:8, 5:7] == 1)
    assert y[0, 6, 3].item() == pytest.approx(0.0, abs=1e-6)  # half the distance -> 0


def test_invariant_to_colours_and_polarity():
    a = contrast_image(_glyph([0.9, 0.1, 0.2], [0.1, 0.3, 0.8]))
    b = contrast_image(_glyph([0.1, 0.3, 0.8], [0.9, 0.1, 0.2]))  # swapped colours
    c = contrast_image(_glyph([0.2, 0.9, 0.1], [0.8, 0.1, 0.3]))  # channels permuted
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, c)


def test_batched_equals_single_and_flat_image_is_safe():
    torch.manual_seed(0)
    x = torch.rand(4, 3, 10, 10)
    out = contrast_image(x)
    for i in range(4):
        torch.testing.assert_close(out[i], contrast_image(x[i]))
    flat = contrast_image(torch.full((3, 8, 8), 0.5))
    assert torch.isfinite(flat).all() and torch.all(flat == -1)


def test_apply_transform_names():
    x = torch.rand(3, 4, 4)
    torch.testing.assert_close(apply_transform(x, "rgb"), x * 2 - 1)
    assert set(TRANSFORMS) == {"rgb", "contrast"}
    with pytest.raises(ValueError, match="transform must be one of"):
        apply_transform(x, "hsv")
