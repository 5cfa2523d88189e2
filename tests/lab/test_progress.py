"""cape.lab.progress: a bar on a terminal at rank 0, silent elsewhere; the lab's only tqdm user."""

from __future__ import annotations

import io

import pytest

from cape.lab.progress import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _terminal(monkeypatch: pytest.MonkeyPatch) -> _Terminal:
    """stderr as a terminal, at rank 0. Called in the test body: pytest's output capture puts
    its own stderr back between a fixture's setup and the test."""
    stream = _Terminal()
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.delenv("RANK", raising=False)
    return stream


def test_draws_on_a_terminal_at_rank_0(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _terminal(monkeypatch)
    assert list(progress(range(3), desc="demo-bar")) == [0, 1, 2]
    assert "demo-bar" in terminal.getvalue() and "3/3" in terminal.getvalue()


def test_manual_bar_counts_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _terminal(monkeypatch)
    with progress(total=5, desc="manual", unit="img") as bar:
        bar.update(2)
        bar.update(3)
        assert bar.n == 5
    assert "5/5" in terminal.getvalue() and "img" in terminal.getvalue()


@pytest.mark.parametrize("why", ["not a terminal", "disabled", "rank 1"])
def test_silent_elsewhere(monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    terminal = _terminal(monkeypatch)
    enabled = True
    if why == "not a terminal":
        monkeypatch.setattr(terminal, "isatty", lambda: False)
    elif why == "disabled":
        enabled = False
    else:
        monkeypatch.setenv("RANK", "1")  # torchrun's rank, before any process group exists
    bar = progress(range(4), total=4, desc="quiet", enabled=enabled)
    assert list(bar) == [0, 1, 2, 3]  # still iterates
    bar = progress(total=2, enabled=enabled)
    bar.update(2)
    bar.close()
    assert terminal.getvalue() == ""


# -- StepLines: the training loop's progress off a terminal -----------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_step_lines_every_interval_with_loss_rate_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from cape.lab.progress import StepLines

    monkeypatch.delenv("RANK", raising=False)
    log, clock = io.StringIO(), _Clock()  # a log file: not a terminal
    lines = StepLines(100, 0, "train", every=30.0, stream=log, clock=clock)
    printed = []
    for step in range(1, 101):
        clock.now += 1.0  # one step a second
        loss = torch.tensor(float(step))  # a tensor, as the engine passes it
        printed.append(lines.update(step, loss))
    shown = [p for p in printed if p is not None]
    assert log.getvalue().splitlines() == shown
    # steps 30, 60, 90 (30 s each) and the last
    assert [s.split()[2] for s in shown] == ["30/100", "60/100", "90/100", "100/100"]
    assert shown[0] == "train step 30/100 loss 15.5 steps/s 1 ETA 1m10s"  # mean of steps 1..30
    assert shown[1].startswith("train step 60/100 loss 45.5 steps/s 1 ETA 40s")
    assert shown[-1] == "train step 100/100 loss 95.5 steps/s 1 done in 1m40s"


def test_step_lines_of_a_resumed_run_count_its_session(monkeypatch: pytest.MonkeyPatch) -> None:
    from cape.lab.progress import StepLines

    monkeypatch.delenv("RANK", raising=False)
    log, clock = io.StringIO(), _Clock()
    lines = StepLines(1000, 500, every=10.0, stream=log, clock=clock)
    clock.now += 10.0
    assert lines.update(520, 2.0) == "train step 520/1000 loss 2 steps/s 2 ETA 4m00s"


@pytest.mark.parametrize("why", ["terminal", "every 0", "disabled", "rank 1"])
def test_step_lines_silent_where_a_bar_is_or_nobody_asked(
    monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    from cape.lab.progress import StepLines

    monkeypatch.delenv("RANK", raising=False)
    stream: io.StringIO = _Terminal() if why == "terminal" else io.StringIO()
    if why == "rank 1":
        monkeypatch.setenv("RANK", "1")
    lines = StepLines(
        3,
        every=0.0 if why == "every 0" else 1e-9,
        enabled=why != "disabled",
        stream=stream,
        clock=_Clock(),
    )
    assert [lines.update(s, 1.0) for s in (1, 2, 3)] == [None, None, None]
    assert stream.getvalue() == ""


def test_trainer_prints_progress_lines_off_a_terminal(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pytest's captured stderr is not a terminal: the engine prints lines, not a bar."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import TensorDataset

    from cape.lab.train import TrainConfig, Trainer

    x = torch.randn(32, 4)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    model = nn.Linear(4, 1)

    def loss_fn(m, batch):
        return F.mse_loss(m(batch[0]), batch[1]), {}

    cfg = TrainConfig(steps=5, batch_size=8, progress_every=1e-9)  # every step
    Trainer(model, loss_fn, data, None, cfg, tmp_path / "run").fit()
    err = capsys.readouterr().err.splitlines()
    steps = [line.split()[2] for line in err if line.startswith("train step ")]
    assert steps == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    assert all(" loss " in line and " steps/s " in line for line in err)
    assert "\r" not in "".join(err)  # no bar
    with pytest.raises(ValueError, match="train.progress_every"):
        TrainConfig(progress_every=-1)
