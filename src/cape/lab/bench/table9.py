"""Table 9 of the CAPE paper from `cape bench slowdown` measurements: the training slowdown of
each encoding against no positions, one row per (model, encoding), one column per cell."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["CAPE_TARGET", "PAPER_TABLE9", "table9_rows"]

CAPE_TARGET = 1.02  # the target this table checks: CAPE within 2% of nopos


def _cell_name(dtype: str, length: int) -> str:
    return f"{dtype} len-{length}"


def table9_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ratios in the paper's shape: one row per (model, encoding), one column per
    "<dtype> len-<T>" cell (first-seen order), "" where a cell was not measured; `target` says
    for cape1d whether every cell is within `CAPE_TARGET`. nopos (1 by definition) is left
    out unless it is the only encoding."""
    cells = list(dict.fromkeys(_cell_name(r["dtype"], r["length"]) for r in rows))
    only_nopos = all(r["encoding"] == "nopos" for r in rows)
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if r["encoding"] == "nopos" and not only_nopos:
            continue
        key = (r["model"], r["encoding"])
        out = grouped.setdefault(
            key, {"model": key[0], "encoding": key[1], **dict.fromkeys(cells, "")}
        )
        out[_cell_name(r["dtype"], r["length"])] = r["ratio"]
    for out in grouped.values():
        ratios = [out[c] for c in cells if out[c] != ""]
        missed = sum(v > CAPE_TARGET for v in ratios)
        out["target"] = (
            ""
            if out["encoding"] != "cape1d"
            else ("ok" if not missed else f"MISSED {missed}/{len(ratios)}")
        )
    return list(grouped.values())


PAPER_TABLE9 = (
    "Paper (Table 9, V100, fp16/fp32, relpos vs no relpos), context 1000 - layer: len 10 2.1/2.3, "
    "len 100 3.3/2.3, len 1000 2.2/1.7; encoder 2.2/2.2, 2.6/1.7, 2.0/1.6; decoder 1.8/1.7, "
    "1.9/1.4, 1.6/1.4. Context 100 - layer 2.1/2.1, 1.9/1.2, 1.4/1.2; encoder 2.3/2.4, 1.5/1.1, "
    "1.4/1.2; decoder 1.7/1.7, 1.2/1.1, 1.2/1.1."
)
