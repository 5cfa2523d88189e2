"""How the rotary family rotates (`cape.encodings.rotation`): the eager path's whole-width
form and its backward (the rotation by -angles) against autograd through the rotation written
out by halves here, in every memory layout and shape of angles it is given."""

from __future__ import annotations

import warnings

import pytest
import torch

import cape
from cape.encodings.rotation import rotate
from cape.functional import apply_rotary


def _by_halves(x: torch.Tensor, angles: torch.Tensor, magnitude: torch.Tensor | None):
    """The reference: [x1 cos - x2 sin || x1 sin + x2 cos] of (m x) in float64, angles [B or 1,
    H or 1, T, hd/2]; autograd differentiates it."""
    x64 = x.double() if magnitude is None else x.double() * magnitude.double()
    half = x.shape[-1] // 2
    x1, x2 = x64[..., :half], x64[..., half:]
    cos, sin = angles.double().cos(), angles.double().sin()
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _inputs(layout: str, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    b, h, t, hd = 2, 3, 5, 8
    if layout == "heads inner":  # a projection [B, T, H, hd] split into heads: a transposed view
        x = torch.randn(b, t, h, hd, generator=gen).transpose(1, 2)
    else:
        x = torch.randn(b, h, t, hd, generator=gen)
    return x.to(dtype).requires_grad_(True)


ANGLES = {  # the shapes `rotate` is given, and their [B or 1, H or 1, T, hd/2] form
    "shared [T, c]": (lambda g: torch.randn(5, 4, generator=g) * 30, lambda a: a[None, None]),
    "per batch [B, T, c]": (lambda g: torch.randn(2, 5, 4, generator=g) * 30, lambda a: a[:, None]),
    "per head [1, H, T, c]": (lambda g: torch.randn(1, 3, 5, 4, generator=g), lambda a: a),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("xpos", [False, True])
@pytest.mark.parametrize("angles_case", sorted(ANGLES))
@pytest.mark.parametrize("layout", ["contiguous", "heads inner"])
def test_eager_rotation_and_its_backward_match_autograd(layout, angles_case, xpos, dtype):
    make, as_4d = ANGLES[angles_case]
    gen = torch.Generator().manual_seed(1)
    angles = make(gen)
    magnitude = torch.rand(2, 1, 5, 4, generator=gen).repeat(1, 1, 1, 2) + 0.5 if xpos else None
    x = _inputs(layout, dtype)
    grad = torch.randn(x.shape, generator=gen).to(dtype)
    with cape.fusion(False):
        out = rotate(x, angles, magnitude)
    assert out.dtype == dtype and out.shape == x.shape and out.stride() == x.stride()
    (got,) = torch.autograd.grad(out, x, grad)
    ref_x = x.detach().double().requires_grad_(True)
    ref = _by_halves(ref_x, as_4d(angles), magnitude)
    (want,) = torch.autograd.grad(ref, ref_x, grad.double())
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), ref.detach(), **tol)
    torch.testing.assert_close(got.double(), want, **tol)


def test_eager_rotation_keeps_nothing_of_x_for_its_backward() -> None:
    # the backward is a rotation by -angles: the saved tensors are the angles' (none of q's size)
    x = _inputs("heads inner", torch.float32)
    angles = torch.randn(5, 4)
    saved: list[torch.Tensor] = []
    with (
        cape.fusion(False),
        torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t),
    ):
        out = rotate(x, angles, None)
    assert all(t.numel() < x.numel() for t in saved)
    out.sum().backward()
    assert x.grad is not None


def test_learned_angles_still_get_their_gradient() -> None:
    # RoPE-Mixed's frequencies: angles that need a gradient go through autograd's backward
    x = _inputs("contiguous", torch.float32)
    angles = (torch.randn(1, 3, 5, 4) * 3).requires_grad_(True)
    with cape.fusion(False):
        rotate(x, angles, None).square().sum().backward()
    ref_angles = angles.detach().double().requires_grad_(True)
    _by_halves(x.detach(), ref_angles, None).square().sum().backward()
    torch.testing.assert_close(angles.grad.double(), ref_angles.grad, rtol=1e-5, atol=1e-5)


def test_apply_rotary_eager_equals_the_halves() -> None:
    # the public function's eager form (whole-width) against the formula by halves
    x = torch.randn(2, 3, 5, 8)
    angles = torch.randn(2, 5, 4) * 100
    want = _by_halves(x, angles[:, None], None)
    torch.testing.assert_close(apply_rotary(x, angles).double(), want, rtol=1e-5, atol=1e-5)
    rot = cape.build("rotary", 8).train()
    q = x.transpose(1, 2).contiguous().transpose(1, 2)
    with cape.fusion(False):
        eager_q, _ = rot(q, q)
    torch.testing.assert_close(eager_q, rot(x, x)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fuse", [False, True])
def test_torch_func_grad_and_vmap_take_the_rotation(fuse: bool) -> None:
    # per-sample gradients (torch.func.vmap of torch.func.grad, as Opacus-style code does) go
    # through the rotation's own backward; inside functorch nothing is compiled, and the fused
    # path is not switched off for the rest of the process
    from cape import _fusion

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 2, 3, 6, 8, generator=gen)  # 4 samples of [B, H, T, hd]
    angles = torch.randn(6, 4, generator=gen) * 10
    rot = cape.build("rotary", 8).train()

    def loss(q: torch.Tensor) -> torch.Tensor:
        a, b = rot(q, q.flip(-1))
        return (a * b).sum() + rotate(q, angles, None).square().sum()

    with cape.fusion(fuse), warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed compile would warn
        per_sample = torch.func.vmap(torch.func.grad(loss))(x)
    assert _fusion._STATE.broken is None
    for i in range(x.shape[0]):
        xi = x[i].clone().requires_grad_(True)
        with cape.fusion(False):
            loss(xi).backward()
        torch.testing.assert_close(per_sample[i], xi.grad, rtol=1e-5, atol=1e-5)
