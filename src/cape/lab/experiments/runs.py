"""What every experiment's `run_experiment` does around its own runs: open the folder and the
distributed context, gather what each (row, seed) left, and let rank 0 write the report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from cape.lab.experiments.template import cached_runs, save_config
from cape.lab.train import distributed as D

__all__ = ["begin", "collect", "finish", "parameter_counts"]


def begin(cfg: Any, mapping: dict[str, Any], out: str | Path) -> tuple[Path, Any]:
    """-> (the experiment folder, the distributed context of `cfg.train.device`); rank 0 saves
    the resolved config as `config.yaml` (what `--config` reads back)."""
    out = Path(out)
    dist = D.init_distributed(cfg.train.device)
    if dist.rank == 0:
        save_config(out / "config.yaml", mapping)
    return out, dist


def collect(
    cfg: Any,
    out: Path,
    compute: Callable[[Any, int, Path], dict[str, Any]],
    *,
    train: bool,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], dict[str, Any]]:
    """Every (row, seed) through `cached_runs` (`compute` returns {"records", "summary",
    "params"?}) -> (all records, summaries by "row/seed<k>", params by row)."""
    records: list[dict[str, Any]] = []
    summaries: dict[str, dict[str, Any]] = {}
    params: dict[str, Any] = {}
    for row, seed, done in cached_runs(cfg.rows, cfg.seeds, out, compute, cfg, train=train):
        records += done["records"]
        summaries[f"{row.name}/seed{seed}"] = done["summary"]
        if "params" in done:
            params[row.name] = done["params"]
    return records, summaries, params


def finish(dist: Any, write: Callable[[], object]) -> None:
    """Rank 0 writes (the report), then every rank waits for it."""
    if dist.rank == 0:
        write()
    D.barrier()


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """Trainable parameters of the whole model ("total") and of its position encodings, every
    layer's ("position": the modules whose `kind` is "absolute" or "attention")."""

    def count(m: nn.Module) -> int:
        return sum(p.numel() for p in m.parameters() if p.requires_grad)

    encodings = [
        m for m in model.modules() if getattr(m, "kind", None) in ("absolute", "attention")
    ]
    return {"total": count(model), "position": sum(count(m) for m in encodings)}
