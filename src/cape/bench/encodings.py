"""`cape bench encodings`: fwd+bwd cost of an encoding against adding a precomputed table.

Each case times `x + emb(x)` then backward, against `x + table` (a precomputed buffer), in one
process and interleaved, so the printed ratios are comparable on a noisy machine.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..encodings.sinusoidal import CAPE1d, CAPE2d
from .timing import time_interleaved

__all__ = ["Case", "CASES", "run_case", "main"]


@dataclass(frozen=True)
class Case:
    name: str
    shape: tuple[int, ...]  # x: [B, T, D] or [B, H, W, D]
    make: Callable[[int], torch.nn.Module]
    train: bool
    target: float  # the ratio the issue asks for


CASES = [
    Case("CAPE1d train, all aug", (32, 1000, 512), lambda d: CAPE1d.preset("text", d, max_global_scaling=1.1, normalize=True), True, 2.0),
    Case("CAPE1d train, all aug", (32, 100, 512), lambda d: CAPE1d.preset("text", d, max_global_scaling=1.1, normalize=True), True, 4.0),
    Case("CAPE2d train, all aug", (64, 14, 14, 768), lambda d: CAPE2d.preset(d), True, 2.5),
    Case("CAPE1d eval", (32, 1000, 512), lambda d: CAPE1d.preset("text", d, normalize=True), False, 1.3),
    Case("CAPE2d eval", (64, 14, 14, 768), lambda d: CAPE2d.preset(d), False, 1.3),
]


def run_case(case: Case, *, runs: int = 20, device: str = "cpu", dtype=torch.float32) -> dict:
    dev = torch.device(device)
    x = torch.randn(case.shape, device=dev, dtype=dtype, requires_grad=True)
    grad = torch.ones_like(x)
    table = torch.randn(case.shape[1:], device=dev, dtype=dtype)
    enc = case.make(case.shape[-1]).to(dev).train(case.train)

    def baseline() -> None:
        (x + table).backward(grad)

    def encoded() -> None:
        (x + enc(x)).backward(grad)

    def fused() -> None:
        enc.add_to(x).backward(grad)

    base, cost, cost_fused = time_interleaved([baseline, encoded, fused], runs=runs, device=dev)
    ref = base.median_ms
    return dict(
        case=case.name, shape="x".join(map(str, case.shape)), table_ms=ref,
        encoding_ms=cost.median_ms, encoding_iqr_ms=cost.iqr_ms,
        ratio=cost.median_ms / ref, target=case.target,
        fused_ms=cost_fused.median_ms, fused_ratio=cost_fused.median_ms / ref,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cape bench encodings", description=__doc__)
    p.add_argument("--runs", type=int, default=20, help="timed runs per measurement (>= 20)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, fp32")
    print("| case | x shape | table add ms | x + enc(x) ms (IQR) | ratio | enc.add_to(x) ms | ratio | target |")
    print("|---|---|---|---|---|---|---|---|")
    for case in CASES:
        r = run_case(case, runs=args.runs, device=args.device)
        ok = "ok" if min(r["ratio"], r["fused_ratio"]) <= r["target"] else "MISSED"
        print(f"| {r['case']} | {r['shape']} | {r['table_ms']:.2f} | {r['encoding_ms']:.2f} "
              f"({r['encoding_iqr_ms']:.2f}) | {r['ratio']:.2f} | {r['fused_ms']:.2f} | "
              f"{r['fused_ratio']:.2f} | <= {r['target']} {ok} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
