"""The one writer of benchmark results: a markdown table and a CSV per benchmark, machine named.

Every benchmark produces flat rows (one dict per measurement, e.g. `{"model": "encoder",
"length": 100, "dtype": "fp32", "encoding": "cape1d", "median_ms": 3.1, "iqr_ms": 0.2,
"ratio": 1.01}`). `write_results` prints the markdown table, and writes `<name>.md` (the machine
header, then the table) and `<name>.csv` (the rows, each with the machine fields appended)
atomically into `out_dir`, so that results kept in the repository always say where they came
from.
"""

from __future__ import annotations

import csv
import io
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from cape.lab.bench.allocator import allocator_state
from cape.lab.report import write_text

__all__ = ["machine", "markdown_table", "write_results"]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str | torch.device = "cpu") -> dict[str, str]:
    """Where a benchmark ran: device name, CPU, cores, torch threads, torch and Python versions."""
    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {
        "allocator": allocator_state(),
        "device": name,
        "cpu": _cpu_name(),
        "cores": str(os.cpu_count() or 0),
        "threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def _cell(value: Any, digits: int) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value).replace("|", "\\|")


def markdown_table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], digits: int = 2
) -> str:
    """GitHub markdown table of `rows` restricted to `columns` (floats with `digits` decimals)."""
    if not columns:
        raise ValueError("columns must name at least one column")
    missing = sorted({c for r in rows for c in columns if c not in r})
    if missing:
        raise ValueError(f"every row must have the columns {list(columns)}; missing {missing}")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r[c], digits) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_results(
    out_dir: str | Path | None,
    name: str,
    rows: Sequence[Mapping[str, Any]],
    *,
    title: str,
    columns: Sequence[str] | None = None,
    meta: Mapping[str, Any] | None = None,
    notes: str = "",
    digits: int = 2,
) -> str:
    """Print and (with `out_dir`) write `<name>.md` and `<name>.csv`; returns the markdown.

    columns: the table's columns, in order (default: every key of the rows, in first-seen
    order; the CSV keeps every key of the rows whatever the table shows). meta: what
    the whole run shares (machine, dtype, sizes, repetitions); it heads the markdown and is
    appended to every CSV row. notes: a paragraph under the table.
    """
    if not rows:
        raise ValueError(f"rows of benchmark {name!r} must not be empty")
    meta = dict(meta or {})
    keys = list(dict.fromkeys(k for r in rows for k in r))
    header = "\n".join(f"- {k}: {v}" for k, v in meta.items())
    table = markdown_table(rows, keys if columns is None else columns, digits)
    text = f"# {title}\n\n{header}\n\n{table}\n"
    if notes:
        text += f"\n{notes}\n"
    print(text, flush=True)
    if out_dir is not None:
        buf = io.StringIO()
        fields = keys + [k for k in meta if k not in keys]
        writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n", restval="")
        writer.writeheader()
        for r in rows:
            writer.writerow({**meta, **r})
        write_text(Path(out_dir) / f"{name}.md", text)
        write_text(Path(out_dir) / f"{name}.csv", buf.getvalue())
    return text
