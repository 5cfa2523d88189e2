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
    for fused in (False, True):
        cape_update, ref_update = bench.rotary_updates(1, 2, 5, 8, fused=fused)
        cape_update()
        ref_update()


def test_bias_updates_compute_the_same_alibi() -> None:
    """cape's ALiBi and x-transformers' give the same bias on the timed inputs (the slopes
    agree: tests/library/test_alibi.py); FIRE's update reaches its MLP's parameters."""
    pytest.importorskip("x_transformers")
    from x_transformers.x_transformers import AlibiPositionalBias

    pos = torch.arange(6, dtype=torch.float32).expand(2, 6)
    ours = bench.build("alibi", 4).eval()(pos)
    ref = AlibiPositionalBias(4).forward_custom_pos(pos)
    torch.testing.assert_close(ours, ref.expand_as(ours))
    for name in ("alibi", "fire"):
        cape_update, ref_update = bench.bias_updates(name, 2, 4, 6)
        cape_update()
        ref_update()
    with pytest.raises(ValueError, match="alibi"):
        bench.bias_updates("relpos", 2, 4, 6)


def test_cli_writes_the_ratio_of_one_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["--batch", "1", "--heads", "2", "--head-dim", "8", "--lengths", "4,9"]
    assert (
        cli(["bench", "rotary", *args, "--runs", "2", "--warmup", "0", "--out", str(tmp_path)]) == 0
    )
    with open(tmp_path / "rotary.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    # every row in one run: rotary eager and fused against rotary-embedding-torch, ALiBi and FIRE
    # against x-transformers, at each length
    assert [(r["encoding"], r["shape"]) for r in rows] == [
        (name, shape)
        for name in ("rotary (eager)", "rotary (fused)", "alibi", "fire")
        for shape in ("B1 H2 T4 d8", "B1 H2 T9 d8")
    ]
    assert {r["reference"] for r in rows} == {
        "rotary-embedding-torch",
        "x-transformers AlibiPositionalBias",
        "x-transformers DynamicPositionBias",
    }
    for r in rows:
        assert float(r["ratio"]) == pytest.approx(
            float(r["cape_ms"]) / float(r["reference_ms"]), rel=1e-2
        )
    assert "ratio" in (tmp_path / "rotary.md").read_text()
    with pytest.raises(SystemExit) as stop:  # argparse's exit: code 2, one line
        cli(["bench", "rotary", "--head-dim", "7"])
    assert stop.value.code == 2
    assert "--head-dim must be even" in capsys.readouterr().err
