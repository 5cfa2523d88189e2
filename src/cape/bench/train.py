"""`cape bench train`: throughput of a Transformer training step as a fraction of matmul peak.

The peak is measured in the same run: the best time of a large square matmul in the same dtype.
A step's FLOPs are counted analytically (matmuls only): per layer and token, forward
8 d^2 (q, k, v, out projections) + 4 d f (FFN) + 4 T d (scores and weighted sum), and the
backward pass costs twice the forward.
"""

from __future__ import annotations

import argparse
import time

import torch

from ..build import build
from ..models import TransformerEncoder
from .timing import time_interleaved

__all__ = ["matmul_peak", "step_flops", "main"]


def matmul_peak(dtype: torch.dtype, n: int = 2048, runs: int = 5) -> float:
    """Measured FLOP/s of an n x n x n matmul in `dtype` (best of `runs`)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def step_flops(layers: int, dim: int, ffn: int, batch: int, length: int) -> float:
    """Matmul FLOPs of one training step (forward + backward) of the encoder."""
    per_token = 8 * dim * dim + 4 * dim * ffn + 4 * length * dim
    return 3.0 * layers * batch * length * per_token


def _time_step(args: argparse.Namespace, ffn: int, dtype: torch.dtype):
    """Median time of one AdamW training step of the encoder (autocast for bf16)."""
    torch.manual_seed(0)
    model = TransformerEncoder(args.layers, args.dim, args.heads, ffn, dropout=0.0,
                               position=build(args.position, args.dim))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.length, args.dim)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    (timing,) = time_interleaved([step], runs=args.runs, warmup=2)
    return timing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cape bench train", description=__doc__)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--position", default="cape1d", help="an encoding name of cape.build")
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args(argv)
    ffn = 4 * args.dim
    flops = step_flops(args.layers, args.dim, ffn, args.batch, args.length)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; encoder {args.layers} x "
          f"d{args.dim} ffn{ffn}, B{args.batch} T{args.length}, position {args.position}")
    print("| precision | step ms (IQR) | tokens/s | achieved GFLOP/s | matmul peak GFLOP/s | fraction |")
    print("|---|---|---|---|---|---|")
    for name, dtype in (("fp32", torch.float32), ("bf16 autocast", torch.bfloat16)):
        timing = _time_step(args, ffn, dtype)
        peak = matmul_peak(dtype)
        achieved = flops / (timing.median_ms / 1e3)
        tokens = args.batch * args.length / (timing.median_ms / 1e3)
        print(f"| {name} | {timing.median_ms:.1f} ({timing.iqr_ms:.1f}) | {tokens:,.0f} | "
              f"{achieved / 1e9:.1f} | {peak / 1e9:.1f} | {achieved / peak:.0%} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
