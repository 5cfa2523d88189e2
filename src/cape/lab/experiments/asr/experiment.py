"""The speech experiment: CTC models with each encoding trained on <= 6 s, tested up to 45 s.

`ASR.run(cfg, mapping, out)`: for every row and seed, train (resumable; the checkpoint with the
best validation WER is kept), evaluate (`eval_records`, cached in the run folder's
`eval.json`), then write `results.json`, `report.md` and the plots. Layout of `out`:
`config.yaml`, `<row>/seed<k>/` (engine run folder: metrics, checkpoints, `model.json` for
`cape transcribe`, eval.json), `results.json`, `report.md`, `*.png`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from cape.lab.experiments.asr import evaluate, report
from cape.lab.experiments.asr.config import PRESET_NOTES, PRESETS, AsrConfig, RowConfig
from cape.lab.experiments.asr.data import AsrData, collate_fn
from cape.lab.experiments.asr.model import ctc_loss_fn, make_model
from cape.lab.experiments.base import Collected, Experiment, Run, Study, parameter_counts
from cape.lab.experiments.train_as import evaluation_model
from cape.models.asr import CTCModel

__all__ = ["AsrExperiment", "ASR"]


class AsrExperiment(Experiment[AsrConfig, AsrData], evaluate=evaluate, report=report):
    """Rows of `AsrConfig`; the results add each row's parameter count and the data summary."""

    name, config_cls, presets = "asr", AsrConfig, PRESETS
    preset_notes, default_preset = PRESET_NOTES, "digits-k3-small"
    best_weights = loads_for_evaluation = True
    make_data = staticmethod(AsrData)

    def fit(
        self, run: Run[AsrConfig], data: AsrData, model: nn.Module
    ) -> tuple[nn.Module, dict[str, Any]]:
        """Train with the best validation WER kept; model.json first (what `cape transcribe`
        rebuilds the model and its features from)."""
        cfg, row = run.cfg, run.row
        self.save_spec(run, model, features=evaluate.feature_spec(cfg.features))
        loss_fn, collate = ctc_loss_fn(cfg.features, row), collate_fn(cfg.features, row.batching)
        val_fn, batches = evaluate.val_fn(cfg, data), data.batches(run.seed)
        trainer = self.trainer(run, model, loss_fn, data.train, val_fn, collate, batches=batches)
        return self.fitted(trainer)

    def make_model(
        self, cfg: AsrConfig, row: RowConfig, data: Any = None, *, evaluation: bool = False
    ) -> CTCModel:
        return make_model(cfg, row, evaluation=evaluation)

    def for_evaluation(self, cfg: AsrConfig, row: RowConfig, model: nn.Module) -> nn.Module:
        return evaluation_model(row, model, lambda: make_model(cfg, row, evaluation=True))

    def removed_records(
        self, study: Study, row: RowConfig, seed: int, model: nn.Module
    ) -> list[dict[str, Any]]:
        """WER and CER per duration bin with the positions taken out (`evaluate`)."""
        return evaluate.removed_records(study.cfg, row, seed, model, study.data)

    def results(self, study: Study, got: Collected) -> dict[str, Any]:
        """Records, summaries, the data summary and each row's parameter count (of its
        untrained model: the count does not depend on the weights)."""
        ran = {key.rsplit("/seed", 1)[0] for key in got.train}
        rows = [r for r in study.cfg.rows if r.name in ran]
        return {
            "records": got.records,
            "train": got.train,
            "params": {r.name: parameter_counts(make_model(study.cfg, r))["total"] for r in rows},
            "data": study.data.summary(),
        }


ASR = AsrExperiment()
