"""The benchmarks' timing helpers, kept at this path for the benchmark modules: they live in
`cape.lab.timing`, which the experiments use too (an experiment must not import a benchmark)."""

from cape.lab.timing import Timing, time_interleaved

__all__ = ["Timing", "time_interleaved"]
