"""`cape bench rotary`: cape's rotary, ALiBi and FIRE against the public packages, in one run.

Each row times cape against a reference package round-robin in one process
(`time_interleaved`), so its ratio cape / reference is measured in one run, and every row of a
table comes from the same invocation:

- rotary (eager, `cape.fusion(False)`) and rotary (fused, `cape.fusion(True)`: the compiled
  kernel): forward + backward of rotating q and k [B, H, T, hd] (fp32, train mode, loss = sum
  of q' and k'), against rotary-embedding-torch's `RotaryEmbedding(hd).rotate_queries_or_keys`
  on q and on k (its interleaved layout, the same angles), from fresh leaves needing gradients;
- alibi: the bias [B, H, T, T] of per-sample positions [B, T] (forward; no parameters), against
  x-transformers' `AlibiPositionalBias.forward_custom_pos` (same slopes);
- fire: forward + backward of FIRE's bias [1, H, T, T] (its MLP over the T x T normalised
  distances, shared by the batch), against x-transformers' `DynamicPositionBias` (depth 2,
  width 32: the nearest peer, an MLP bias over relative distances; it has no FIRE, and its MLP
  reads the 2T - 1 distances only, then gathers: cheaper than FIRE's by construction).

The references are test-only: `pip install "cape[test]"`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cape import fusion
from cape.build import build
from cape.encodings.rotary import Rotary
from cape.lab.arguments import ArgumentParser, out_folder
from cape.lab.bench.results import machine, write_results
from cape.lab.timing import time_interleaved

__all__ = ["rotary_updates", "bias_updates", "run", "main"]

# the shapes the targets are set at: B8 H8 d64 at T 100 and 1000
DEFAULT = dict(batch=8, heads=8, head_dim=64, lengths=(100, 1000))
Update = Callable[[], object]


def rotary_updates(
    batch: int, heads: int, length: int, head_dim: int, fused: bool = False
) -> tuple[Update, Update]:
    """(cape's update, the reference's update): forward + backward of rotating q and k;
    fused: cape's compiled kernel (`cape.fusion(True)`), else its eager path."""
    from rotary_embedding_torch import RotaryEmbedding  # the reference: test extra only

    gen = torch.Generator().manual_seed(0)
    q0 = torch.randn(batch, heads, length, head_dim, generator=gen)
    k0 = torch.randn(batch, heads, length, head_dim, generator=gen)
    ours = Rotary(head_dim).train()
    ref = RotaryEmbedding(head_dim)

    def cape_update() -> None:
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        with fusion(fused):
            qr, kr = ours(q, k)
        (qr.sum() + kr.sum()).backward()

    def ref_update() -> None:
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        qr, kr = ref.rotate_queries_or_keys(q), ref.rotate_queries_or_keys(k)
        (qr.sum() + kr.sum()).backward()

    return cape_update, ref_update


def bias_updates(name: str, batch: int, heads: int, length: int) -> tuple[Update, Update]:
    """(cape's update, x-transformers' update) of an attention bias: "alibi" (forward of
    [B, H, T, T] from per-sample positions) or "fire" (forward + backward of [1, H, T, T])."""
    from x_transformers.x_transformers import AlibiPositionalBias, DynamicPositionBias

    torch.manual_seed(0)
    if name == "alibi":
        pos = torch.arange(length, dtype=torch.float32).expand(batch, length).contiguous()
        ours, ref = build("alibi", heads).eval(), AlibiPositionalBias(heads)
        return lambda: ours(pos), lambda: ref.forward_custom_pos(pos)
    if name != "fire":
        raise ValueError(f"name must be 'alibi' or 'fire', got {name!r}")
    fire = build("fire", heads).train()
    dpb = DynamicPositionBias(dim=32, heads=heads, depth=2)
    tokens = torch.arange(length, dtype=torch.float32)[None]  # [1, T]: shared by the batch
    return lambda: fire(tokens).sum().backward(), lambda: dpb(length, length).sum().backward()


_ROWS = (
    ("rotary (eager)", "rotary-embedding-torch"),
    ("rotary (fused)", "rotary-embedding-torch"),
    ("alibi", "x-transformers AlibiPositionalBias"),
    ("fire", "x-transformers DynamicPositionBias"),
)


def _updates(row: str, batch: int, heads: int, length: int, head_dim: int) -> tuple[Update, Update]:
    if row.startswith("rotary"):
        return rotary_updates(batch, heads, length, head_dim, fused=row == "rotary (fused)")
    return bias_updates(row, batch, heads, length)


def run(
    *,
    batch: int = 8,
    heads: int = 8,
    head_dim: int = 64,
    lengths: tuple[int, ...] = (100, 1000),
    warmup: int = 3,
    runs: int = 30,
) -> list[dict[str, Any]]:
    """One row per encoding and length: medians (ms), IQRs and the ratio cape / reference."""
    rows = []
    for row, reference in _ROWS:
        for length in lengths:
            ours, ref = _updates(row, batch, heads, length, head_dim)
            t_ours, t_ref = time_interleaved([ours, ref], runs=runs, warmup=warmup)
            rows.append(
                {
                    "encoding": row,
                    "reference": reference,
                    "shape": f"B{batch} H{heads} T{length} d{head_dim}",
                    "cape_ms": t_ours.median_ms,
                    "cape_iqr_ms": t_ours.iqr_ms,
                    "reference_ms": t_ref.median_ms,
                    "reference_iqr_ms": t_ref.iqr_ms,
                    "ratio": t_ours.median_ms / t_ref.median_ms,
                }
            )
    return rows


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="cape bench rotary", description=__doc__)
    p.add_argument("--batch", type=int, default=DEFAULT["batch"])
    p.add_argument("--heads", type=int, default=DEFAULT["heads"])
    p.add_argument("--head-dim", type=int, default=DEFAULT["head_dim"], help="even")
    p.add_argument("--lengths", default="100,1000", help="comma list of sequence lengths")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--runs", type=int, default=30, help="timed updates of each")
    p.add_argument("--out", type=out_folder, default=None, help="folder for rotary.md/.csv")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    lengths = tuple(p.positive_ints("--lengths", args.lengths))
    p.at_least(
        ("--batch", args.batch, 1),
        ("--heads", args.heads, 1),
        ("--head-dim", args.head_dim, 2),
        ("--warmup", args.warmup, 0),
        ("--runs", args.runs, 1),
    )
    if args.head_dim % 2:
        p.error(f"--head-dim must be even, got {args.head_dim}")
    rows = run(
        batch=args.batch,
        heads=args.heads,
        head_dim=args.head_dim,
        lengths=lengths,
        warmup=args.warmup,
        runs=args.runs,
    )
    write_results(
        args.out,
        "rotary",
        rows,
        title="cape's rotary, ALiBi and FIRE against rotary-embedding-torch and x-transformers",
        columns=["encoding", "reference", "shape", "cape_ms", "reference_ms", "ratio"],
        meta={**machine("cpu"), "runs": args.runs, "warmup": args.warmup},
        notes="ratio = cape median / reference median, each row timed round-robin in one "
        "process, all rows in one run; below 1: cape is faster. Rotary: fwd+bwd of q and k, "
        "fp32; alibi: the bias of per-sample positions, forward; fire: fwd+bwd of the shared "
        "bias (x-transformers has no FIRE: DynamicPositionBias is the nearest MLP bias, and "
        "reads 2T - 1 distances where FIRE reads T x T).",
        digits=3,
    )
    return 0
