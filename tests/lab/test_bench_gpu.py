"""cape bench gpu: its cases run on any device, bf16 agrees with fp32, and the CUDA-only checks
refuse a CPU-only machine with a clear message (they run for real where CUDA is present)."""

from __future__ import annotations

import pytest
import torch

from cape.lab.bench import gpu

CPU = torch.device("cpu")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("name", sorted(gpu.SYNC_CASES))
def test_cases_train_on_cpu(name: str) -> None:
    torch.manual_seed(0)
    module, loss_fn = gpu.SYNC_CASES[name](CPU)
    loss = loss_fn(module)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in module.parameters() if p.requires_grad]
    if grads or not name.startswith(("cape1d", "sinpos")):  # sinusoids have no parameters
        assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", ["cape1d train", "vit cape2d train", "ctc relpos"])
def test_bf16_check_agrees_with_fp32_on_cpu(name: str) -> None:
    row = gpu.check_bf16(name, CPU)
    assert row["result"] == "ok", row


def test_bf16_check_can_fail() -> None:
    """A tolerance no bf16 run meets: the check reports FAILED instead of passing blindly."""
    row = gpu.check_bf16("vit cape2d train", CPU, rtol=0.0)
    assert row["result"] == "FAILED" and "->" in row["detail"]


def test_phase_and_fused_checks_pass_on_cpu() -> None:
    """bf16 autocast keeps the phases in float32 (outputs equal the fp32 maths cast, bit for
    bit), and the fused path agrees with the eager one; both also run on CUDA in the check."""
    row = gpu.check_phases(CPU)
    assert row["result"] == "ok", row
    assert float(row["detail"].split("up to ")[1].split()[0]) > 0.5  # bf16 phases would show
    row = gpu.check_fused(CPU)
    assert row["result"] == "ok" and "compiled: True" in row["detail"], row


def test_phase_check_fails_when_phases_are_rounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Were autocast left on around the phases (no float32 region) and an op there ran in
    bf16 under it, the check would say FAILED."""
    import contextlib

    import cape.functional.sinusoidal as sinusoidal

    original = sinusoidal.shifted_sine

    def autocast_rounds(positions, freqs2, offset):
        if torch.is_autocast_enabled("cpu"):  # as a bf16 op would under autocast
            positions = positions.to(torch.bfloat16).float()
        return original(positions, freqs2, offset)

    monkeypatch.setattr("cape.encodings.sinusoidal.shifted_sine", autocast_rounds)
    assert gpu.check_phases(CPU)["result"] == "ok"  # cape's float32 region protects them
    monkeypatch.setattr(
        "cape.encodings.base.float32_region", lambda device: contextlib.nullcontext()
    )
    assert gpu.check_phases(CPU)["result"] == "FAILED"


def test_main_refuses_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--device", "cpu"], ["--device", "tpu:0"]):
        with pytest.raises(SystemExit) as err:
            gpu.main(argv)
        assert err.value.code == 2
        assert "--device must be cuda[:N]" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as err:
            gpu.main([])
        assert err.value.code == 2 and "needs a CUDA device" in capsys.readouterr().err


@CUDA
@pytest.mark.parametrize("name", sorted(gpu.SYNC_CASES))
def test_no_host_sync_on_cuda(name: str) -> None:
    assert gpu.check_sync(name, torch.device("cuda"))["result"] == "ok"


@CUDA
def test_cuda_graph_training_step() -> None:
    row = gpu.check_graph_step(torch.device("cuda"))
    assert row["result"] == "ok", row
