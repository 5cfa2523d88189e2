"""The LFF boxes experiment: encodings of 4-D box positions on sparse spatial structures.

LFF paper sec. 4.4 (Tables 3-4) on data made here: a Transformer reads a screen of boxes
(`cape.lab.data.boxes`) as tokens [question, box_1, ..., box_N], each box token = widget-type
embedding + query-flag embedding + the row's encoding of its (top, left, bottom, right) in
[0, 1]; it classifies the answer (a widget type or "none") from the question token's output.
Each row is trained on screens with even coordinates and tested on new screens with even
(seen) and odd (unseen) coordinates.

`LFF_BOXES.run(cfg, mapping, out)`: for every row and seed, train (resumable), evaluate
(`eval_records`, cached in the run folder's `eval.json`), then write `results.json`,
`report.md` and the plot. Layout of `out`: `config.yaml`, `<row>/seed<k>/` (engine run folder:
metrics, checkpoints, eval.json), `results.json`, `report.md`, `seen_vs_unseen.png`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from cape.lab.data.boxes import BoxDataset, Screens
from cape.lab.experiments.base import Collected, Experiment, Run, Study
from cape.lab.experiments.lff_boxes import data, evaluate, model, report
from cape.lab.experiments.lff_boxes.config import PRESET_NOTES, PRESETS, LffBoxesConfig, RowConfig
from cape.lab.experiments.run_folders import summed_accuracy

__all__ = ["LffBoxesExperiment", "LFF_BOXES"]

Data = dict[str, Screens]


class LffBoxesExperiment(Experiment[LffBoxesConfig, Data], evaluate=evaluate, report=report):
    """Rows of `LffBoxesConfig` on screens of boxes; results add the baselines."""

    name, config_cls, presets = "lff-boxes", LffBoxesConfig, PRESETS
    preset_notes = PRESET_NOTES
    counts_parameters = True
    make_data = staticmethod(data.make_data)

    def make_model(
        self, cfg: LffBoxesConfig, row: RowConfig, data: Any = None, *, evaluation: bool = False
    ) -> model.BoxQA:
        return model.make_model(cfg, row)

    def fit(
        self, run: Run[LffBoxesConfig], data: Data, net: nn.Module
    ) -> tuple[nn.Module, dict[str, Any]]:
        train_set, val_set = BoxDataset(data["train"]), BoxDataset(data["val"])
        batch_size = run.cfg.eval.batch_size

        def eval_fn(m: nn.Module) -> dict[str, float]:
            right, shard = evaluate.answered(m, val_set, batch_size, next(m.parameters()).device)
            return {"acc": summed_accuracy(float(right.sum()), len(shard))}

        trainer = self.trainer(run, net, model.answer_loss, train_set, eval_fn, train_set.collate)
        return self.fitted(trainer)

    def removed_metric(self, study: Study, row: Any, seed: int, model: nn.Module) -> float:
        """Answer accuracy (%) on test_seen (coordinates of the training range)."""
        ds = BoxDataset(study.data["test_seen"])
        right, _ = evaluate.answered(model, ds, study.cfg.eval.batch_size, study.dist.device)
        return summed_accuracy(float(right.sum()), len(right))

    def results(self, study: Study, got: Collected) -> dict[str, Any]:
        return {**super().results(study, got), "baselines": evaluate.baselines(study.data)}


LFF_BOXES = LffBoxesExperiment()
