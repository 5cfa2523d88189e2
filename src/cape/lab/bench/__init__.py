"""Benchmarks of the cost of positional encodings (`cape bench ...`) and their shared tools.

One module per benchmark (`encodings`, `slowdown`, `throughput`, `train`); every one times with
`time_interleaved` (`cape.lab.timing`, shared with the experiments; round-robin, so ratios
within one run are comparable on a noisy machine), measures memory with `saved_bytes` /
`cuda_peak_bytes` and writes its tables with `write_results` (markdown + CSV, the machine named
by `machine`).
"""

from cape.lab.bench.memory import cuda_peak_bytes, saved_bytes
from cape.lab.bench.results import machine, write_results
from cape.lab.timing import Timing, time_interleaved

__all__ = [
    "Timing",
    "time_interleaved",
    "saved_bytes",
    "cuda_peak_bytes",
    "machine",
    "write_results",
]
