"""The length experiment: trained on short sequences, tested on 2x, 4x, 8x longer ones.

A bidirectional Transformer encoder reads uniform random tokens (`cape.lab.data.text.lookup`) and
predicts at every position the token `data.offset` places back: the answer is a relative
position, so a model without positions stays near chance. Each row is one `cape.build` encoding
(absolute ones added to the token embeddings, the others inside every layer's attention), trained
on lengths [min_len, max_len] and evaluated at every `eval.lengths`; a row with `eval_options`
is evaluated with them (RoPE's PI, NTK, YaRN chosen at inference) and a row with `train_as`
evaluates another row's weights.

`LENGTH.run(cfg, mapping, out)`: for every row and seed, train (resumable), evaluate
(`eval_records`, cached in the run folder's `eval.json`), then write `results.json`,
`report.md` and the plot. Layout of `out`: `config.yaml`, `<row>/seed<k>/` (engine run folder:
metrics, checkpoints, eval.json; a `train_as` row's holds eval.json and settings.json only),
`results.json`, `report.md`, `accuracy_vs_length.png`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from cape.lab.data.text.lookup import LookupDataset, Splits
from cape.lab.experiments.base import Collected, Experiment, Run, Study
from cape.lab.experiments.length import data, evaluate, model, report
from cape.lab.experiments.length.config import PRESET_NOTES, PRESETS, LengthConfig, RowConfig

__all__ = ["LengthExperiment", "LENGTH"]


class LengthExperiment(Experiment[LengthConfig, Splits], evaluate=evaluate, report=report):
    """Rows of `LengthConfig` on the lookup task; results add the no-position baselines."""

    name, config_cls, presets = "length", LengthConfig, PRESETS
    preset_notes = PRESET_NOTES
    counts_parameters = True
    make_data = staticmethod(data.make_data)

    def fit(
        self, run: Run[LengthConfig], data: Splits, net: nn.Module
    ) -> tuple[nn.Module, dict[str, Any]]:
        cfg, train_set = run.cfg, LookupDataset(data.train)

        def eval_fn(m: nn.Module) -> dict[str, float]:
            device = next(m.parameters()).device
            return {"acc": evaluate.accuracy(m, data.val, cfg.eval.batch_size, device)[0]}

        trainer = self.trainer(run, net, model.token_loss, train_set, eval_fn, train_set.collate)
        return self.fitted(trainer)

    def make_model(
        self, cfg: LengthConfig, row: RowConfig, data: Any = None, *, evaluation: bool = False
    ) -> model.LookupModel:
        return model.make_model(cfg, row, evaluation=evaluation)

    def removed_metric(self, study: Study, row: Any, seed: int, model: nn.Module) -> float:
        """Accuracy (%) at the first test length (the longest training length)."""
        cfg = study.cfg
        test = study.data.test[cfg.eval.lengths[0]]
        return evaluate.accuracy(model, test, cfg.eval.batch_size, study.dist.device)[0]

    def results(self, study: Study, got: Collected) -> dict[str, Any]:
        return {
            **super().results(study, got),
            "baselines": evaluate.baselines(study.cfg, study.data),
        }


LENGTH = LengthExperiment()
