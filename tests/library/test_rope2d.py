"""RoPE-ViT's 2-D rotary (axial, mixed) against an independent computation.

The reference rotates each plane (channel c, c + hd/2) by an explicit 2x2 matrix in float64,
with RoPE-ViT's frequencies written out from the paper (theta^(-4c/hd) per patch; mixed:
directions phi_h and phi_h + pi/2 per head)."""

from __future__ import annotations

import math

import pytest
import torch

import cape
from cape.functional.rope2d import (
    axial_frequencies,
    mixed_angles,
    mixed_frequencies,
    rope2d_magnitudes,
)
from cape.models import ViT


def _rotate_reference(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, hd], angle: [B, H, T, hd/2] -> plane by plane, 2x2 matrices, float64."""
    x = x.double()
    out = torch.empty_like(x)
    half = x.shape[-1] // 2
    for c in range(half):
        a = angle[..., c].double()
        rot = torch.stack([torch.cos(a), -torch.sin(a), torch.sin(a), torch.cos(a)], -1)
        rot = rot.reshape(*a.shape, 2, 2)
        pair = torch.stack([x[..., c], x[..., c + half]], -1)[..., None]  # [..., 2, 1]
        turned = (rot @ pair)[..., 0]
        out[..., c], out[..., c + half] = turned[..., 0], turned[..., 1]
    return out


def test_magnitudes_are_rope_vits() -> None:
    hd, theta = 16, 100.0
    expect = [1 / theta ** (4 * c / hd) for c in range(hd // 4)]  # 1, 100^-1/4, ...
    torch.testing.assert_close(rope2d_magnitudes(hd, theta).double(), torch.tensor(expect).double())
    assert float(rope2d_magnitudes(hd, theta)[0]) == 1.0  # the highest: one radian per patch


def test_axial_turns_half_the_planes_with_x_and_half_with_y() -> None:
    hd, sx, sy = 16, 0.5, 0.25
    torch.manual_seed(0)
    enc = cape.RoPE2d(hd, variant="axial")
    pos = torch.rand(2, 5, 2) * 4 - 2
    q = torch.randn(2, 3, 5, hd)
    angle = torch.empty(2, 5, hd // 2, dtype=torch.float64)
    for c in range(hd // 4):  # x planes, then y planes, both at 100^(-4c/hd)
        r = 100.0 ** (-4 * c / hd)
        angle[..., c] = pos[..., 0].double() * r
        angle[..., c + hd // 4] = pos[..., 1].double() * r
    got = enc(q, q, positions=pos)[0]
    want = _rotate_reference(q, angle[:, None].expand(2, 3, 5, hd // 2))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # spacing: the per-patch frequencies over the patch distance
    w = axial_frequencies(hd, spacing=(sx, sy))
    torch.testing.assert_close(w[0, : hd // 4], rope2d_magnitudes(hd, 100.0) / sx)
    torch.testing.assert_close(w[1, hd // 4 :], rope2d_magnitudes(hd, 100.0) / sy)
    assert not w[0, hd // 4 :].any() and not w[1, : hd // 4].any()


def test_fit_grid_makes_one_patch_of_the_training_grid_the_unit() -> None:
    enc = cape.RoPE2d(8, variant="axial", fit_grid=(5, 9))
    pos = enc.grid_positions(5, 9)[0]  # neighbours 2/8 apart in x, 2/4 in y
    spacing_x, spacing_y = 2 / 8, 2 / 4
    r = rope2d_magnitudes(8, 100.0)
    torch.testing.assert_close(enc.frequencies[0, :2], r / spacing_x)
    torch.testing.assert_close(enc.frequencies[1, 2:], r / spacing_y)
    # the highest frequency turns by exactly one radian from patch to patch, as in RoPE-ViT
    step = (pos[1, 0] - pos[0, 0]) * enc.frequencies[0, 0]
    assert abs(float(step) - 1.0) < 1e-5
    assert cape.count_aliased(enc, (5, 9)) == 0


def test_mixed_initial_directions_are_per_head_and_orthogonal_in_pairs() -> None:
    hd, heads = 16, 3
    w = mixed_frequencies(hd, heads, generator=torch.Generator().manual_seed(1)).double()
    r = rope2d_magnitudes(hd, 10.0).double()
    q4 = hd // 4
    for h in range(heads):
        first, second = w[h, :, :q4], w[h, :, q4:]  # [2, hd/4] each: (w_x, w_y) per plane
        torch.testing.assert_close(first.norm(dim=0), r)
        torch.testing.assert_close(second.norm(dim=0), r)
        torch.testing.assert_close((first * second).sum(0), torch.zeros(q4, dtype=torch.float64))
        phi = torch.atan2(first[1], first[0])  # one direction per head, the same for every c
        assert float((phi - phi[0]).abs().max()) < 1e-6
    phis = torch.atan2(w[:, 1, 0], w[:, 0, 0])
    assert len({round(float(p), 4) for p in phis}) == heads  # drawn apart per head


def test_mixed_rotates_each_head_by_its_own_frequencies_and_learns_them() -> None:
    hd, heads = 8, 2
    torch.manual_seed(3)
    enc = cape.build("rope-mixed", hd, heads=heads)
    assert isinstance(enc, cape.RoPE2d) and enc.head_freqs.requires_grad
    pos = torch.randn(2, 4, 2)
    q = torch.randn(2, heads, 4, hd)
    w = enc.head_freqs.detach().double()  # [H, 2, hd/2]
    angle = pos.double()[:, None, :, 0:1] * w[None, :, None, 0] + (
        pos.double()[:, None, :, 1:2] * w[None, :, None, 1]
    )
    got = enc(q, q, positions=pos)[0]
    torch.testing.assert_close(got.double(), _rotate_reference(q, angle), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mixed_angles(pos, enc.head_freqs).double(), angle)
    got.square().sum().backward()
    assert enc.head_freqs.grad is not None and enc.head_freqs.grad.abs().sum() > 0
    assert "head_freqs" in enc.state_dict()


@pytest.mark.parametrize("variant", ["axial", "mixed"])
def test_logits_depend_on_relative_positions_only(variant: str) -> None:
    torch.manual_seed(0)
    enc = cape.RoPE2d(8, variant=variant, **({"heads": 2} if variant == "mixed" else {}))
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    pos = torch.randn(1, 6, 2)
    there = enc(q, k, positions=pos)
    a = there[0] @ there[1].transpose(-1, -2)
    moved = enc(q, k, positions=pos + torch.tensor([3.0, -1.5]))
    b = moved[0] @ moved[1].transpose(-1, -2)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="head_dim must be divisible by 4"):
        cape.RoPE2d(6)
    with pytest.raises(ValueError, match="heads is required"):
        cape.RoPE2d(8, variant="mixed")
    with pytest.raises(ValueError, match="heads applies to variant='mixed'"):
        cape.RoPE2d(8, heads=2)
    with pytest.raises(ValueError, match="variant"):
        cape.RoPE2d(8, variant="spiral")
    with pytest.raises(ValueError, match="theta"):
        cape.RoPE2d(8, theta=1.0)
    enc = cape.RoPE2d(8, variant="mixed", heads=2)
    with pytest.raises(ValueError, match="q must have 2 heads"):
        enc(torch.zeros(1, 3, 4, 8), torch.zeros(1, 3, 4, 8), positions=torch.zeros(1, 4, 2))


@pytest.mark.parametrize("name", ["rope-axial", "rope-mixed"])
def test_vit_takes_them_at_any_size_with_capes_augmentation(name: str) -> None:
    torch.manual_seed(0)
    aug = {"max_global_shift": 0.5, "max_local_shift": 0.5, "max_global_scaling": 1.4}
    model = ViT(
        4, image_size=16, patch=4, dim=16, depth=1, heads=2, position=name,
        position_options={"fit_grid": True, **aug},
    )  # fmt: skip
    rope = model.encoder.layers[0].self_attn.rotary
    assert isinstance(rope, cape.RoPE2d) and rope.fit_grid == (4, 4)
    assert rope.augmentation == cape.Augmentation(0.5, 0.5, 1.4)
    model.train()(torch.randn(2, 3, 16, 16)).sum().backward()
    model.eval()
    for size in (8, 16, 32):
        assert model(torch.randn(1, 3, size, size)).shape == (1, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(model(torch.randn(1, 3, 24, 24))).all()
    # eval is deterministic: no augmentation draw
    x = torch.randn(1, 3, 16, 16)
    assert torch.equal(model(x), model(x))
    with torch.no_grad():
        assert math.isfinite(float(model(x).sum()))


# -- M-D positions (pos_dim > 2: a box's 4 edges) -----------------------------------------------


def test_axial_over_four_axes_gives_each_axis_its_own_planes() -> None:
    hd, m = 16, 4  # 8 planes: 2 per axis, at 100^(-8c/16), c = 0, 1
    torch.manual_seed(0)
    enc = cape.RoPE2d(hd, variant="axial", pos_dim=m)
    pos = torch.rand(2, 5, m) * 2 - 1
    q = torch.randn(2, 3, 5, hd)
    angle = torch.empty(2, 5, hd // 2, dtype=torch.float64)
    for axis in range(m):
        for c in range(2):
            angle[..., 2 * axis + c] = pos[..., axis].double() * 100.0 ** (-8 * c / hd)
    got = enc(q, q, positions=pos)[0]
    want = _rotate_reference(q, angle[:, None].expand(2, 3, 5, hd // 2))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    w = axial_frequencies(hd, spacing=(0.5, 1.0, 2.0, 4.0))  # [4, 8]
    for axis, step in enumerate((0.5, 1.0, 2.0, 4.0)):
        torch.testing.assert_close(
            w[axis, 2 * axis : 2 * axis + 2], rope2d_magnitudes(hd, 100.0, axes=4) / step
        )
        assert int((w[axis] != 0).sum()) == 2


def test_mixed_over_four_axes_draws_orthonormal_directions_per_head() -> None:
    hd, heads = 16, 5
    w = mixed_frequencies(
        hd, heads, spacing=(1.0,) * 4, generator=torch.Generator().manual_seed(2)
    ).double()  # [H, 4, hd/2]
    r = rope2d_magnitudes(hd, 10.0).double()
    q4 = hd // 4
    for h in range(heads):
        first, second = w[h, :, :q4], w[h, :, q4:]  # [4, hd/4]: one direction per group
        torch.testing.assert_close(first.norm(dim=0), r)
        torch.testing.assert_close(second.norm(dim=0), r)
        u, v = first[:, 0] / r[0], second[:, 0] / r[0]
        assert abs(float(u @ v)) < 1e-6  # orthogonal, like phi and phi + pi/2 in 2-D
        torch.testing.assert_close(first / r, u[:, None].expand(4, q4))  # one direction per head
    dirs = w[:, :, 0] / r[0]
    assert float((dirs[0] - dirs[1]).abs().max()) > 0.1  # drawn apart per head


@pytest.mark.parametrize("variant", ["axial", "mixed"])
def test_four_axes_keep_the_relative_property_and_capes_augmentation(variant: str) -> None:
    torch.manual_seed(0)
    extra = {"heads": 2} if variant == "mixed" else {}
    enc = cape.build(f"rope-{variant}", 16, pos_dim=4, max_global_shift=0.2, **extra)
    q, k = torch.randn(2, 2, 6, 16), torch.randn(2, 2, 6, 16)
    pos = torch.rand(2, 6, 4)
    enc.eval()
    a = enc(q, k, positions=pos)
    b = enc(q, k, positions=pos + torch.tensor([0.3, -0.2, 0.1, 0.5]))
    torch.testing.assert_close(
        a[0] @ a[1].transpose(-1, -2), b[0] @ b[1].transpose(-1, -2), rtol=1e-4, atol=1e-4
    )
    enc.train()  # a global shift per sample and axis cancels in every logit
    c = enc(q, k, positions=pos)
    torch.testing.assert_close(
        c[0] @ c[1].transpose(-1, -2), a[0] @ a[1].transpose(-1, -2), rtol=1e-4, atol=1e-4
    )
    assert enc.frequencies.shape[0] == 4


def test_four_axes_refusals_name_the_argument() -> None:
    with pytest.raises(ValueError, match="divisible by 2 x pos_dim = 8"):
        cape.RoPE2d(12, pos_dim=4)  # axial: 2 x 4 axes
    cape.RoPE2d(12, variant="mixed", heads=2, pos_dim=4)  # mixed: planes span every axis
    with pytest.raises(ValueError, match="fit_grid applies to pos_dim=2"):
        cape.RoPE2d(16, pos_dim=4, fit_grid=(4, 4))
    with pytest.raises(ValueError, match="pos_dim"):
        cape.RoPE2d(16, pos_dim=1)
    enc = cape.RoPE2d(16, pos_dim=4)
    with pytest.raises(ValueError, match="a grid needs 2"):
        enc.grid_positions(2, 2)
    with pytest.raises(ValueError, match="positions must have 4 coordinate"):
        enc(torch.zeros(1, 1, 3, 16), torch.zeros(1, 1, 3, 16), positions=torch.zeros(1, 3, 2))
    with pytest.raises(ValueError, match="share M"):
        mixed_angles(torch.zeros(1, 3, 2), torch.zeros(2, 4, 8))
