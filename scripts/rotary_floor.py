"""Why rotary's fused path cannot reach 1.8x a table add: the least any rotation of q and k costs.

`cape bench encodings` compares rotary's fwd+bwd of (q, k) = enc(x, x) (x viewed as
[B, H, T, hd]) with one table add, `x + table`, whose backward only accumulates the gradient
into x. Any rotation of q and k must at least scale both by a [T, hd] table on the way
in and scale both gradients on the way back: `(x * c, x * c)` then backward, compiled into one
kernel each way like the fused rotary. This times, round-robin in one process with the allocator
warm (`cape bench`'s default state), the table add, that scale-only floor (compiled) and cape's
fused rotary (`cape.fusion(True)`), on the shapes of `cape bench encodings` (the 2-D rotary over
its 14 x 14 grid too). If the floor alone is above the target ratio, no rotation meets it on
this machine.

    PYTHONPATH=src .venv/bin/python scripts/rotary_floor.py
"""

import torch

from cape import fusion
from cape.build import build
from cape.lab.bench.allocator import set_allocator
from cape.lab.timing import time_interleaved
from cape.positions import grid_positions

HEAD_DIM = 64  # as `cape bench encodings`


@torch.compile(dynamic=False)
def scale_both(q: torch.Tensor, k: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return q * c, k * c


def backward(outs: list[torch.Tensor]) -> None:
    """As `cape bench encodings`: a gradient of ones (a full tensor) into every output."""
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


def measure(shape: tuple[int, int, int], grid: tuple[int, int] | None = None) -> str:
    """shape [B, T, D]; grid: the 2-D rotary over an H x W patch grid (T = H * W)."""
    b, t, d = shape
    torch.manual_seed(0)
    x = torch.randn(shape, requires_grad=True)
    table = torch.randn(shape[1:])
    c = torch.randn(t, HEAD_DIM)
    rotary = build("rotary", HEAD_DIM, pos_dim=2 if grid else 1).train()
    kw = {"positions": grid_positions(*grid, batch=b)} if grid else {}

    def heads() -> torch.Tensor:  # [B, H, T, hd], the view `cape bench encodings` rotates
        return x.view(b, t, d // HEAD_DIM, HEAD_DIM).transpose(1, 2)

    def table_add() -> None:
        backward([x + table])

    def floor() -> None:
        backward(list(scale_both(heads(), heads(), c)))

    def fused_rotary() -> None:
        with fusion(True):
            backward(list(rotary(heads(), heads(), **kw)))

    base, low, rot = time_interleaved([table_add, floor, fused_rotary], runs=31)
    ms = base.median_ms
    return (
        f"{'x'.join(map(str, shape))}: table add fwd+bwd {ms:.2f} ms; "
        f"scale-only floor (compiled) {low.median_ms:.2f} ms ({low.median_ms / ms:.2f}x); "
        f"fused rotary {rot.median_ms:.2f} ms ({rot.median_ms / ms:.2f}x)"
    )


set_allocator("warm")
for size in ((32, 1000, 512), (32, 100, 512)):
    print(measure(size))
print("2-D, 14 x 14 grid:", measure((64, 196, 768), grid=(14, 14)))
