"""`cape bench rotary`: cape.Rotary against rotary-embedding-torch, ratios of one run."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from cape.lab.bench import rotary as bench
from cape.lab.cli import main as cli

pytest.importorskip("rotary_embedding_torch")


def test_both_updates_rotate_alike_and_get_gradients() -> None:
    """The two timed updates do the same work: the same rotation (up to the channel layout)
    and a backward pass each."""
    from rotary_embedding_torch import RotaryEmbedding

    q = torch.randn(2, 3, 7, 8)
    ours, _ = bench.Rotary(8)(q, q)
    ref = RotaryEmbedding(8).rotate_queries_or_keys(q)
    # cape pairs channel c with c + hd/2; the reference pairs 2c with 2c + 1
    half = torch.cat([ref[..., 0::2], ref[..., 1::2]], dim=-1)
    qh = torch.cat([q[..., 0::2], q[..., 1::2]], dim=-1)
    ours_h, _ = bench.Rotary(8)(qh, qh)
    assert torch.allclose(ours_h, half, atol=1e-5) and ours.shape == ref.shape
    cape_update, ref_update = bench.rotary_updates(1, 2, 5, 8)
    cape_update()
    ref_update()


def test_cli_writes_the_ratio_of_one_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["--batch", "1", "--heads", "2", "--head-dim", "8", "--lengths", "4,9"]
    assert (
        cli(["bench", "rotary", *args, "--runs", "2", "--warmup", "0", "--out", str(tmp_path)]) == 0
    )
    with open(tmp_path / "rotary.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["shape"] for r in rows] == ["B1 H2 T4 d8", "B1 H2 T9 d8"]
    for r in rows:
        assert float(r["ratio"]) == pytest.approx(
            float(r["cape_ms"]) / float(r["reference_ms"]), rel=1e-2
        )
    assert "ratio" in (tmp_path / "rotary.md").read_text()
    with pytest.raises(SystemExit) as stop:  # argparse's exit: code 2, one line
        cli(["bench", "rotary", "--head-dim", "7"])
    assert stop.value.code == 2
    assert "--head-dim must be even" in capsys.readouterr().err
