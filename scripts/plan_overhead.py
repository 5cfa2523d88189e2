"""Per-call cost of the stacks before and after the position plan (issue 38), in one process.

The library of an earlier commit (its `src/cape` without the lab: the library imports itself
relatively, so it loads under another package name) is timed round-robin against the current
one: the same model sizes, seeds and inputs, forward + backward in train mode, fp32, dropout 0,
as `cape bench slowdown` times them. Since both run in one process with the allocator in one
state, their ratio is what changed.

    git worktree add /tmp/before <commit>
    export MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=1000000000
    OMP_NUM_THREADS=1 .venv/bin/python scripts/plan_overhead.py /tmp/before/src/cape \\
        --out results/bench/plan-overhead
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from cape.lab.bench.results import machine, write_results
from cape.lab.bench.slowdown import ROWS, row_position
from cape.lab.timing import time_interleaved

LABELS = ("nopos", "sinpos", "rotary", "alibi", "relpos-100")
MODELS = {"layer": 1, "encoder": 6}


def load_before(src: Path) -> object:
    """The library at `src` (a `cape` package folder) imported as `cape_before`."""
    tmp = Path(tempfile.mkdtemp()) / "cape_before"
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("lab", "__pycache__"))
    sys.path.insert(0, str(tmp.parent))
    return importlib.import_module("cape_before")


def stack(lib: object, label: str, layers: int, dim: int, heads: int, length: int):
    """A `layers`-deep encoder of `lib` with the label's encoding: the earlier library takes the
    absolute module or a per-layer factory; the current one its name (the position plan)."""
    name, options = row_position(label, "encoder", length)
    models = importlib.import_module(f"{lib.__name__}.models")
    kw: dict = {"dropout": 0.0, "final_norm": layers > 1}
    if lib.__name__ == "cape":
        kw.update(position=name, position_options=options)
        return models.TransformerEncoder(layers, dim, heads, 4 * dim, **kw).train()
    kind = lib.encoding_class(name).kind
    size = heads if getattr(lib.encoding_class(name), "per_head", False) else dim // heads
    if kind == "absolute":
        kw["position"] = lib.build(name, dim, **options)
    elif kind == "attention":
        kw["relative_factory"] = lambda: lib.build(name, size, **options)
    return models.TransformerEncoder(layers, dim, heads, 4 * dim, **kw).train()


def update(model: torch.nn.Module, x: torch.Tensor):
    def fn() -> None:
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()

    return fn


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path, help="the earlier commit's src/cape folder")
    p.add_argument("--out", default=None, help="folder for overhead.md/.csv")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--lengths", default="10,100")
    args = p.parse_args()
    import cape

    before = load_before(args.before)
    dim, heads, batch = 256, 8, 8
    rows = []
    for model_name, layers in MODELS.items():
        for length in (int(t) for t in args.lengths.split(",")):
            torch.manual_seed(0)
            x = torch.randn(batch, length, dim)
            fns = []
            for label in LABELS:
                for lib in (before, cape):
                    torch.manual_seed(0)
                    fns.append(update(stack(lib, label, layers, dim, heads, length), x))
            times = time_interleaved(fns, runs=args.runs, warmup=5)
            for i, label in enumerate(LABELS):
                old, new = times[2 * i], times[2 * i + 1]
                rows.append(
                    {
                        "model": model_name,
                        "tokens": length,
                        "encoding": label,
                        "before_ms": old.median_ms,
                        "before_iqr": old.iqr_ms,
                        "after_ms": new.median_ms,
                        "after_iqr": new.iqr_ms,
                        "after / before": new.median_ms / old.median_ms,
                    }
                )
            print(f"{model_name} T={length} done", flush=True)
    allocator = "warm" if os.environ.get("MALLOC_MMAP_THRESHOLD_") else "glibc default"
    meta = {
        **machine(),
        "before": str(args.before),
        "dtype": "fp32",
        "batch": batch,
        "dim": dim,
        "heads": heads,
        "runs": args.runs,
        "allocator": allocator,
        "threads": torch.get_num_threads(),
    }
    notes = (
        "Forward + backward of one pre-norm encoder layer and of a 6-layer encoder, train mode, "
        "dropout 0, timed round-robin in one process (before and after interleaved); medians "
        "and inter-quartile ranges in ms. Labels as `cape bench slowdown` "
        f"({', '.join(f'{k} = {ROWS[k].position}' for k in LABELS)})."
    )
    write_results(
        args.out,
        "overhead",
        rows,
        title="Per-call cost of the stacks before and after the position plan",
        columns=[
            "model",
            "tokens",
            "encoding",
            "before_ms",
            "after_ms",
            "after / before",
            "before_iqr",
            "after_iqr",
        ],  # fmt: skip
        meta=meta,
        notes=notes,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
