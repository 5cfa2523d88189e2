"""The LFF image-generation study (Li et al. 2021, sec. 4.1, Figure 3) as `cape experiment
lff-generation`: autoregressive models of RGB character images, one position encoding per row,
held-out bits per dim vs training step.

`LFF_GENERATION.run(cfg, mapping, out)`: for every row and seed, train (resumable; the
Trainer's eval_fn logs held-out bpd every `train.eval_every` steps), measure the final bpd
(`eval_records`), cache both in the run folder's `eval.json`, then write `results.json`,
`report.md` and the plots. Layout of `out`: `config.yaml`, `<row>/seed<k>/` (engine run folder:
metrics.jsonl, checkpoints, eval.json), `results.json`, `report.md`, `*.png`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from torch import nn

from cape.lab.experiments.base import Collected, Experiment, Run, Study, rank_slice
from cape.lab.experiments.lff_generation import evaluate, report
from cape.lab.experiments.lff_generation.config import (
    PRESET_NOTES,
    PRESETS,
    GenerationConfig,
    RowConfig,
)
from cape.lab.experiments.lff_generation.data import GenerationData, make_data
from cape.lab.experiments.lff_generation.model import PixelTransformer, generation_loss

__all__ = ["GenerationExperiment", "LFF_GENERATION"]


class GenerationExperiment(
    Experiment[GenerationConfig, GenerationData], evaluate=evaluate, report=report
):
    """Rows of `GenerationConfig`; each run also keeps its held-out bpd curve."""

    name, config_cls, presets = "lff-generation", GenerationConfig, PRESETS
    preset_notes = PRESET_NOTES
    make_data = staticmethod(make_data)

    def make_model(
        self, cfg: GenerationConfig, row: RowConfig, data: Any = None, *, evaluation: bool = False
    ) -> PixelTransformer:
        s, sizes = cfg.data.size, dataclasses.asdict(cfg.model)  # the widths, depth, dropout
        return PixelTransformer(s, s, row.position, position_options=row.options, **sizes)

    def fit(
        self, run: Run[GenerationConfig], data: GenerationData, model: nn.Module
    ) -> tuple[nn.Module, dict[str, Any]]:
        val, batch_size = data.sequences("val"), run.cfg.eval.batch_size

        def eval_fn(m: nn.Module) -> dict[str, float]:
            shard = val[rank_slice()]  # the Trainer averages over ranks
            return {"bpd": evaluate.evaluate_bpd(m, shard, batch_size)}

        trainer = self.trainer(run, model, generation_loss, data.dataset("train"), eval_fn)
        return self.fitted(trainer)

    def evaluate(
        self, study: Study, row: RowConfig, seed: int, model: nn.Module, folder: Path
    ) -> dict[str, Any]:
        return {
            **super().evaluate(study, row, seed, model, folder),
            "curve": evaluate.read_curve(folder),
        }

    def removed_metric(self, study: Study, row: Any, seed: int, model: nn.Module) -> float:
        """Held-out bits per dim (the images are the training size)."""
        val = study.data.sequences("val")
        return evaluate.evaluate_bpd(model, val, study.cfg.eval.batch_size, study.dist.device)

    def gather(self, study: Study, got: Collected, row: Any, seed: int, done: dict) -> None:
        super().gather(study, got, row, seed, done)
        curves = got.extra.setdefault("curves", [])
        curves += [{"row": row.name, "seed": seed, **p} for p in done["curve"]]


LFF_GENERATION = GenerationExperiment()
