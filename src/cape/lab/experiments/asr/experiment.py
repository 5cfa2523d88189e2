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
from cape.lab.io import write_json
from cape.models import has_positions
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

    def gather(self, study: Study, got: Collected, row: Any, seed: int, done: dict) -> None:
        """Records and summaries; an evaluation cached before the positions-removed measurement
        existed gets it added (and its eval.json rewritten) where its weights are kept, the rest
        kept as they are (an archived run: its report leaves that check out)."""
        cfg, out, device = study.cfg, study.out, study.dist.device
        shapes = got.extra.setdefault("shapes", {})  # untrained, one per row: has positions?
        if row.name not in shapes:
            shapes[row.name] = make_model(cfg, row)
        weights = self.weights_folder(cfg, row, seed, out) / "checkpoints"
        if (
            has_positions(shapes[row.name])
            and weights.is_dir()
            and not any(r["split"] == report.NO_POSITIONS for r in done["records"])
        ):
            model = self.load_run(cfg, row, seed, out).to(device)
            extra = evaluate.removed_records(cfg, row, seed, model, study.data)
            if extra:
                done["records"] += extra
                if study.dist.rank == 0:
                    write_json(self.run_dir(out, row, seed) / "eval.json", done)
        super().gather(study, got, row, seed, done)

    def results(self, study: Study, got: Collected) -> dict[str, Any]:
        shapes = got.extra.get("shapes", {})
        return {
            "records": got.records,
            "train": got.train,
            "params": {name: parameter_counts(m)["total"] for name, m in shapes.items()},
            "data": study.data.summary(),
        }


ASR = AsrExperiment()
