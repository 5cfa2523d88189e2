"""The language-model experiment: a causal LM trained at context L on real text, evaluated on
non-overlapping windows of 1x to 16x L.

A `cape.models.CausalLM` reads a text corpus (`cape.lab.data.text_corpus`: the King James Bible
by default, one byte a token) in windows of L = `data.context` tokens. Each row is one
`cape.build` encoding; a row with `eval_options` is evaluated with them (RoPE's PI, NTK, YaRN
chosen at inference), a `train_as` row evaluates another row's weights without training, and a
`finetune_from` row starts from another row's final weights and trains `finetune.steps` more at
`finetune.factor` x L (or its own `finetune_factor` x L).

`LM.run(cfg, mapping, out)`: for every row and seed, train (resumable), evaluate
(`eval_records`, cached in the run folder's `eval.json`), then write `results.json`,
`report.md` and the plots. Layout of `out`: `config.yaml`, `<row>/seed<k>/` (engine run folder:
metrics, checkpoints, eval.json, model.json (the `CausalLM` spec, the corpus and its tokenizer:
what `cape generate` rebuilds the model from) and, with the BPE tokenizer, bpe.model; a
`train_as` row's holds eval.json and settings.json only),
`results.json`, `report.md`, `perplexity_vs_length.png`, `loss_by_position.png`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from torch import nn

from cape.lab.experiments.base import Collected, Experiment, Run, Study
from cape.lab.experiments.lm import data, evaluate, model, report
from cape.lab.experiments.lm.config import LMConfig, RowConfig, finetune_window
from cape.lab.experiments.lm.data import LMData
from cape.lab.experiments.lm.presets import PRESET_NOTES, PRESETS
from cape.lab.train import seed_everything
from cape.lab.train.checkpoint import latest_checkpoint

__all__ = ["LMExperiment", "LM"]


class LMExperiment(Experiment[LMConfig, LMData], evaluate=evaluate, report=report):
    """Rows of `LMConfig` on a text corpus; results add the corpus statistics and the loss by
    position."""

    name, config_cls, presets = "lm", LMConfig, PRESETS
    preset_notes = PRESET_NOTES
    counts_parameters = True
    make_data = staticmethod(data.make_data)

    def make_model(
        self, cfg: LMConfig, row: RowConfig, data: LMData | None = None, *, evaluation: bool = False
    ) -> nn.Module:
        if data is None:
            raise ValueError("data must be given: the model's vocabulary is the corpus's")
        return model.make_model(cfg, row, data.corpus.vocab_size, evaluation=evaluation)

    def fit(self, run: Run[LMConfig], data: LMData, net: nn.Module) -> tuple[nn.Module, dict]:
        cfg, row = run.cfg, run.row
        # what `cape generate` reads: the corpus entry, its tokenizer (and its BPE model), L
        corpus, tokenizer = data.corpus, data.corpus.tokenizer.name
        bpe = corpus.root / "bpe.model" if tokenizer == "bpe" else None
        self.save_spec(
            run, net, bpe, corpus=str(corpus.root), tokenizer=tokenizer, context=cfg.data.context
        )
        length, train = cfg.data.context, None
        if row.finetune_from is not None:
            self._start_from(run, data, net)
            f = cfg.finetune
            length *= finetune_window(row, cfg)
            train = dataclasses.replace(
                cfg.train, steps=f.steps, batch_size=f.batch_size, lr=f.lr,
                warmup_steps=f.warmup_steps, eval_every=f.steps, checkpoint_every=f.steps,
            )  # fmt: skip
        windows = data.windows(length, cfg.data.train_windows, cfg.data.seed + run.seed)

        def eval_fn(m: nn.Module) -> dict[str, float]:
            device = next(m.parameters()).device
            got = evaluate.window_loss(m, data.val, length, cfg.eval.batch_tokens, device)
            return {"loss": got.loss}

        trainer = self.trainer(run, net, model.lm_loss, windows, eval_fn, train=train)
        return self.fitted(trainer)

    def _start_from(self, run: Run[LMConfig], data: LMData, net: nn.Module) -> None:
        """A fine-tune that has not started takes the final weights of its `finetune_from`
        row (trained first, or resumed, if need be); a started one resumes its own."""
        if latest_checkpoint(run.folder / "checkpoints") is not None:
            return
        source = run.cfg.row(run.row.finetune_from)
        trained, _ = self.train_run(run.cfg, source, run.seed, run.folder.parent.parent, data)
        net.load_state_dict(trained.state_dict(), strict=True)
        seed_everything(run.seed)

    def gather(self, study: Study, got: Collected, row: Any, seed: int, done: dict) -> None:
        super().gather(study, got, row, seed, done)
        got.extra.setdefault("by_position", []).extend(done["by_position"])

    def removed_metric(self, study: Study, row: Any, seed: int, model: nn.Module) -> float:
        """Perplexity at 1x L (windows of the training context)."""
        cfg, device = study.cfg, study.dist.device
        got = evaluate.window_loss(
            model, study.data.test, cfg.lengths[0], cfg.eval.batch_tokens, device
        )
        return math.exp(got.loss)

    def results(self, study: Study, got: Collected) -> dict[str, Any]:
        return {**super().results(study, got), "corpus": data.corpus_stats(study.data, study.cfg)}


LM = LMExperiment()
