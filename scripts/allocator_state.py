"""Fwd+bwd of a table add and of CAPE2d on a [64, 14, 14, 768] input in training mode, medians of
15 calls, in a fresh process per allocator state (warm cannot be undone within a process): the
figures of the cost page's paragraph on the allocator.

    PYTHONPATH=src .venv/bin/python scripts/allocator_state.py     # cold, warm, cold, warm
"""

import statistics
import subprocess
import sys
import time

import torch


def measure(state: str) -> str:
    import cape
    from cape.lab.bench.allocator import set_allocator

    said = set_allocator(state)
    torch.manual_seed(0)
    x = torch.randn(64, 14, 14, 768, requires_grad=True)
    table = torch.randn(1, 14, 14, 768)
    enc = cape.CAPE2d.preset(768).train()

    def median_ms(step) -> float:
        for _ in range(3):  # warm-up
            step()
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    add = median_ms(lambda: (x + table).sum().backward())
    cape2d = median_ms(lambda: enc.add_to(x).sum().backward())
    return f"{said}: table add {add:.1f} ms, CAPE2d {cape2d:.1f} ms, ratio {cape2d / add:.2f}"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(measure(sys.argv[1]))
    else:
        for state in ("cold", "warm", "cold", "warm"):
            subprocess.run([sys.executable, __file__, state], check=True)
