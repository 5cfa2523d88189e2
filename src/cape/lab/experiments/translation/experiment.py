"""The translation experiment: encoder-decoder models with each encoding, trained on sentences
of <= 20 words, tested on longer ones and on stacked sentences (CAPE sec. 5.3, appendix D).

`TRANSLATION.run(cfg, mapping, out)`: for every row and seed, train (resumable; the checkpoint
with the best validation BLEU is kept), evaluate (`eval_records`, cached in the run folder's
`eval.json`), then write `results.json`, `report.md` and the plots. Layout of `out`:
`config.yaml`, `<row>/seed<k>/` (engine run folder, `model.json` + `bpe.model` for
`cape translate`, eval.json), `results.json`, `report.md`, `*.png`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from cape.lab.apps.translate import load_translation_model
from cape.lab.experiments.base import Collected, Experiment, Run, Study, parameter_counts
from cape.lab.experiments.translation import evaluate, model, report
from cape.lab.experiments.translation.config import (
    PRESET_NOTES,
    PRESETS,
    RowConfig,
    TranslationConfig,
)
from cape.lab.experiments.translation.data import TranslationData, collate_fn
from cape.models.seq2seq import Seq2Seq

__all__ = ["TranslationExperiment", "TRANSLATION"]


class TranslationExperiment(
    Experiment[TranslationConfig, TranslationData], evaluate=evaluate, report=report
):
    """Rows of `TranslationConfig`; each run also keeps its NLL curve, length terciles and a
    few translations, and the results each row's parameter count and the data summary."""

    name, config_cls, presets = "translation", TranslationConfig, PRESETS
    preset_notes, default_preset = PRESET_NOTES, "small"
    best_weights = True

    def make_data(self, cfg: TranslationConfig) -> TranslationData:
        """The corpus the config names (translated and BPE-trained on first use), in memory."""
        return TranslationData(cfg.data, cfg.eval)

    def make_model(
        self, cfg: TranslationConfig, row: RowConfig, data: Any, *, evaluation: bool = False
    ) -> Seq2Seq:
        """The row's model for `data`'s vocabulary and length ratio (`load_run` gives a
        trained one its `eval_options`)."""
        tok = data.tokenizer
        return model.make_model(cfg, row, data.alpha, tok.vocab_size, tok.pad_id)

    def fit(
        self, run: Run[TranslationConfig], data: TranslationData, net: nn.Module
    ) -> tuple[nn.Module, dict[str, Any]]:
        """Train with the best validation BLEU kept; model.json and bpe.model first (what
        `cape translate` rebuilds the model from)."""
        cfg, tok = run.cfg, data.tokenizer
        self.save_spec(run, net, bpe=data.bpe_path, alpha=data.alpha)
        loss_fn = model.loss_fn(cfg.model.label_smoothing, tok.pad_id)
        batches = data.batches(run.seed, cfg.train.batch_size)
        val_fn = evaluate.val_fn(cfg, data)
        trainer = self.trainer(
            run, net, loss_fn, data.train, val_fn, collate_fn(tok), batches=batches
        )
        return self.fitted(trainer)

    def load_run(
        self, cfg: TranslationConfig, row: RowConfig, seed: int, out: str | Path, data: Any = None
    ) -> Seq2Seq:
        """The trained run's model with the best validation BLEU (else the latest), rebuilt from
        its model.json: the alpha it was trained with, whatever the data give at this call. The
        run is that of the row named by `train_as` if any; the model takes the row's
        `eval_options`."""
        trained = load_translation_model(self.weights_folder(cfg, row, seed, out))[0]
        return model.with_eval_options(row, trained)

    def for_evaluation(self, cfg: TranslationConfig, row: RowConfig, net: nn.Module) -> nn.Module:
        return model.with_eval_options(row, net)  # type: ignore[arg-type]

    def gather(self, study: Study, got: Collected, row: Any, seed: int, done: dict) -> None:
        """Records, summaries and parameters, and the run's curve, examples and terciles."""
        super().gather(study, got, row, seed, done)
        got.extra.setdefault("curves", {})[f"{row.name}/seed{seed}"] = done["curve"]
        got.extra.setdefault("examples", {}).setdefault(row.name, done["examples"])
        got.extra["terciles"] = done["terciles"]
        if row.name not in got.params:  # the same for every seed
            shape = self.make_model(study.cfg, self.trained_row(study.cfg, row), study.data)
            got.params[row.name] = parameter_counts(shape)["total"]

    def removed_metric(self, study: Study, row: Any, seed: int, model: nn.Module) -> float:
        """BLEU on the test split (sentences of the training lengths)."""
        e, test = study.cfg.eval, study.data.test("test")
        hyps = evaluate.decode(
            model, study.data, test, beam=e.beam, length_penalty=e.length_penalty,
            batch_size=e.batch_size,
        )  # fmt: skip
        return evaluate.bleu(hyps, [x.tgt for x in test])

    def results(self, study: Study, got: Collected) -> dict[str, Any]:
        extra = {"curves": {}, "examples": {}, "terciles": [], **got.extra}
        return {
            "records": got.records,
            **extra,
            "train_length": study.data.train_length(),
            "train": got.train,
            "params": got.params,
            "data": study.data.summary(),
        }


TRANSLATION = TranslationExperiment()
