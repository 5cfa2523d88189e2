"""`cape bench train`: throughput of a Transformer training step as a fraction of matmul peak,
and the overhead of the training engine (`cape.lab.train.Trainer`) around such steps.

The peak is measured in the same run: the best time of a large square matmul in the same dtype.
A step's FLOPs are counted analytically (matmuls only): per layer and token, forward
8 d^2 (q, k, v, out projections) + 4 d f (FFN) + 4 T d (scores and weighted sum), and the
backward pass costs twice the forward.

The engine section (`--engine-steps N`, 0 skips it) trains a small CAPE ViT on random 32 x 32
images through the real data path (ArrayImageDataset, ResumableSampler, DataLoader), logging
every step and checkpointing twice, and splits the loop's time into data, compute, logging and
checkpoints: everything but compute is engine overhead, whose target is < 5% of the loop.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cape.build import build
from cape.lab.arguments import ArgumentParser
from cape.lab.timing import time_interleaved
from cape.models import TransformerEncoder

__all__ = ["matmul_peak", "step_flops", "engine_overhead", "main"]

ENGINE_TARGET = 0.05  # engine overhead: at most this fraction of the training loop's time
_CLASSES, _SIZE = 36, 32


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
    model = TransformerEncoder(
        args.layers, args.dim, args.heads, ffn, dropout=0.0, position=build(args.position, args.dim)
    )
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


def engine_overhead(steps: int, batch: int, seed: int = 0) -> dict[str, float]:
    """`Trainer.fit`'s summary for `steps` steps of a ViT (dim 128, depth 4, CAPE) on random
    uint8 images [8 * batch, 32, 32, 3] with 36 random labels, on the CPU in fp32."""
    from cape.lab.data import ArrayImageDataset
    from cape.lab.train import TrainConfig, Trainer, seed_everything
    from cape.models import ViT

    rng = np.random.default_rng(seed)
    n = 8 * batch
    images = rng.integers(0, 256, size=(n, _SIZE, _SIZE, 3), dtype=np.uint8)
    data = ArrayImageDataset(images, rng.integers(0, _CLASSES, size=n), normalize=True)
    seed_everything(seed)
    model = ViT(
        _CLASSES,
        image_size=_SIZE,
        patch=4,
        dim=128,
        depth=4,
        heads=4,
        mlp_ratio=2,
        position="cape2d",
    )

    def loss_fn(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]):
        x, y = b  # x [B, 3, 32, 32] float, y [B] int64
        logits = m(x)  # [B, 36]
        return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).float().mean()}

    cfg = TrainConfig(
        steps=steps,
        batch_size=batch,
        log_every=1,
        eval_every=0,
        checkpoint_every=max(1, steps // 2),
        seed=seed,
        device="cpu",
    )
    with tempfile.TemporaryDirectory(prefix="cape-bench-") as run_dir:
        return Trainer(model, loss_fn, data, None, cfg, run_dir).fit()


def _print_engine(steps: int, batch: int) -> None:
    print(
        f"\nengine: cape.lab.train.Trainer, {steps} steps of ViT(d128, depth 4, heads 4, cape2d) "
        f"on random {_SIZE}x{_SIZE} images, batch {batch}, CPU fp32; log every step, "
        f"checkpoint every {max(1, steps // 2)}"
    )
    out = engine_overhead(steps, batch)
    cats = ("data", "compute", "log", "checkpoint")
    loop = sum(out[f"time_{c}"] for c in cats)
    print("| category | seconds | share of loop | target |")
    print("|---|---|---|---|")
    for c in cats:
        t = out[f"time_{c}"]
        print(f"| {c} | {t:.3f} | {t / loop if loop else 0.0:.4f} | |")
    over = out["engine_overhead"]
    verdict = "ok" if over < ENGINE_TARGET else "over target"
    print(
        f"| engine overhead (data + log + checkpoint) | {loop - out['time_compute']:.3f} | "
        f"{over:.4f} | < {ENGINE_TARGET:.2f}: {verdict} |"
    )
    print(
        f"ViT step: {steps * batch / out['time_compute']:,.0f} images/s (compute), "
        f"{steps * batch / loop:,.0f} images/s (whole loop)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="cape bench train", description=__doc__)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--position", default="cape1d", help="an encoding name of cape.build")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument(
        "--peak-size",
        type=int,
        default=2048,
        help="n of the n x n x n matmul that measures the peak (bf16 without CPU "
        "support for it is slow: use a small n there)",
    )
    p.add_argument(
        "--engine-steps",
        type=int,
        default=30,
        help="Trainer steps of the engine-overhead section (0 skips it)",
    )
    p.add_argument("--engine-batch", type=int, default=128, help="its batch size (images)")
    args = p.parse_args(argv)
    if args.engine_steps < 0 or args.engine_batch < 1:
        p.error("--engine-steps must be >= 0 and --engine-batch >= 1")
    p.at_least(("--peak-size", args.peak_size, 1))
    ffn = 4 * args.dim
    flops = step_flops(args.layers, args.dim, ffn, args.batch, args.length)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; encoder {args.layers} x "
        f"d{args.dim} ffn{ffn}, B{args.batch} T{args.length}, position {args.position}"
    )
    print(
        "| precision | step ms (IQR) | tokens/s | achieved GFLOP/s "
        "| matmul peak GFLOP/s | fraction |"
    )
    print("|---|---|---|---|---|---|")
    for name, dtype in (("fp32", torch.float32), ("bf16 autocast", torch.bfloat16)):
        timing = _time_step(args, ffn, dtype)
        peak = matmul_peak(dtype, n=args.peak_size)
        achieved = flops / (timing.median_ms / 1e3)
        tokens = args.batch * args.length / (timing.median_ms / 1e3)
        print(
            f"| {name} | {timing.median_ms:.1f} ({timing.iqr_ms:.1f}) | {tokens:,.0f} | "
            f"{achieved / 1e9:.1f} | {peak / 1e9:.1f} | {achieved / peak:.0%} |",
            flush=True,
        )
    if args.engine_steps:
        _print_engine(args.engine_steps, args.engine_batch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
