"""Configuration of the translation experiment (CAPE sec. 5.3, appendix D.1) and its presets.

An encoder-decoder Transformer translates English into Spanish on the offline Apertium corpus
(`cape.lab.data.translation.corpus`): trained on sentences of <= 20 words, tested in distribution,
on longer sentences (21-30, 31-40, 41+ words) and, with teacher forcing, on stacked test pairs
far beyond the training length. Every row names a 1-D `cape.build` encoding
with its options; CAPE's source positions are scaled by alpha, the target/source token ratio
of the training set, measured when the experiment starts (`alpha: auto`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cape._checks import check_float, check_int
from cape.lab.experiments.pairs import preset_augmentation
from cape.lab.experiments.study_config import (
    StudyConfig,
    check_best_metric,
    check_folder,
    check_ints,
    check_transformer,
    train_preset,
)
from cape.lab.experiments.train_as import ReusableRow, check_train_as

__all__ = [
    "DataConfig",
    "ModelConfig",
    "RowConfig",
    "EvalConfig",
    "TranslationConfig",
    "PRESETS",
    "PRESET_NOTES",
]


@dataclass
class DataConfig:
    """The corpus (built under `root` on first use) and how much of it a run uses.

    limit: build from the first `limit` English sentences only (0 = all; tests, smoke runs);
    train / val: pairs used (0 = all); vocab_size: the joint SentencePiece BPE model's;
    max_tokens: training pairs whose source (with BOS and EOS) or target (with BOS) has more
    tokens are left out."""

    root: str = "data/translation"
    seed: int = 0
    workers: int = 2
    limit: int = 0
    train: int = 0
    val: int = 500
    vocab_size: int = 8000
    max_tokens: int = 64

    def __post_init__(self) -> None:
        check_folder("data.root", self.root)
        check_ints("data", self, ("train", "val", "limit", "seed"), minimum=0)
        check_int("data.workers", self.workers)
        check_int("data.vocab_size", self.vocab_size, minimum=100)
        check_int("data.max_tokens", self.max_tokens, minimum=4)


@dataclass
class ModelConfig:
    """`cape.models.Seq2Seq` sizes and the label smoothing of the training loss."""

    dim: int = 256
    encoder_layers: int = 3
    decoder_layers: int = 3
    heads: int = 4
    ffn_dim: int = 1024
    dropout: float = 0.1
    label_smoothing: float = 0.1

    def __post_init__(self) -> None:
        check_transformer(
            self,
            sizes=("dim", "encoder_layers", "decoder_layers", "heads", "ffn_dim"),
            rates=("dropout", "label_smoothing"),
        )


@dataclass
class RowConfig(ReusableRow):
    """One model: `position` (a `cape.build` name) and its options over Seq2Seq's defaults.
    `options.alpha` (the experiment's, not the encoding's): `auto` (the default) takes the
    training set's target/source token ratio; Seq2Seq uses it when the encoding augments.
    `eval_options` replace or add options at evaluation only; `train_as` names an earlier row
    whose trained weights this row evaluates instead of training
    (`cape.lab.experiments.train_as`)."""

    def __post_init__(self) -> None:
        key = self.check_fields()
        alpha = self.options.get("alpha", "auto")
        if alpha != "auto":
            check_float(f"{key}.options.alpha", alpha, strict=True)


@dataclass
class EvalConfig:
    """Test-time settings. test / long_per_bucket / stacked: pairs taken from each test split
    (0 = all); beam: beam width (0 = greedy); length_penalty: fairseq-style; val_beam: the
    decoding of the validation BLEU that picks the checkpoint (0 = greedy, fast)."""

    test: int = 0
    long_per_bucket: int = 0
    stacked: int = 0
    beam: int = 4
    length_penalty: float = 1.0
    val_beam: int = 0
    batch_size: int = 64

    def __post_init__(self) -> None:
        check_ints(
            "eval", self, ("test", "long_per_bucket", "stacked", "beam", "val_beam"), minimum=0
        )
        check_int("eval.batch_size", self.batch_size)
        check_float("eval.length_penalty", self.length_penalty)


@dataclass
class TranslationConfig(StudyConfig[DataConfig, ModelConfig, EvalConfig, RowConfig]):
    """The whole experiment: every row is trained once per seed (or evaluates the weights of
    the row its `train_as` names) and tested on every length bin."""

    name: str = "translation"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_best_metric(self.train, "bleu", "max", "the validation BLEU")
        check_train_as(self.rows)


def _row(name: str, position: str, **options: Any) -> dict[str, Any]:
    return {"name": name, "position": position, "options": options}


_CAPE = "CAPE"  # appendix D.1: Dmax 5 (best for 6L-6L), emax 0.5, no scaling, no mean-norm
_MAIN = [
    _row("sinpos", "sinpos"),
    _row("abspos", "abspos"),
    _row("relpos", "relpos"),
    _row(_CAPE, "cape1d", max_global_shift=5.0),
]
_ALL = _MAIN + [
    _row("nopos", "nopos"),
    _row("CAPE Δ=10", "cape1d", max_global_shift=10.0),
    _row("CAPE Δ=50", "cape1d", max_global_shift=50.0),
    # rotary sees only position differences: the global shift cancels, local shifts remain
    _row("rotary+CAPE", "rotary", max_global_shift=5.0),
]
# The encodings people pick instead of CAPE, next to the quick rows they are read against:
# rotary without augmentation and its length extensions chosen at inference with a fixed factor
# 4 (static scaling, as long-context models ship it: the long buckets and stacked pairs run to
# ~4-5x the longest training side, data.max_tokens; a fixed factor keeps the decoder's
# key/value cache valid, a per-call one would re-run every prefix), xPos (centre fixed at 0 for
# the same reason; it cancels in the logits), ALiBi and FIRE's biases, ALiBi over CAPE's text
# augmentation, and rotary+CAPE; FIRE's threshold and xPos's scale base are set from
# data.max_tokens by their recipe (`make_model`)
_EXTEND = {"train_length": float(DataConfig.max_tokens), "factor": 4.0}
_PEERS = [
    *[r for r in _MAIN if r["name"] in ("sinpos", "relpos", _CAPE)],
    _row("rotary", "rotary", augmentation=None),
    *[
        {
            "name": f"rotary+{label} x4",
            "position": "rotary",
            "train_as": "rotary",
            "eval_options": {"scaling": scaling, **_EXTEND},
        }
        for label, scaling in (("PI", "pi"), ("NTK", "ntk"), ("YaRN", "yarn"))
    ],
    _row("xPos", "rotary", augmentation=None, xpos=True, xpos_center=0.0),
    _row("rotary+CAPE", "rotary", max_global_shift=5.0),
    _row("ALiBi", "alibi"),
    _row("ALiBi+CAPE", "alibi", **preset_augmentation("text")),
    _row("FIRE", "fire"),
]
# ~64 pairs of ~14 BPE tokens a side per batch. On CPU budgets a cosine decay to zero at a
# high peak learns far faster than the fairseq recipe's inverse-sqrt (measured: 800 steps of
# the quick model, val BLEU 13.5 with lr 3e-3 cosine against 6.3 with 1e-3 inverse-sqrt)
_OPTIMISER = dict(batch_size=64, lr=3e-3, weight_decay=0.0, warmup_steps=200)
_TRAIN = train_preset(_OPTIMISER, every=250, best="bleu", log_every=20)

_QUICK: dict[str, Any] = {
    "name": "translation-quick",
    "data": {"val": 300},
    "model": {
        "dim": 128,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "heads": 4,
        "ffn_dim": 512,
        "dropout": 0.0,
    },
    "train": {**_TRAIN, "steps": 1500},
    "eval": {"test": 500, "long_per_bucket": 200, "stacked": 100},
}

PRESETS: dict[str, dict[str, Any]] = {
    # the default (~15 minutes): quick's model with 2000 BPE pieces (the 8000-way output layer
    # was most of a step: 10 steps/s against 7, measured) and 1000 steps; content only, sinpos
    # and CAPE (the paper's contrast), 2 seeds, each with its positions-removed check
    "small": {
        **_QUICK,
        "name": "translation-small",
        "data": {"val": 300, "vocab_size": 2000},
        "train": {
            **_TRAIN,
            "steps": 1000,
            "warmup_steps": 100,
            "eval_every": 500,
            "checkpoint_every": 500,
        },
        "rows": [_row("nopos", "nopos"), *(r for r in _MAIN if r["name"] in ("sinpos", _CAPE))],
        "seeds": [0, 1],
    },  # fmt: skip
    # minutes: the four main encodings, a 2+2-layer d128 model
    "quick": {**_QUICK, "rows": _MAIN, "seeds": [0]},
    # the peers (the encodings people pick instead of CAPE) on the quick model, beside its sinpos,
    # relpos and CAPE rows (the same settings: their runs can be copied from quick's folder)
    "quick-peers": {
        **_QUICK,
        "name": "translation-quick-peers",
        "rows": _PEERS,
        "seeds": [0, 1],
    },
    # hours: every row, three seeds, a 3+3-layer d256 model
    "cpu-full": {
        "name": "translation-cpu-full",
        "data": {"val": 500},
        "model": {
            "dim": 256,
            "encoder_layers": 3,
            "decoder_layers": 3,
            "heads": 4,
            "ffn_dim": 1024,
            "dropout": 0.1,
        },
        # 0.38-0.45 s per step on 2 idle cores (measured; 0.66-0.70 sharing them): ~22 min a run
        # with evaluation, ~9 h for 24
        "train": {
            **_TRAIN,
            "steps": 3000,
            "lr": 2e-3,
            "warmup_steps": 300,
            "eval_every": 500,
            "checkpoint_every": 500,
        },
        "eval": {"test": 2000, "long_per_bucket": 500, "stacked": 300},
        "rows": _ALL,
        "seeds": [0, 1, 2],
    },
    # GPU: the paper's 6L-6L model (Transformer-base sizes), bf16
    "paper": {
        "name": "translation-paper",
        "data": {"val": 1000, "workers": 8, "vocab_size": 16000, "max_tokens": 128},
        "model": {
            "dim": 512,
            "encoder_layers": 6,
            "decoder_layers": 6,
            "heads": 8,
            "ffn_dim": 2048,
            "dropout": 0.1,
        },
        "train": {
            **_TRAIN,
            "steps": 100000,
            "batch_size": 256,
            "lr": 7e-4,
            "schedule": "inverse_sqrt",
            "warmup_steps": 4000,
            "eval_every": 2000,
            "checkpoint_every": 2000,
            "precision": "bf16",
            "num_workers": 4,
        },
        "eval": {"beam": 5},
        "rows": _ALL,
        "seeds": [0, 1, 2],
    },
}

# one line per preset: what `cape experiment NAME --help` says of it
PRESET_NOTES: dict[str, str] = {
    "small": "the default: nopos, sinpos, CAPE x 2 seeds, 2000 BPE pieces, 1000 steps (12 min)",
    "quick": "minutes: the four main encodings, a 2+2-layer d128 model",
    "quick-peers": "rotary and its extensions, xPos, ALiBi, FIRE (+CAPE) on the quick model",
    "cpu-full": "hours on CPU: every row, a 3+3-layer d256 model",
    "paper": "GPU: the paper's 6L-6L model (Transformer-base sizes), bf16",
}
