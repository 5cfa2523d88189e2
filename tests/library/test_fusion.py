"""The fused path (`cape.fusion`): one compiled kernel agrees with the eager path, and is taken
only where it is safe."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

import cape
from cape import _fusion
from cape.models import TransformerEncoder

AUG = cape.Augmentation(max_global_shift=5.0, max_local_shift=0.5, max_global_scaling=1.3)

# (name, options, content shape, call keywords): every encoding with a kernel, each way of
# giving positions (defaults, padding, seconds, a grid, given positions)
ABSOLUTE = [
    ("cape1d", {"preset": "text", "max_global_scaling": 1.1}, (3, 40, 32), {}),
    ("cape1d", {"preset": "text"}, (3, 40, 32), {"lengths": torch.tensor([40, 7, 1])}),
    ("cape1d", {"preset": "audio"}, (2, 30, 32), {"hop": 0.03}),
    ("cape2d", {"preset": "image"}, (2, 6, 5, 32), {}),
    ("cape2d", {"preset": "image"}, (2, 30, 32), {"grid": (5, 6)}),
    ("sine-2d", {"augmentation": AUG}, (2, 6, 5, 32), {}),
    ("sine-4d", {"augmentation": AUG}, (2, 9, 32), {"positions": torch.rand(2, 9, 4) * 8}),
]
ROTARY = [
    ("rotary", {"augmentation": AUG}),
    ("rotary", {"xpos": True}),
    ("rotary", {"scaling": "yarn", "factor": 4.0, "train_length": 16}),
    ("rotary", {"scaling": "pi", "factor": 2.0, "train_length": 16}),
]


@pytest.fixture(autouse=True, scope="module")
def _fresh_kernels():
    # each kernel keeps a few compiled variants (dtypes, ranks, masks): start from none, so
    # other tests' variants do not count here
    torch._dynamo.reset()
    _fusion._COMPILED.clear()
    _fusion._EAGER.clear()


def _eager_and_fused(call):
    """call(generator) under each path from the same seed -> (eager, fused) outputs."""
    outs = []
    for mode in (False, True):
        with cape.fusion(mode):
            outs.append(call(torch.Generator().manual_seed(7)))
    return outs


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    # inductor's sine is not eager's bit for bit, and the two paths round the phase in
    # different places: phases reach ~1e3 rad (seconds x 30 rad/s, shifted), where float32's
    # spacing is 6e-5; bf16 rounds the sum once or twice
    return {"atol": 5e-4, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.07, "rtol": 0.02}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,options,shape,kw", ABSOLUTE)
def test_absolute_fused_equals_eager(name, options, shape, kw, dtype) -> None:
    enc = cape.build(name, shape[-1], **options).train()
    grads = []

    def call(generator: torch.Generator) -> torch.Tensor:
        x = torch.linspace(-1, 1, torch.Size(shape).numel()).reshape(shape).to(dtype)
        x.requires_grad_(True)
        y = enc.add_to(x, generator=generator, **kw)
        (y.float() * torch.arange(y.shape[-1])).sum().backward()
        grads.append(x.grad)
        return y

    eager, fused = _eager_and_fused(call)
    assert "Compiled" in type(fused.grad_fn).__name__  # the fused path ran
    assert "Compiled" not in type(eager.grad_fn).__name__
    assert fused.dtype == eager.dtype == dtype and fused.shape == eager.shape
    torch.testing.assert_close(fused.float(), eager.float(), **_tolerance(dtype))
    torch.testing.assert_close(grads[1], grads[0])  # d(x + E)/dx = 1 on both paths


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,options", ROTARY)
def test_rotary_fused_equals_eager(name, options, dtype) -> None:
    enc = cape.build(name, 16, **options).train()
    grads = []

    def call(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        q = torch.linspace(-2, 2, 2 * 3 * 24 * 16).reshape(2, 3, 24, 16).to(dtype)
        k = q.flip(-1).clone()
        q.requires_grad_(True)
        out = enc(q, k, generator=generator)
        (out[0].float() * out[1].float()).sum().backward()
        grads.append(q.grad)
        return out

    before = _fusion.compiled_calls()
    with cape.fusion(False):
        call(torch.Generator())
    assert _fusion.compiled_calls() == before  # the eager path runs no kernel
    eager, fused = _eager_and_fused(call)
    assert _fusion.compiled_calls() >= before + 3  # q, k forward; q backward (k needs none)
    for e, f in zip(eager, fused, strict=True):
        assert f.dtype == e.dtype == dtype
        torch.testing.assert_close(f.float(), e.float(), **_tolerance(dtype))
    torch.testing.assert_close(grads[1].float(), grads[0].float(), **_tolerance(dtype))


def test_fused_path_refuses_what_eager_refuses() -> None:
    enc = cape.build("cape1d", 16, preset="text").train()
    x = torch.zeros(1, 4, 16)
    bad = torch.tensor([[[0.0], [1.0], [float("inf")], [3.0]]])
    for mode in (False, True):
        with cape.fusion(mode), pytest.raises(ValueError, match="positions"):
            enc.add_to(x, positions=bad)


def test_auto_mode_fuses_large_contents_only() -> None:
    enc = cape.build("cape1d", 64, preset="text").train()
    small = torch.randn(2, 8, 64)
    assert _fusion.fusion_enabled() is None  # the default: auto
    assert not _fusion.can_fuse(small)
    assert "Compiled" not in type(enc.add_to(small.requires_grad_()).grad_fn).__name__
    large = torch.randn(4, _fusion.MIN_ELEMENTS // 256, 64)
    assert _fusion.can_fuse(large)
    with cape.fusion(False):
        assert not _fusion.can_fuse(large)
    with cape.fusion(True):
        assert _fusion.can_fuse(small)
    assert _fusion.fusion_enabled() is None  # the block restored the switch


def test_not_fused_inside_an_outer_compile_or_trace() -> None:
    # an outer torch.compile fuses the whole graph itself: no compiled call inside it
    seen = []

    def probe(x: torch.Tensor) -> torch.Tensor:
        seen.append(_fusion.can_fuse(x))
        return x + 1

    with cape.fusion(True):
        torch.compile(probe, backend="eager")(torch.randn(4, 4))
        assert seen and not any(seen)
        seen.clear()
        torch.jit.trace(probe, torch.randn(4, 4), check_trace=False)
        assert seen == [False]
        assert _fusion.can_fuse(torch.randn(4, 4))  # outside them, it does


def test_stack_takes_the_fused_path_in_training() -> None:
    torch.manual_seed(0)
    model = TransformerEncoder(1, 32, 4, 64, position="cape1d", position_options={"preset": "text"})
    x = torch.randn(2, 12, 32)
    outs = []
    for mode in (False, True):
        torch.manual_seed(1)
        with cape.fusion(mode):
            outs.append(model(x))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)


def test_a_failed_compile_warns_once_and_stays_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fn, **kw):
        def call(*args):
            raise OSError("no C++ compiler here")  # what a missing toolchain raises

        return call

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(_fusion, "_COMPILED", {})
    monkeypatch.setattr(_fusion._STATE, "broken", None)
    enc = cape.build("cape1d", 16, preset="text").train()
    x = torch.randn(2, 5, 16)
    with cape.fusion(True):
        with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler here"):
            y = enc.add_to(x, generator=torch.Generator().manual_seed(0))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once only: later calls are eager, silently
            assert not _fusion.can_fuse(x)
            enc.add_to(x)
    with cape.fusion(False):
        ref = enc.add_to(x, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(y, ref)


def test_an_error_that_is_not_the_compilers_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the compiler's failures fall back to eager: any other error is the caller's."""

    def raising(fn, **kw):
        def call(*args):
            raise ValueError("the kernel's own error")

        return call

    monkeypatch.setattr(torch, "compile", raising)
    monkeypatch.setattr(_fusion, "_COMPILED", {})
    monkeypatch.setattr(_fusion._STATE, "broken", None)
    enc = cape.build("cape1d", 16, preset="text").train()
    with cape.fusion(True), pytest.raises(ValueError, match="the kernel's own error"):
        enc.add_to(torch.randn(2, 5, 16))
    assert _fusion._STATE.broken is None


