"""Why the eager path cannot reach the fused one: eager `torch.sin` alone against a table add.

CAPE's eager training path makes phases (one fused multiply-add), takes one in-place sine over
[B, T, D] and adds the content; the table add it is compared with reads two tensors and writes
one, then the backward passes the gradient through. This times, round-robin in one process with
the allocator warm (`cape bench`'s default state), fwd+bwd of `x + table` against the sine alone
(`torch.sin(phase, out=buf)`, no add, no backward) and the sine plus the add, on the shapes of
`cape bench encodings`. If the sine alone is already near or above the target ratio, no eager
arrangement of these ops meets it on this machine.

    PYTHONPATH=src .venv/bin/python scripts/eager_floor.py
"""

import torch

from cape.lab.bench.allocator import set_allocator
from cape.lab.bench.timing import time_interleaved


def measure(shape: tuple[int, ...]) -> str:
    torch.manual_seed(0)
    x = torch.randn(shape, requires_grad=True)
    table = torch.randn(shape[1:])
    grad = torch.ones(shape)
    phase = torch.rand(shape) * 1000
    buf = torch.empty(shape)

    def table_add() -> None:
        (x + table).backward(grad)

    def sine() -> None:
        torch.sin(phase, out=buf)

    def sine_add() -> None:
        torch.sin(phase, out=buf).add_(x.detach())

    base, s, sa = time_interleaved([table_add, sine, sine_add], runs=31)
    return (
        f"{'x'.join(map(str, shape))}: table add fwd+bwd {base.median_ms:.2f} ms; "
        f"eager sin alone {s.median_ms:.2f} ms ({s.median_ms / base.median_ms:.2f}x); "
        f"sin + add {sa.median_ms:.2f} ms ({sa.median_ms / base.median_ms:.2f}x)"
    )


set_allocator("warm")
for size in ((32, 1000, 512), (32, 100, 512), (64, 14, 14, 768)):
    print(measure(size))
