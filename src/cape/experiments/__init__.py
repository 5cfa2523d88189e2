"""Paper experiments: each is a config (with presets), a model, a data module, a report.

`EXPERIMENTS` maps a name to its `Experiment` entry; the `cape experiment/train/eval/plot`
commands go through it, so a new experiment is one more entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .common import merge, resolve_config, slug
from .vision_config import PRESETS as VISION_PRESETS
from .vision_config import VisionConfig

__all__ = ["Experiment", "EXPERIMENTS", "merge", "resolve_config", "slug"]


@dataclass(frozen=True)
class Experiment:
    """name, its config dataclass, presets (name -> mapping), the module with `run_experiment`,
    `train_run`, `load_run`, `eval_records` and the report's `redraw`."""

    name: str
    config_cls: type
    presets: dict[str, dict[str, Any]]
    default_preset: str
    module: str


EXPERIMENTS: dict[str, Experiment] = {
    "vision": Experiment("vision", VisionConfig, VISION_PRESETS, "quick", "cape.experiments.vision"),
}
