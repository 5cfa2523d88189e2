"""Configuration of the language-model experiment (trained at context L, evaluated at 1x-16x L)
and its presets.

A `cape.models.CausalLM` learns next-token prediction on real text (`cape.lab.data.text_corpus`)
with windows of L = `data.context` tokens, then is evaluated on non-overlapping windows of
`eval.factors` x L tokens (the ALiBi paper's protocol). Every row is a `cape.build` name with its
options; `eval_options` change the encoding at evaluation only (RoPE's PI, NTK, YaRN chosen at
inference), `train_as` makes a row evaluate another row's trained weights, and `finetune_from`
makes a row start from another row's final weights and train `finetune.steps` more steps at
`finetune.factor` x L (the PI and YaRN papers' recipe, scaled down), or at its own
`finetune_factor` x L (PoSE's: the window stays L while the positions reach the target).
A row's `notes` state its paper's recipe for the report; they change nothing it trains.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cape._checks import check_float, check_int
from cape.lab.data.text_corpus import TOKENIZERS
from cape.lab.data.text_corpus.build import MAX_BPE_VOCAB
from cape.lab.experiments.recipes import length_recipe
from cape.lab.experiments.study_config import (
    StudyConfig,
    check_best_metric,
    check_ints,
    check_transformer,
)
from cape.lab.experiments.train_as import ReusableRow, check_train_as, trained_row

__all__ = [
    "DataConfig",
    "ModelConfig",
    "FinetuneConfig",
    "EvalConfig",
    "RowConfig",
    "LMConfig",
    "position_options",
    "derived_options",
    "finetune_window",
]


@dataclass
class DataConfig:
    """The corpus (`build_text_corpus`: a name such as "kjv" or a folder of .txt files, built
    once under `root`) and its `tokenizer` ("bytes", or "bpe" of `vocab` pieces); `context`: L,
    the training window in tokens; `train_windows`: how many training windows are drawn (uniform
    starts in the train split, from `seed`; the engine shuffles them); `val_tokens`: the first
    tokens of the validation split scored at L during training (the checkpoint's metric)."""

    corpus: str = "kjv"
    tokenizer: str = "bytes"
    vocab: int | None = None
    root: str = "data/text"
    context: int = 128
    train_windows: int = 100000
    val_tokens: int = 32768
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("corpus", "root"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"data.{key} must be a non-empty string, got {value!r}")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(
                f"data.tokenizer must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}"
            )
        if self.vocab is not None:
            check_int("data.vocab", self.vocab, minimum=2)
            if self.vocab > MAX_BPE_VOCAB:
                raise ValueError(f"data.vocab must be at most {MAX_BPE_VOCAB}, got {self.vocab}")
        check_int("data.context", self.context, minimum=2)
        check_int("data.train_windows", self.train_windows)
        check_int("data.val_tokens", self.val_tokens, minimum=2)
        check_int("data.seed", self.seed, minimum=0)


@dataclass
class ModelConfig:
    """The `cape.models.CausalLM`'s sizes (tied input and output embeddings)."""

    dim: int = 128
    heads: int = 4
    layers: int = 2
    ffn_dim: int = 512
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_transformer(self, ("dim", "heads", "layers", "ffn_dim"), ("dropout",))


@dataclass
class FinetuneConfig:
    """The fine-tune of the `finetune_from` rows: `steps` steps of `batch_size` windows of
    `factor` x L tokens at learning rate `lr` (`warmup_steps` of warm-up, then cosine)."""

    factor: int = 4
    steps: int = 50
    batch_size: int = 8
    lr: float = 3e-4
    warmup_steps: int = 5

    def __post_init__(self) -> None:
        check_int("finetune.factor", self.factor, minimum=2)
        check_ints("finetune", self, ("steps", "batch_size"))
        if check_float("finetune.lr", self.lr) <= 0:
            raise ValueError(f"finetune.lr must be > 0, got {self.lr}")
        check_int("finetune.warmup_steps", self.warmup_steps, minimum=0)


@dataclass
class EvalConfig:
    """factors: the evaluation lengths as multiples of L (increasing, the first 1: the verdict's
    reference); split: "test" or "val"; max_tokens: how many tokens of the split are scored (its
    first ones; 0 = all of it), the same at every length; batch_tokens: tokens per evaluation
    batch (windows per batch = max(1, batch_tokens // length)); buckets: at most how many
    position buckets (log-spaced: `evaluate.position_buckets`) the loss by position over the
    full windows of the longest length averages over.
    Here, not in `data`, so that changing them evaluates the trained runs again (no retraining)."""

    factors: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    split: str = "test"
    max_tokens: int = 0
    batch_tokens: int = 8192
    buckets: int = 32

    def __post_init__(self) -> None:
        if not self.factors:
            raise ValueError("eval.factors must list at least one factor")
        for i, f in enumerate(self.factors):
            check_int(f"eval.factors[{i}]", f)
        if list(self.factors) != sorted(set(self.factors)) or self.factors[0] != 1:
            raise ValueError(f"eval.factors must be strictly increasing from 1, got {self.factors}")
        if self.split not in ("val", "test"):
            raise ValueError(f"eval.split must be 'val' or 'test', got {self.split!r}")
        check_int("eval.max_tokens", self.max_tokens, minimum=0)
        check_ints("eval", self, ("batch_tokens", "buckets"))


@dataclass
class RowConfig(ReusableRow):
    """One row: `position` (a 1-D `cape.build` name) with `options`; `eval_options` replace or
    add options at evaluation only; `train_as`: an earlier row whose trained weights this row
    evaluates (no training); `finetune_from`: an earlier row whose final weights this row starts
    from, trained `finetune.steps` more at `finetune.factor` x L with its own options
    (`finetune_factor`: at that many times L instead, e.g. 1 for PoSE). Options with a RoPE
    `scaling` get `train_length` L by default, a fine-tuned row `factor` `finetune.factor`,
    FIRE its `threshold` at L / 4 and xPos its scale base at L / 2 (`derived_options`).
    `notes`: the row's recipe in words (its paper, what is set from it), for the report."""

    finetune_from: str | None = None
    finetune_factor: int | None = None
    notes: str | None = None

    def __post_init__(self) -> None:
        key = self.check_fields()
        if self.finetune_from is not None and not isinstance(self.finetune_from, str):
            raise ValueError(f"{key}.finetune_from must be a row name or null")
        if self.finetune_from is not None and self.train_as is not None:
            raise ValueError(f"{key}: give train_as or finetune_from, not both")
        if self.finetune_factor is not None:
            check_int(f"{key}.finetune_factor", self.finetune_factor)
            if self.finetune_from is None:
                raise ValueError(f"{key}.finetune_factor applies to a row with finetune_from")
        if self.notes is not None and not isinstance(self.notes, str):
            raise ValueError(f"{key}.notes must be a string or null, got {self.notes!r}")


def derived_options(
    position: str, options: dict, *, context: int, finetune_factor: float | None = None
) -> dict:
    """`options` with what the study sets from L = `context`: with a RoPE `scaling`,
    `train_length` L and, for a fine-tuned row, `factor` (`finetune_factor`); for FIRE, its
    `threshold` at L / 4; for xPos, `xpos_scale_base` at L / 2 (`length_recipe`). An option
    given keeps its value."""
    out = dict(options)
    if out.get("scaling") is not None:
        out.setdefault("train_length", context)
        if finetune_factor is not None:
            out.setdefault("factor", float(finetune_factor))
    return length_recipe(position, out, train_length=context)


def finetune_window(row: RowConfig, cfg: LMConfig) -> int:
    """How many times L the windows of a fine-tuned row are: its own `finetune_factor`, else
    `finetune.factor`."""
    return row.finetune_factor if row.finetune_factor is not None else cfg.finetune.factor


def position_options(row: RowConfig, cfg: LMConfig, *, evaluation: bool = False) -> dict:
    """The `position_options` of a row's `CausalLM`: its options (those of the row it is trained
    as, if any), at evaluation its `eval_options` over them, then `derived_options` (what the
    study sets from L)."""
    trained = trained_row(cfg.rows, row)
    options = dict(trained.options)
    if evaluation:
        options.update(row.eval_options)
    factor = cfg.finetune.factor if trained.finetune_from is not None else None
    return derived_options(
        trained.position, options, context=cfg.data.context, finetune_factor=factor
    )


@dataclass
class LMConfig(StudyConfig[DataConfig, ModelConfig, EvalConfig, RowConfig]):
    """The whole experiment: every row is trained once per seed (or reuses the weights of the
    row its `train_as` names, or fine-tunes those of its `finetune_from`) and evaluated at every
    length."""

    name: str = "lm"
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)

    @property
    def lengths(self) -> list[int]:
        """The evaluation lengths in tokens: every factor x L."""
        return [f * self.data.context for f in self.eval.factors]

    def __post_init__(self) -> None:
        super().__post_init__()
        check_best_metric(self.train, "loss", "min", "the validation loss at L")
        if self.eval.max_tokens and self.eval.max_tokens <= self.lengths[-1]:
            raise ValueError(
                f"eval.max_tokens must exceed the longest evaluation length {self.lengths[-1]} "
                f"(or be 0: the whole split), got {self.eval.max_tokens}"
            )
        check_train_as(self.rows)
        self._check_finetunes()
        for row in self.rows:
            self._check_encoding(row)

    def _check_finetunes(self) -> None:
        """Every `finetune_from` names an earlier row that trains its own weights from scratch,
        with the same `position`."""
        for i, row in enumerate(self.rows):
            if row.finetune_from is None:
                continue
            key = f"rows[{row.name}].finetune_from"
            earlier = {
                r.name: r for r in self.rows[:i] if r.train_as is None and r.finetune_from is None
            }
            source = earlier.get(row.finetune_from)
            if source is None:
                raise ValueError(
                    f"{key} must name an earlier row trained from scratch (one of "
                    f"{sorted(earlier)}), got {row.finetune_from!r}"
                )
            if source.position != row.position:
                raise ValueError(
                    f"{key}: the row's position {row.position!r} must be that of "
                    f"{source.name!r} ({source.position!r})"
                )

    def _check_encoding(self, row: RowConfig) -> None:
        """Build the row's model for training and for evaluation: bad options fail here."""
        from cape.models import CausalLM

        m = self.model
        for what, evaluation in (("options", False), ("eval_options", True)):
            try:
                CausalLM(
                    2, dim=m.dim, layers=1, heads=m.heads, ffn_dim=4, position=row.position,
                    position_options=position_options(row, self, evaluation=evaluation),
                )  # fmt: skip
            except (TypeError, ValueError) as e:
                raise ValueError(f"rows[{row.name}].{what}: {e}") from None
