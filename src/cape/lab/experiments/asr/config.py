"""Configuration of the speech experiment (CAPE sec. 5.2, appendix C) and its presets.

CTC letter recognition on the offline espeak-ng corpus (`cape.lab.data.speech.corpus`): trained on
utterances <= 6 s, tested on duration bins up to 45 s and on voices never heard in training.
Every row names a 1-D `cape.build` encoding with its options, whether
SpecAugment is on, and how batches are made ("padded" at 10 ms, or "padding-free": per-sample
hops and random frame skipping, CAPE app. C.3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cape._checks import check_choice, check_float, check_int
from cape.lab.data.speech.specaugment import MaskSettings
from cape.lab.data.speech.synth import MAX_TRAIN_SECONDS
from cape.lab.data.text.sentences import TEXT_SOURCES
from cape.lab.experiments.pairs import preset_augmentation
from cape.lab.experiments.study_config import (
    StudyConfig,
    check_best_metric,
    check_folder,
    check_ints,
    check_position,
    check_transformer,
    row_key,
    train_preset,
)
from cape.lab.experiments.train_as import check_reuse_fields, check_train_as

__all__ = [
    "DataConfig",
    "FeatureConfig",
    "ModelConfig",
    "RowConfig",
    "EvalConfig",
    "AsrConfig",
    "PRESETS",
    "PRESET_NOTES",
    "BATCHING",
]

BATCHING = ("padded", "padding-free")


@dataclass
class DataConfig:
    """The corpus (`cape.lab.data.make_speech_corpus`, made on first use under `root`): training
    and validation utterances, test utterances per duration bin, seed, additive noise, and
    `text`: what is said ("wordnet" sentences or "digits" strings)."""

    root: str = "data/speech"
    text: str = "wordnet"
    train: int = 4000
    val: int = 200
    test_per_bin: int = 24
    seed: int = 0
    noise: bool = True
    workers: int = 2

    def __post_init__(self) -> None:
        check_folder("data.root", self.root)
        check_ints("data", self, ("train", "val", "test_per_bin", "workers"))
        check_int("data.seed", self.seed, minimum=0)
        check_choice("data.noise", self.noise, (True, False))
        check_choice("data.text", self.text, TEXT_SOURCES)


@dataclass
class FeatureConfig:
    """Log-mel front end (80 bands, 25 ms window, 10 ms hop, normalised per utterance) and
    SpecAugment (2 frequency masks of <= 30 bands, 10 time masks, ratio 0.1, <= 50 frames)."""

    n_mels: int = 80
    win_ms: float = 25.0
    hop_ms: float = 10.0
    freq_masks: int = 2
    freq_width: int = 30
    time_masks: int = 10
    time_ratio: float = 0.1
    time_width: int = 50

    def __post_init__(self) -> None:
        check_int("features.n_mels", self.n_mels, minimum=8)
        check_float("features.win_ms", self.win_ms, strict=True)
        check_float("features.hop_ms", self.hop_ms, strict=True)
        MaskSettings.check(self, "features.")


@dataclass
class ModelConfig:
    """`cape.models.CTCModel` sizes: conv (kernel 7, stride 3, GLU), Transformer, dropouts."""

    dim: int = 144
    depth: int = 4
    heads: int = 4
    ffn_dim: int = 576
    kernel: int = 7
    stride: int = 3
    conv_dropout: float = 0.1
    dropout: float = 0.1
    layer_drop: float = 0.0

    def __post_init__(self) -> None:
        check_transformer(
            self,
            sizes=("dim", "depth", "heads", "ffn_dim", "kernel", "stride"),
            rates=("conv_dropout", "dropout", "layer_drop"),
        )


@dataclass
class RowConfig:
    """One model: `position` (a `cape.build` name), its options over
    CTCModel's defaults, relpos/rotary in "all" layers or the "first" only, SpecAugment on or
    off, and the batching of training ("padded" or "padding-free"). `eval_options` replace or
    add options at evaluation only; `train_as` names an earlier row whose trained weights this
    row evaluates (with its own `eval_options`) instead of training
    (`cape.lab.experiments.train_as`)."""

    name: str = ""
    position: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    relative_layers: str = "all"
    specaugment: bool = True
    batching: str = "padded"
    eval_options: dict[str, Any] = field(default_factory=dict)
    train_as: str | None = None

    def __post_init__(self) -> None:
        key = row_key(self.name)
        check_position(f"{key}.position", self.position)
        check_choice(f"{key}.relative_layers", self.relative_layers, ("all", "first"))
        check_choice(f"{key}.specaugment", self.specaugment, (True, False))
        check_choice(f"{key}.batching", self.batching, BATCHING)
        check_reuse_fields(key, self)


@dataclass
class EvalConfig:
    """Test-time settings. splits: corpus test splits; hops_ms: STFT hops of the WER-vs-hop
    study (0 Figure 17), run for the rows named in `hop_rows` on `test`; beam: 0 = greedy CTC
    decoding, else the prefix beam width; val_limit: validation utterances used for the
    checkpoint choice during training (0 = all)."""

    splits: list[str] = field(default_factory=lambda: ["test", "test_unseen_voices"])
    hops_ms: list[float] = field(default_factory=lambda: [5.0, 10.0, 15.0, 20.0])
    hop_rows: list[str] = field(default_factory=list)
    beam: int = 0
    val_limit: int = 0

    def __post_init__(self) -> None:
        for s in self.splits:
            check_choice("eval.splits[]", s, ("test", "test_unseen_voices"))
        if not self.splits:
            raise ValueError("eval.splits must name at least one test split")
        for h in self.hops_ms:
            check_float("eval.hops_ms[]", h, strict=True)
        check_ints("eval", self, ("beam", "val_limit"), minimum=0)


@dataclass
class AsrConfig(StudyConfig[DataConfig, ModelConfig, EvalConfig, RowConfig]):
    """The whole experiment: every row is trained once per seed (or evaluates the weights of
    the row its `train_as` names) and tested on every split, with `features` the front end."""

    name: str = "asr"
    features: FeatureConfig = field(default_factory=FeatureConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_best_metric(self.train, "wer", "min", "the validation WER")
        check_train_as(self.rows, same=("relative_layers", "specaugment", "batching"))
        names = {r.name for r in self.rows}
        unknown = [n for n in self.eval.hop_rows if n not in names]
        if unknown:
            raise ValueError(f"eval.hop_rows must name rows {sorted(names)}, got {unknown}")


def _row(name: str, position: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "position": position, **kw}


_CAPE = "CAPE"  # the paper's audio preset: global shift 60 s, local shift 15 ms, lambda 1.1
_MAIN = [
    _row("nopos", "nopos"),
    _row("abspos", "abspos"),
    _row("sinpos", "sinpos"),
    _row(_CAPE, "cape1d"),
]
# CAPE's audio augmentation over rotary's seconds (the paper's audio preset)
_ROTARY_AUG = {
    "max_global_shift": 60.0,
    "max_local_shift": 0.015,
    "max_global_scaling": 1.1,
    "normalize": True,
}
_ALL = _MAIN + [
    _row("CAPE λ=2", "cape1d", options={"max_global_scaling": 2.0}),
    _row("CAPE Δ=15s", "cape1d", options={"max_global_shift": 15.0}),
    _row("CAPE Δ=30s", "cape1d", options={"max_global_shift": 30.0}),
    _row("CAPE no local shift", "cape1d", options={"max_local_shift": 0.0}),
    _row("CAPE no global shift", "cape1d", options={"max_global_shift": 0.0}),
    _row("CAPE no scaling", "cape1d", options={"max_global_scaling": 1.0}),
    _row("relpos", "relpos"),
    _row("relpos 6s", "relpos", options={"max_distance": 6.0}),
    _row("relpos first layer", "relpos", relative_layers="first"),
    _row("rotary+CAPE", "rotary", options={"augmentation": _ROTARY_AUG}),
    # augmentation study (Figure 7): the main sinpos/CAPE rows have SpecAugment
    _row("sinpos no SpecAugment", "sinpos", specaugment=False),
    _row("CAPE no SpecAugment", "cape1d", specaugment=False),
    # padded vs padding-free (Figures 15-16): sinpos and CAPE lambda = 1
    _row("sinpos padding-free", "sinpos", batching="padding-free"),
    _row("CAPE λ=1", "cape1d", options={"max_global_scaling": 1.0}),
    _row(
        "CAPE λ=1 padding-free",
        "cape1d",
        options={"max_global_scaling": 1.0},
        batching="padding-free",
    ),
]
# The encodings people pick instead of CAPE: ALiBi alone and over CAPE-augmented seconds, next
# to the digits-k3 rows they are read against (their runs are reused from that study's folder)
_AUDIO_AUG = preset_augmentation("audio")
# RoPE's length extensions read the longest training utterance (seconds), chosen at inference
_EXTEND = {"train_length": MAX_TRAIN_SECONDS}
_PEERS = [
    *[r for r in _ALL if r["name"] in ("nopos", "sinpos", _CAPE, "relpos", "rotary+CAPE")],
    _row("ALiBi", "alibi"),
    _row("ALiBi+CAPE", "alibi", options={"augmentation": _AUDIO_AUG}),
    _row("rotary", "rotary"),
    *[
        _row(f"rotary+{label}", "rotary", train_as="rotary", eval_options={"scaling": s, **_EXTEND})
        for label, s in (("PI", "pi"), ("NTK", "ntk"), ("YaRN", "yarn"))
    ],
    _row("xPos", "rotary", options={"xpos": True}),
    _row("FIRE", "fire"),
    # the ablation of the position plan's shared draw: every layer draws its own augmentation
    _row(
        "rotary+CAPE per layer",
        "rotary",
        options={"augmentation": _ROTARY_AUG, "draw": "per_layer"},
    ),
]
_OPTIMISER = dict(batch_size=16, lr=2e-3, weight_decay=0.01, warmup_steps=150)
_TRAIN = train_preset(_OPTIMISER, every=250, best="wer", log_every=10)

# no dropout inside the Transformer on CPU: its Bernoulli draws took a quarter of a training
# step (profiled), and a 1500-step run sees each training utterance ~6 times (no overfitting yet)
_CPU_MODEL = {"dropout": 0.0, "conv_dropout": 0.1}

_WORDNET = {
    "name": "asr-quick",
    "data": {"train": 4000, "val": 200, "test_per_bin": 24},
    "model": _CPU_MODEL,
    "train": {**_TRAIN, "steps": 1500},
    "eval": {"hop_rows": ["sinpos", _CAPE], "val_limit": 100},
    "rows": _MAIN,
    "seeds": [0],
}
_DIGITS = {
    **_WORDNET,
    "name": "asr-digits",
    "data": {**_WORDNET["data"], "root": "data/speech-digits", "text": "digits"},
}

# The default: digits-k3's task (frames that do not see their neighbours, so the Transformer
# must find context by position) with a smaller model (d 96, 3 layers: 16 steps/s against 8.7
# for d 144, 4 layers, measured) and 800 steps, so that 6 rows x 2 seeds fit ~15 minutes on 2
# CPU cores; the rows that carry the study's point, each with its positions-removed check
_QUICK_ROWS = ("nopos", "sinpos", _CAPE, "rotary", "rotary+CAPE", "ALiBi")
_SMALL = {
    **_DIGITS,
    "name": "asr-digits-k3-small",
    "model": {**_CPU_MODEL, "kernel": 3, "dim": 96, "depth": 3, "heads": 4, "ffn_dim": 384},
    "train": {**_TRAIN, "steps": 800, "warmup_steps": 80, "eval_every": 400,
              "checkpoint_every": 400},
    "eval": {"hop_rows": [], "val_limit": 100},
    "rows": [r for name in _QUICK_ROWS for r in _PEERS if r["name"] == name],
    "seeds": [0, 1],
}  # fmt: skip

_K3 = {**_DIGITS, "model": {**_CPU_MODEL, "kernel": 3}, "seeds": [0, 1, 2]}

PRESETS: dict[str, dict[str, Any]] = {
    # the default (~15 minutes): does a speech model need positions, and which generalise?
    "digits-k3-small": _SMALL,
    # the four main encodings on WordNet speech, one seed (WER ~93% for every row: with the
    # 7-frame front end nothing uses its positions)
    "quick": _WORDNET,
    # the quick preset on spoken digit strings (a ten-word vocabulary: most words right in
    # minutes, where WordNet's open vocabulary leaves WER near 90%)
    "digits": _DIGITS,
    # every row, three seeds, on digits with a front end that sees no neighbouring frames
    # (kernel 3 = stride 3): the Transformer must find context by position, as the paper's
    # models do; with kernel 7 the CPU-sized models ignore their positions (README)
    "digits-k3": {**_K3, "name": "asr-digits-k3", "rows": _ALL},
    # the peers (the encodings people pick instead of CAPE) with digits-k3's settings, 3 seeds
    "digits-k3-peers": {**_K3, "name": "asr-digits-k3-peers", "rows": _PEERS},
    # hours: every row, three seeds
    "cpu-full": {
        "name": "asr-cpu-full",
        "data": {"train": 10000, "val": 300, "test_per_bin": 40},
        "model": _CPU_MODEL,
        "train": {**_TRAIN, "steps": 3000},
        "eval": {"hop_rows": ["sinpos", _CAPE, "CAPE λ=1 padding-free"], "val_limit": 150},
        "rows": _ALL,
        "seeds": [0, 1, 2],
    },
    # GPU: the paper's 36-layer D 768 model and its schedule scale (app. C.2)
    "paper": {
        "name": "asr-paper",
        "data": {"train": 100000, "val": 1000, "test_per_bin": 100, "workers": 8},
        "model": {
            "dim": 768,
            "depth": 36,
            "heads": 4,
            "ffn_dim": 3072,
            "conv_dropout": 0.3,
            "dropout": 0.3,
            "layer_drop": 0.3,
        },
        "train": {
            **_TRAIN,
            "steps": 300000,
            "batch_size": 64,
            "lr": 2e-4,
            "warmup_steps": 64000,
            "eval_every": 5000,
            "checkpoint_every": 5000,
            "precision": "bf16",
            "num_workers": 8,
        },
        "eval": {"hop_rows": ["sinpos", _CAPE, "CAPE λ=1 padding-free"]},
        "rows": _ALL,
        "seeds": [0, 1, 2],
    },
}

# one line per preset: what `cape experiment NAME --help` says of it
PRESET_NOTES: dict[str, str] = {
    "digits-k3-small": "the default: digits, kernel-3 front end, d 96, 6 rows x 2 seeds (13 min)",
    "quick": "the four main encodings on WordNet speech (no row uses its positions), 18 min",
    "digits": "the quick preset on spoken digit strings (a ten-word vocabulary), minutes",
    "digits-k3": ("every row on digits with a kernel-3 front end (no neighbouring frames)"),
    "digits-k3-peers": "rotary and its extensions, xPos, ALiBi, FIRE (+CAPE), digits-k3's settings",
    "cpu-full": "hours on CPU: every row",
    "paper": "GPU: the paper's 36-layer D 768 model and its schedule (app. C.2)",
}
