"""`cape bench train`'s engine section: the Trainer's overhead table on a tiny ViT run."""

from __future__ import annotations

import pytest

from cape.lab.bench.train import main


def test_bench_train_reports_engine_overhead(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "--layers",
        "1",
        "--dim",
        "32",
        "--heads",
        "2",
        "--length",
        "16",
        "--batch",
        "2",
        "--runs",
        "1",
        "--peak-size",
        "128",
        "--engine-steps",
        "3",
        "--engine-batch",
        "4",
    ]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {r.split("|")[1].strip(): r.split("|")[2:-1] for r in lines if r.startswith("| ")}
    for category in ("data", "compute", "log", "checkpoint"):
        seconds, share, _ = rows[category]
        assert float(seconds) >= 0 and 0 <= float(share) <= 1
    seconds, fraction, target = rows["engine overhead (data + log + checkpoint)"]
    assert 0 <= float(fraction) <= 1 and "< 0.05" in target
    shares = sum(float(rows[c][1]) for c in ("data", "compute", "log", "checkpoint"))
    assert shares == pytest.approx(1, abs=1e-3)
    assert float(fraction) == pytest.approx(1 - float(rows["compute"][1]), abs=2e-4)
    assert any(line.startswith("ViT step:") and "images/s" in line for line in lines)


def test_bench_train_engine_steps_zero_skips_the_section(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [
        "--layers",
        "1",
        "--dim",
        "32",
        "--heads",
        "2",
        "--length",
        "16",
        "--batch",
        "2",
        "--runs",
        "1",
        "--peak-size",
        "128",
        "--engine-steps",
        "0",
    ]
    assert main(args) == 0
    assert "engine overhead" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--engine-steps", "-1"])
