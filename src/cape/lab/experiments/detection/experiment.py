"""The detection experiment: a small DETR with each 2-D encoding, tested at image sizes never
seen in training (LFF paper sec. 4.2, Tables 1-2).

`DETECTION.run(cfg, mapping, out)`: for every row and seed, train (resumable; each batch
resized to one of the training sizes), evaluate (COCO's AP of the test scenes at every size,
cached in the run folder's `eval.json`; AP at the largest training size again with the
positions taken out), then write `results.json`, `report.md` and the plots. Layout of `out`:
`config.yaml`, `<row>/seed<k>/` (engine run folder: metrics, checkpoints, eval.json),
`results.json`, `report.md`, `*.png`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from cape.lab.experiments.base import Collected, Experiment, Run, Study
from cape.lab.experiments.detection import evaluate, report
from cape.lab.experiments.detection.config import DetectionConfig, RowConfig
from cape.lab.experiments.detection.data import DetectionData, SceneSet, make_data
from cape.lab.experiments.detection.model import Detr, make_model
from cape.lab.experiments.detection.presets import DEFAULT, PRESET_NOTES, PRESETS

__all__ = ["DetectionExperiment", "DETECTION"]


class DetectionExperiment(
    Experiment[DetectionConfig, DetectionData], evaluate=evaluate, report=report
):
    """Rows of `DetectionConfig` on scenes of shapes; each run also keeps the boxes its model
    finds on a few test images (the first seed's are drawn in the report)."""

    name, config_cls, presets = "detection", DetectionConfig, PRESETS
    default_preset, preset_notes = DEFAULT, PRESET_NOTES
    counts_parameters = True

    make_data = staticmethod(make_data)  # the scenes of every split, rendered on first use

    def make_model(
        self, cfg: DetectionConfig, row: RowConfig, data: Any = None, *, evaluation: bool = False
    ) -> Detr:
        return make_model(cfg, row, DetectionData.classes)

    def fit(
        self, run: Run[DetectionConfig], data: DetectionData, net: nn.Module
    ) -> tuple[nn.Module, dict[str, Any]]:
        cfg = run.cfg
        train_set = SceneSet(data.train)

        def eval_fn(m: nn.Module) -> dict[str, float]:
            return evaluate.val_metrics(cfg, m, data)

        loss_fn = evaluate.detection_loss(train_set, cfg.data.train_sizes)
        trainer = self.trainer(run, net, loss_fn, train_set, eval_fn, train_set.collate)
        return self.fitted(trainer)

    def removed_metric(self, study: Study, row: Any, seed: int, model: nn.Module) -> float:
        """COCO's AP (%) of the test scenes at the largest training size."""
        cfg = study.cfg
        size = max(cfg.data.train_sizes)
        return evaluate.size_metrics(cfg, model, study.data.test, size, study.dist.device)["ap"]

    def evaluate(
        self, study: Study, row: Any, seed: int, model: nn.Module, folder: Path
    ) -> dict[str, Any]:
        """The records, and the boxes found on the first test images (`evaluate.examples`)."""
        cfg, device = study.cfg, study.dist.device
        records = evaluate.eval_records(cfg, row, seed, model, study.data, device)
        return {"records": records, "examples": evaluate.examples(cfg, model, study.data, device)}

    def gather(self, study: Study, got: Collected, row: Any, seed: int, done: dict) -> None:
        """Records and summaries, and the examples of each row's first seed."""
        super().gather(study, got, row, seed, done)
        if seed == study.cfg.seeds[0] and done.get("examples"):
            got.extra.setdefault("examples", {})[row.name] = done["examples"]


DETECTION = DetectionExperiment()
