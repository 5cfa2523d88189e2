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
