"""Why the eager path cannot reach the fused one: eager `torch.sin` alone against a table add.

CAPE's eager training path makes phases (one fused multiply-add), takes one in-place sine over
[B, T, D] and adds the content; the table add it is compared with reads two tensors and writes
one, then the backward passes the gradient through. This times, round-robin in one process with
the allocator warm (`cape bench`'s default state), fwd+bwd of `x + table` against the sine alone
(`torch.sin(phase, out=buf)`, no add, no backward), the sine plus the add, and the eager path's
kernels alone with nothing else: phases from given positions (one multiply-add per axis), the
in-place sine, the add of x and the backward, with no positions made, no draws, no checks. On the
shapes of `cape bench encodings`. If those kernels alone are above the target ratio, no eager
arrangement of them meets it on this machine.

    PYTHONPATH=src .venv/bin/python scripts/eager_floor.py
"""

import torch

from cape.lab.bench.allocator import set_allocator
from cape.lab.timing import time_interleaved


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

    axes = 2 if len(shape) == 4 else 1  # (x, y) on the grid
    pos = torch.rand(*shape[:-1], axes) * 10
    freqs, offset = torch.rand(axes, shape[-1]), torch.rand(shape[-1])

    def kernels() -> None:  # eager CAPE's own work, positions given
        out = torch.addcmul(offset, pos[..., 0:1], freqs[0])
        for m in range(1, axes):
            out.addcmul_(pos[..., m : m + 1], freqs[m])
        out.sin_().add_(x).backward(grad)

    base, s, sa, k = time_interleaved([table_add, sine, sine_add, kernels], runs=31)
    return (
        f"{'x'.join(map(str, shape))}: table add fwd+bwd {base.median_ms:.2f} ms; "
        f"eager sin alone {s.median_ms:.2f} ms ({s.median_ms / base.median_ms:.2f}x); "
        f"sin + add {sa.median_ms:.2f} ms ({sa.median_ms / base.median_ms:.2f}x); "
        f"eager kernels alone, fwd+bwd {k.median_ms:.2f} ms ({k.median_ms / base.median_ms:.2f}x)"
    )


set_allocator("warm")
for size in ((32, 1000, 512), (32, 100, 512), (64, 14, 14, 768)):
    print(measure(size))
