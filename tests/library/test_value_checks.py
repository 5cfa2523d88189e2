"""Checks of tensor values: once at the public boundary, the same on every device, switchable."""

from __future__ import annotations

import threading

import pytest
import torch

import cape
from cape.models import TransformerEncoder

NAN_POSITIONS = torch.tensor([[0.0, 1.0, float("nan"), 3.0]])


class _HostReads:
    """Counts the reads of tensor values on the host (each one a sync on an accelerator)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for name in ("__bool__", "__float__", "__int__", "item", "tolist"):
            original = getattr(torch.Tensor, name)

            def counted(t, *a, _original=original, **k):
                self.count += 1
                return _original(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, counted)


def _encoder(name: str, layers: int) -> TransformerEncoder:
    options = {"augmentation": cape.Augmentation(max_global_shift=2.0)} if name == "rotary" else {}
    torch.manual_seed(0)
    return TransformerEncoder(layers, 32, 4, 64, position=name, position_options=options)


@pytest.mark.parametrize("name", ["rotary", "alibi", "fire", "relpos", "cape1d"])
def test_host_reads_do_not_grow_with_depth(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # validation once at the boundary: a 6-layer stack reads as many values as a 1-layer one
    x = torch.randn(2, 7, 32)
    positions = torch.arange(7.0).repeat(2, 1) * 0.5
    counts = []
    for layers in (1, 6):
        model = _encoder(name, layers).train()
        reads = _HostReads(monkeypatch)
        model(x, positions=positions)
        counts.append(reads.count)
        monkeypatch.undo()
    assert counts[0] == counts[1], counts
    assert counts[0] > 0  # the boundary did read the values


def test_value_checks_can_be_turned_off_and_back_on() -> None:
    model = _encoder("rotary", 2).eval()
    x = torch.randn(1, 4, 32)
    with pytest.raises(ValueError, match="positions must be finite"):
        model(x, positions=NAN_POSITIONS)
    assert cape.value_checks_enabled()
    with cape.value_checks(False):
        assert not cape.value_checks_enabled()
        out = model(x, positions=NAN_POSITIONS)  # nothing read: the NaN flows through
        assert torch.isnan(out).any()
    assert cape.value_checks_enabled()
    cape.value_checks(False)  # as a function: off until turned on again
    try:
        assert torch.isnan(model(x, positions=NAN_POSITIONS)).any()
    finally:
        cape.value_checks(True)
    with pytest.raises(ValueError, match="positions must be finite"):
        model(x, positions=NAN_POSITIONS)
    with pytest.raises(TypeError, match="enabled must be a bool"):
        cape.value_checks("no")  # type: ignore[arg-type]


def test_value_checks_switch_is_per_thread() -> None:
    seen = []
    with cape.value_checks(False):
        worker = threading.Thread(target=lambda: seen.append(cape.value_checks_enabled()))
        worker.start()
        worker.join()
    assert seen == [True]


def test_an_error_inside_a_checked_block_leaves_the_checks_on() -> None:
    # the attention's block skips the layers' own checks; an exception must not leave it open
    attn = cape.models.MultiheadAttention(32, 4, rotary=cape.Rotary(8))
    with pytest.raises(ValueError):
        attn(torch.randn(1, 4, 32), key_value=torch.randn(1, 4, 32), q_positions=NAN_POSITIONS)
    with pytest.raises(ValueError, match="finite"):
        cape.Rotary(8)(torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), positions=NAN_POSITIONS)


@pytest.mark.slow
def test_stack_compiles_without_graph_breaks() -> None:
    # the checked block is a no-op under torch.compile: one graph for the whole stack
    torch._dynamo.reset()
    model = _encoder("rotary", 2).train()
    explained = torch._dynamo.explain(model)(torch.randn(2, 6, 32))
    assert explained.graph_break_count == 0, explained.break_reasons


BAD_INPUTS = {
    "NaN positions": lambda m, x: m(x, positions=NAN_POSITIONS.to(x.device)),
    "infinite positions": lambda m, x: m(
        x, positions=torch.tensor([[0.0, float("inf"), 2.0, 3.0]], device=x.device)
    ),
}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
@pytest.mark.parametrize("name", ["rotary", "alibi", "fire", "relpos", "cape1d"])
def test_cpu_and_cuda_refuse_the_same_inputs(name: str, case: str) -> None:
    messages = []
    for device in ("cpu", "cuda"):
        model = _encoder(name, 2).to(device).eval()
        with pytest.raises(ValueError) as err:
            BAD_INPUTS[case](model, torch.randn(1, 4, 32, device=device))
        messages.append(str(err.value))
    assert messages[0] == messages[1]
