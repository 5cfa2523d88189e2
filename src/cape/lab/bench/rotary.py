"""`cape bench rotary`: `cape.Rotary` against rotary-embedding-torch on the same shapes.

Each cell times forward + backward of rotating q and k [B, H, T, hd] (fp32, train mode, loss =
sum of q' and k'): cape's `Rotary(hd)(q, k)` against rotary-embedding-torch's
`RotaryEmbedding(hd).rotate_queries_or_keys` applied to q and to k (its interleaved layout, the
same angles), both from fresh leaf tensors that need gradients. The two are timed round-robin
in one process (`time_interleaved`), so the ratio cape / reference of a cell is measured in one
run. rotary-embedding-torch is a test-only reference: `pip install "cape[test]"`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from cape.encodings.rotary import Rotary
from cape.lab.arguments import ArgumentParser, out_folder
from cape.lab.bench.results import machine, write_results
from cape.lab.bench.timing import time_interleaved

__all__ = ["rotary_updates", "run", "main"]

# the target shapes: B8 H8 d64 at T 100 and 1000
DEFAULT = dict(batch=8, heads=8, head_dim=64, lengths=(100, 1000))


def rotary_updates(
    batch: int, heads: int, length: int, head_dim: int
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(cape's update, the reference's update): forward + backward of rotating q and k."""
    from rotary_embedding_torch import RotaryEmbedding  # the reference: test extra only

    gen = torch.Generator().manual_seed(0)
    q0 = torch.randn(batch, heads, length, head_dim, generator=gen)
    k0 = torch.randn(batch, heads, length, head_dim, generator=gen)
    ours = Rotary(head_dim).train()
    ref = RotaryEmbedding(head_dim)

    def cape_update() -> None:
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        qr, kr = ours(q, k)
        (qr.sum() + kr.sum()).backward()

    def ref_update() -> None:
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        qr, kr = ref.rotate_queries_or_keys(q), ref.rotate_queries_or_keys(k)
        (qr.sum() + kr.sum()).backward()

    return cape_update, ref_update


def run(
    *,
    batch: int = 8,
    heads: int = 8,
    head_dim: int = 64,
    lengths: tuple[int, ...] = (100, 1000),
    warmup: int = 3,
    runs: int = 30,
) -> list[dict[str, Any]]:
    """One row per length: medians (ms), IQRs and the ratio cape / reference."""
    rows = []
    for length in lengths:
        ours, ref = rotary_updates(batch, heads, length, head_dim)
        t_ours, t_ref = time_interleaved([ours, ref], runs=runs, warmup=warmup)
        rows.append(
            {
                "shape": f"B{batch} H{heads} T{length} d{head_dim}",
                "cape_ms": t_ours.median_ms,
                "cape_iqr_ms": t_ours.iqr_ms,
                "reference_ms": t_ref.median_ms,
                "reference_iqr_ms": t_ref.iqr_ms,
                "ratio": t_ours.median_ms / t_ref.median_ms,
            }
        )
    return rows


def _parser() -> argparse.ArgumentParser:
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
    try:
        lengths = tuple(int(v) for v in args.lengths.split(",") if v.strip())
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 1:
        p.error(f"--lengths must be a comma list of integers >= 1, got {args.lengths!r}")
    for flag, value, low in (
        ("--batch", args.batch, 1),
        ("--heads", args.heads, 1),
        ("--head-dim", args.head_dim, 2),
        ("--warmup", args.warmup, 0),
        ("--runs", args.runs, 1),
    ):
        if value < low:
            p.error(f"{flag} must be >= {low}, got {value}")
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
        title="cape.Rotary against rotary-embedding-torch (fwd+bwd of q and k, fp32)",
        columns=["shape", "cape_ms", "reference_ms", "ratio"],
        meta={**machine("cpu"), "runs": args.runs, "warmup": args.warmup},
        notes="ratio = cape median / reference median, timed round-robin in one process; "
        "below 1: cape is faster.",
        digits=3,
    )
    return 0
