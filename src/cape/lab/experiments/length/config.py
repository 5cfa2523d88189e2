"""Configuration of the length experiment (trained short, tested 2x-8x longer) and its presets.

The task (`cape.lab.data.text.lookup`): predict at every position the token `offset` places back,
in sequences of uniform random symbols; training lengths lie in [min_len, max_len] and the test
sets are longer. Every row is a `cape.build` name with its options; `eval_options` change the
encoding at evaluation only (RoPE's length extension chosen at inference), and `train_as` makes a
row evaluate another row's trained weights instead of training its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cape._checks import check_int, check_rate
from cape.build import build, encoding_class
from cape.lab.experiments.pairs import preset_augmentation
from cape.lab.experiments.recipes import length_recipe
from cape.lab.experiments.study_config import (
    StudyConfig,
    check_best_metric,
    check_ints,
    train_preset,
)
from cape.lab.experiments.train_as import ReusableRow, check_train_as, trained_row
from cape.models.plan import attention_size, resolve_options

__all__ = [
    "DataConfig",
    "ModelConfig",
    "RowConfig",
    "EvalConfig",
    "LengthConfig",
    "PRESETS",
    "PRESET_NOTES",
    "position_options",
    "encoding_size",
]


@dataclass
class DataConfig:
    """The sequences (`cape.lab.data.text.lookup.make_splits`): V content symbols (`vocab`), the
    target's `offset` k, training lengths uniform in [min_len, max_len], the sizes of the
    training and validation sets (validation at training lengths, fixed), the seed."""

    vocab: int = 16
    offset: int = 3
    min_len: int = 16
    max_len: int = 32
    train: int = 50000
    val: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("data.vocab", self.vocab, minimum=2)
        check_int("data.offset", self.offset)
        check_int("data.min_len", self.min_len, minimum=self.offset + 1)
        check_int("data.max_len", self.max_len, minimum=self.min_len)
        check_ints("data", self, ("train", "val"))
        check_int("data.seed", self.seed, minimum=0)


@dataclass
class ModelConfig:
    """The bidirectional `cape.models.TransformerEncoder` over token embeddings, then a linear
    head to the V symbols at every position."""

    dim: int = 64
    heads: int = 4
    layers: int = 2
    ffn_dim: int = 128
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_ints("model", self, ("dim", "heads", "layers", "ffn_dim"))
        if self.dim % self.heads:
            raise ValueError(
                f"model.dim must be divisible by model.heads, got {self.dim} and {self.heads}"
            )
        check_rate("model.dropout", self.dropout)


@dataclass
class RowConfig(ReusableRow):
    """One row: `position` (a 1-D `cape.build` name) with `options` over the experiment's
    defaults (`position_options`); `eval_options` replace or add options at evaluation only;
    `train_as`: the name of an earlier row whose trained weights this row evaluates (with that
    row's options and its own `eval_options`) instead of training; checked in `LengthConfig`.
    `notes`: the row's recipe in words (its paper), for the report; it changes no training."""

    notes: str | None = None

    def __post_init__(self) -> None:
        key = self.check_fields()
        if self.notes is not None and not isinstance(self.notes, str):
            raise ValueError(f"{key}.notes must be a string or null, got {self.notes!r}")


@dataclass
class EvalConfig:
    """lengths: the test lengths (increasing; the first is the reference "1x" of the verdict);
    test: sequences per test length; batch_size: sequences per evaluation batch. They live
    here, not in `data`, so that changing them evaluates the trained runs again (not retrains)."""

    lengths: list[int] = field(default_factory=lambda: [32, 64, 128, 256])
    test: int = 250
    batch_size: int = 50

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError("eval.lengths must list at least one test length")
        for i, length in enumerate(self.lengths):
            check_int(f"eval.lengths[{i}]", length, minimum=2)
        if list(self.lengths) != sorted(set(self.lengths)):
            raise ValueError(f"eval.lengths must be strictly increasing, got {self.lengths}")
        check_ints("eval", self, ("test", "batch_size"))


def position_options(
    row: RowConfig, cfg: LengthConfig, *, evaluation: bool = False
) -> dict[str, Any]:
    """The `cape.build(row.position, ...)` options of a row: the experiment's defaults, the
    row's options (those of the row it is trained as, if any), then at evaluation its
    `eval_options`. Defaults: abspos, a table of max_len rows (indices past it wrap, `mod`:
    AbsPos1d's own default) at the content embedding's scale (init std 1, as lff-boxes found the
    library's 0.02 left a table at content-only level in a short run); cape1d, CAPE's "text";
    FIRE's threshold and xPos's scale base by their recipe from L = max_len (`length_recipe`)."""
    defaults = {
        "abspos": {"num_positions": cfg.data.max_len, "init_std": 1.0},
        "cape1d": {"preset": "text"},
    }
    trained = trained_row(cfg.rows, row)
    options = resolve_options(row.position, trained.options, defaults)
    options = length_recipe(row.position, options, train_length=cfg.data.max_len)
    return {**options, **row.eval_options} if evaluation else options


def encoding_size(position: str, dim: int, heads: int) -> int:
    """The `dim` of `cape.build` for a model of width `dim` with `heads` heads: D for an
    absolute encoding, the head size (or the number of heads: alibi, fire) inside attention."""
    if encoding_class(position, key="position").kind == "attention":
        return attention_size(position, dim, heads)
    return dim


@dataclass
class LengthConfig(StudyConfig[DataConfig, ModelConfig, EvalConfig, RowConfig]):
    """The whole experiment: every row is trained once per seed (or reuses the weights of the
    row named by its `train_as`) and evaluated at every test length."""

    name: str = "length"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_best_metric(self.train, "acc", "max", "the validation accuracy")
        for i, length in enumerate(self.eval.lengths):
            if length <= self.data.offset:
                raise ValueError(
                    f"eval.lengths[{i}] must exceed data.offset={self.data.offset} (a scored "
                    f"token), got {length}"
                )
        check_train_as(self.rows)
        for row in self.rows:
            self._check_encoding(row)

    def _check_encoding(self, row: RowConfig) -> None:
        """Build the row's encoding for training and for evaluation: bad options fail here."""
        key = f"rows[{row.name}]"
        if encoding_class(row.position).kind == "none":
            if row.options or row.eval_options:
                raise ValueError(f"{key}: position {row.position!r} takes no options")
            return
        size = encoding_size(row.position, self.model.dim, self.model.heads)
        for what, evaluation in (("options", False), ("eval_options", True)):
            try:
                made = build(
                    row.position, size, **position_options(row, self, evaluation=evaluation)
                )
            except (TypeError, ValueError) as e:
                raise ValueError(f"{key}.{what}: {e}") from None
            if made.pos_dim != 1:
                raise ValueError(
                    f"{key}.position must read 1-D positions (tokens), {row.position!r} "
                    f"reads {made.pos_dim}-D ones"
                )


# 800 steps: rotary's quick run took 52 ms a step (one thread, 2 cores shared with another
# job), so ~42 s a row; FIRE's steps cost ~2.6x rotary's and relpos's ~1.5x, so cpu-full should
# take ~35 minutes with its evaluation (FIRE's, over a 256 x 256 bias, ~27 s a run)
_OPTIMISER = dict(steps=800, batch_size=64, lr=1e-3, weight_decay=0.01, warmup_steps=100)
_TRAIN = train_preset(_OPTIMISER, every=400, best="acc", log_every=50)
# CAPE's augmentation of token positions (the "text" preset: global shift 5, local shift 0.5),
# as fields for the names that take no preset (alibi, fire)
_CAPE_TEXT = preset_augmentation("text")
_EXTEND = {"train_length": DataConfig.max_len}  # RoPE scaling from the longest training length
# CAPE's successors (`cape.position_sampling`) and CAPE with global scaling, as in the language
# model study, at L = max_len = 32 and the longest test length 256 (the rows write the numbers:
# they are training settings of their runs)
_L, _LONGEST = DataConfig.max_len, EvalConfig().lengths[-1]
_RANDOMIZED = {"kind": "randomized", "max_length": _LONGEST}
_RFS = {"kind": "random-float", "train_length": _L}
_POSE = {"kind": "pose", "target_length": _LONGEST}
_SCALING = {**_CAPE_TEXT, "max_global_scaling": 2.0}  # lambda_max of CAPE's speech recipe
_NOTES = {
    "randomized": (
        "Ruoss et al. (ACL 2023), on their algorithmic tasks: in training the n positions of a "
        f"sequence are a sorted random subset of [0, N), N = {_LONGEST}, the longest test "
        "length; tested as the authors' models are, on a fresh subset for every sequence "
        "(`sample_at_eval`, seeded by the run's seed)."
    ),
    "RFS": (
        f"Shimizu et al. (EACL 2026 Findings): in training n sorted draws of U[0, 1) x L, L = {_L};"
        " at test the paper's (2i - 1) / (2 max(L, n)) x L: token indices (+1/2) up to L, "
        "position interpolation by n / L beyond"
    ),
    "PoSE": (
        "Zhu et al. (ICLR 2024), here trained from scratch (this study fine-tunes nothing): 2 "
        f"chunks of the sequence, skip u_1 uniform on [0, {_LONGEST} - n], so the distances of "
        f"[0, {_LONGEST}) are met; {{}} with factor {_LONGEST // _L} = {_LONGEST} / L, as the "
        "paper pairs them; tested on plain positions."
    ),
    "scaling": (
        "CAPE (NeurIPS 2021) with global scaling lambda_max = 2 (its speech recipe: 1.1 on WSJ, 2 "
        "on TED-LIUM), local shift 0.5 and the text preset's global shift 5 (unseen by rotary, "
        "ALiBi)."
    ),
}
_SUCCESSORS: list[dict[str, Any]] = [
    *[
        {
            "name": f"{base}+randomized",
            "position": position,
            "notes": _NOTES["randomized"],
            "options": {"augmentation": dict(_RANDOMIZED)},
            "eval_options": {"augmentation": {**_RANDOMIZED, "sample_at_eval": True}},
        }
        for base, position in (("rotary", "rotary"), ("ALiBi", "alibi"))
    ],
    {
        "name": "rotary+RFS",
        "position": "rotary",
        "options": {"augmentation": dict(_RFS)},
        "eval_options": {"scaling": "pi", **_EXTEND},
        "notes": _NOTES["RFS"] + ": rotary's PI.",
    },
    {
        "name": "ALiBi+RFS",
        "position": "alibi",
        "options": {"augmentation": dict(_RFS)},
        "notes": _NOTES["RFS"] + " (cape's ALiBi has no interpolation: tested on plain positions).",
    },
    *[
        {
            "name": f"rotary+PoSE-{label}",
            "position": "rotary",
            "notes": _NOTES["PoSE"].format(label),
            "options": {
                "scaling": scaling,
                "factor": float(_LONGEST // _L),
                **_EXTEND,
                "augmentation": dict(_POSE),
            },
        }
        for label, scaling in (("PI", "pi"), ("YaRN", "yarn"))
    ],
    *[
        {
            "name": f"{base}+CAPE scaling",
            "position": position,
            "options": dict(_SCALING),
            "notes": _NOTES["scaling"],
        }
        for base, position in (("rotary", "rotary"), ("ALiBi", "alibi"))
    ],
]
_ROWS: list[dict[str, Any]] = [
    {"name": "nopos", "position": "nopos"},
    {"name": "abspos", "position": "abspos"},
    {"name": "sinpos", "position": "sinpos"},
    {"name": "CAPE", "position": "cape1d"},
    {"name": "relpos", "position": "relpos"},
    {"name": "rotary", "position": "rotary"},
    *[
        {
            "name": f"rotary+{label}",
            "position": "rotary",
            "train_as": "rotary",
            "eval_options": {"scaling": scaling, **_EXTEND},
        }
        for label, scaling in (("PI", "pi"), ("NTK", "ntk"), ("YaRN", "yarn"))
    ],
    {"name": "rotary+CAPE", "position": "rotary", "options": {"preset": "text"}},
    {"name": "xPos", "position": "rotary", "options": {"xpos": True}},
    {"name": "ALiBi", "position": "alibi"},
    {"name": "ALiBi+CAPE", "position": "alibi", "options": dict(_CAPE_TEXT)},
    {"name": "FIRE", "position": "fire"},
    {"name": "FIRE+CAPE", "position": "fire", "options": dict(_CAPE_TEXT)},
    *_SUCCESSORS,  # no ALiBi+PoSE: PoSE's paper extends RoPE models only
]
_QUICK_NAMES = ("nopos", "abspos", "sinpos", "CAPE", "relpos", "rotary", "rotary+CAPE", "ALiBi")

# name -> config mapping (apply `--config` files and `--set` overrides on top)
PRESETS: dict[str, dict[str, Any]] = {
    # the default: the rows that carry the point (absolute, relative, rotary with and without
    # CAPE, ALiBi, content only), shorter training, 2 seeds: about 3 minutes on 2 CPU cores
    "quick": {
        "name": "length-quick",
        "seeds": [0, 1],
        "train": {**_TRAIN, "steps": 400, "eval_every": 200, "checkpoint_every": 200},
        "rows": [r for r in _ROWS if r["name"] in _QUICK_NAMES],
    },
    # every row, 3 seeds: 20 trained rows x 3 seeds (the 3 RoPE extensions reuse rotary's runs)
    "cpu-full": {
        "name": "length-cpu-full",
        "seeds": [0, 1, 2],
        "train": _TRAIN,
        "rows": _ROWS,
    },
}

# one line per preset: what `cape experiment NAME --help` says of it
PRESET_NOTES: dict[str, str] = {
    "quick": "8 rows x 2 seeds, shorter training: about 2 minutes on 2 CPU cores",
    "cpu-full": "every row (the RoPE extensions reuse rotary's runs)",
}
