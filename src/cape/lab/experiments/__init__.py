"""Paper experiments: each is a config (with presets), a model, a data module, a report.

`EXPERIMENTS` maps a name to its `Experiment` entry; the `cape experiment/train/eval/plot`
commands go through it, so a new experiment is one more entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cape.lab.experiments.asr.config import PRESETS as ASR_PRESETS
from cape.lab.experiments.asr.config import AsrConfig
from cape.lab.experiments.length.config import PRESETS as LENGTH_PRESETS
from cape.lab.experiments.length.config import LengthConfig
from cape.lab.experiments.lff_boxes.config import PRESETS as LFF_BOXES_PRESETS
from cape.lab.experiments.lff_boxes.config import LffBoxesConfig
from cape.lab.experiments.lff_generation.config import PRESETS as LFF_GENERATION_PRESETS
from cape.lab.experiments.lff_generation.config import GenerationConfig
from cape.lab.experiments.template import merge, resolve_config, slug
from cape.lab.experiments.translation.config import PRESETS as TRANSLATION_PRESETS
from cape.lab.experiments.translation.config import TranslationConfig
from cape.lab.experiments.vision.config import PRESETS as VISION_PRESETS
from cape.lab.experiments.vision.config import VisionConfig

__all__ = ["Experiment", "EXPERIMENTS", "merge", "resolve_config", "slug"]


@dataclass(frozen=True)
class Experiment:
    """name, its config dataclass, presets (name -> mapping), and the module that implements it.

    The module provides: `run_experiment(cfg, mapping, out)`, `make_data(cfg)`,
    `train_run(cfg, row, seed, out, data) -> (model, summary)`, `load_run(cfg, row, seed, out,
    data)`, `eval_records(cfg, row, seed, model, data, device)`, `format_records(records) -> str`,
    `run_dir(out, row, seed)` and `redraw(folder)` (report and plots from results.json)."""

    name: str
    config_cls: type
    presets: dict[str, dict[str, Any]]
    default_preset: str
    module: str


EXPERIMENTS: dict[str, Experiment] = {
    "vision": Experiment(
        "vision", VisionConfig, VISION_PRESETS, "quick", "cape.lab.experiments.vision.run"
    ),
    "lff-generation": Experiment(
        "lff-generation",
        GenerationConfig,
        LFF_GENERATION_PRESETS,
        "quick",
        "cape.lab.experiments.lff_generation.run",
    ),
    "lff-boxes": Experiment(
        "lff-boxes",
        LffBoxesConfig,
        LFF_BOXES_PRESETS,
        "quick",
        "cape.lab.experiments.lff_boxes.run",
    ),
    "asr": Experiment("asr", AsrConfig, ASR_PRESETS, "quick", "cape.lab.experiments.asr.run"),
    "translation": Experiment(
        "translation",
        TranslationConfig,
        TRANSLATION_PRESETS,
        "quick",
        "cape.lab.experiments.translation.run",
    ),
    "length": Experiment(
        "length", LengthConfig, LENGTH_PRESETS, "quick", "cape.lab.experiments.length.run"
    ),
}