def test_switch_arguments_and_environment() -> None:
    with pytest.raises(TypeError, match="enabled"):
        cape.fusion("yes")  # type: ignore[arg-type]
    env = {**os.environ, "CAPE_FUSION": "0"}
    code = "import cape; print(cape.fusion_enabled())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_learned_frequencies_get_their_gradient_on_the_fused_path() -> None:
    # RoPE-Mixed learns its frequencies: its angles need a gradient, so the fused path
    # differentiates through the compiled graph instead of the closed-form backward
    torch.manual_seed(0)
    enc = cape.build("rope-mixed", 16, heads=3)
    q = torch.randn(2, 3, 20, 16, requires_grad=True)
    pos = torch.rand(2, 20, 2) * 4
    grads = []
    for mode in (False, True):
        enc.zero_grad()
        q.grad = None
        with cape.fusion(mode):
            out = enc(q, q.flip(-1), positions=pos)
        (out[0] * out[1]).sum().backward()
        grads.append([q.grad.clone()] + [p.grad.clone() for p in enc.parameters()])
    assert "Compiled" in type(out[0].grad_fn).__name__
    assert len(grads[0]) > 1 and grads[0][1].abs().sum() > 0  # the frequencies learn
    for e, f in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(f, e, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("options", [{}, {"xpos": True}, {"augmentation": AUG}])
def test_rotary_fused_keeps_the_layout_of_split_heads(options: dict) -> None:
    # q, k as attention makes them: a [B, T, H, hd] projection viewed [B, H, T, hd]; the fused
    # rotation works in that memory layout (no copies), with the eager values and gradients
    enc = cape.build("rotary", 16, **options).train()
    outs, grads = [], []
    for mode in (False, True):
        x = torch.linspace(-2, 2, 2 * 24 * 48).reshape(2, 24, 48).requires_grad_(True)
        q = x.view(2, 24, 3, 16).transpose(1, 2)
        with cape.fusion(mode):
            qr, kr = enc(q, q.flip(-1), generator=torch.Generator().manual_seed(3))
        (qr * torch.arange(16) + kr.sin()).sum().backward()
        outs.append((qr, kr))
        grads.append(x.grad)
    assert outs[1][0].transpose(1, 2).is_contiguous()  # x's layout, not [B, H, T, hd]'s
    for e, f in zip(outs[0], outs[1], strict=True):
        torch.testing.assert_close(f, e, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-5)
