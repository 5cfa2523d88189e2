"""The language-model experiment's presets: `quick` (the default) and `cpu-full`.

Rows are `cape.build` names with options (one name, one method everywhere in cape). The RoPE
extensions chosen at inference (PI, NTK, YaRN) reuse rotary's runs (`train_as: rotary`, only
`eval_options` change); the fine-tuned ones start from rotary's final weights and train
`finetune.steps` more at 4x L with the scaling set (`finetune_from: rotary`); both scale from
`train_length` L (`config.position_options`). CAPE's successors (`cape.position_sampling`:
randomized positions, random float sampling, PoSE) and CAPE with global scaling have rows over
rotary and, where their papers apply them, ALiBi; each row's `notes` state its paper's recipe.
"""

from __future__ import annotations

from typing import Any

from cape.lab.experiments.pairs import preset_augmentation
from cape.lab.experiments.study_config import train_preset

__all__ = ["PRESETS", "PRESET_NOTES", "ROWS"]

# CAPE's augmentation of token positions (the "text" preset: global shift 5 tokens, local
# shift 0.5, no mean-normalisation, which a causal model refuses), as fields for the names that
# take no preset (alibi, fire)
_CAPE_TEXT = preset_augmentation("text")
_EXTENSIONS = (("PI", "pi"), ("NTK", "ntk"), ("YaRN", "yarn"))
_FINETUNED = (("PI", "pi"), ("YaRN", "yarn"))

# CAPE's successors at cpu-full's L = 256, evaluated up to 16 L = 4096 (the rows write the
# numbers, so that they are training settings of their runs)
_L, _LONGEST = 256, 16 * 256
_RANDOMIZED = {"kind": "randomized", "max_length": _LONGEST}
_RANDOMIZED_AT_EVAL = {**_RANDOMIZED, "sample_at_eval": True}  # as the authors' models sample
_RFS = {"kind": "random-float", "train_length": _L}
_POSE = {"kind": "pose", "target_length": _LONGEST}
# CAPE with global scaling: lambda_max = 2, the speech recipe's upper end (CAPE sec. 5.2: 1.1
# on WSJ, 2 on TED-LIUM), over the text preset's shifts (the global one unseen by rotary, ALiBi)
_SCALING = {**_CAPE_TEXT, "max_global_scaling": 2.0}
_NOTE_RANDOMIZED = (
    "Ruoss et al. (ACL 2023): in training the 256 positions of a window are a sorted random "
    f"subset of [0, N), N = {_LONGEST} = 16 L, the longest evaluation length; evaluated as the "
    "authors' models are, on a fresh subset for every window (`sample_at_eval`, seeded by the "
    "run's seed; at 16 L the subset is 0..N-1)."
)
_NOTE_RFS = (
    "Shimizu et al. (EACL 2026 Findings): in training the positions are 256 sorted draws of "
    "U[0, 1) x L; at evaluation the paper's (2i - 1) / (2 max(L, n)) x L, i.e. the token "
    "indices up to L (+1/2, a common offset) and position interpolation by n / L beyond"
)
_NOTE_SCALING = (
    "CAPE (NeurIPS 2021) with global scaling lambda_max = 2 (its speech recipe: 1.1 on WSJ, 2 on "
    "TED-LIUM), local shift 0.5 (half a token, order kept) and the text preset's global shift 5."
)
_NOTE_POSE = (
    "Zhu et al. (ICLR 2024): a fine-tune of rotary's final weights at windows of L = 256 "
    "(PoSE's point: a quarter of the tokens of the 4x fine-tunes), 2 chunks, skips u_1 "
    f"uniform on [0, {_LONGEST} - 256], so the relative distances of the 16x window are met; "
    f"{{}} with factor 16 = {_LONGEST} / L, as the paper pairs them; evaluated on plain positions."
)

ROWS: list[dict[str, Any]] = [
    {"name": "nopos", "position": "nopos"},
    {"name": "sinpos", "position": "sinpos"},
    {"name": "CAPE", "position": "cape1d", "options": {"preset": "text", "normalize": False}},
    {"name": "relpos", "position": "relpos"},
    {"name": "rotary", "position": "rotary"},
    *[
        {
            "name": f"rotary {label}@inference",
            "position": "rotary",
            "train_as": "rotary",
            "eval_options": {"scaling": scaling},
        }
        for label, scaling in _EXTENSIONS
    ],
    *[
        {
            "name": f"rotary {label} fine-tuned",
            "position": "rotary",
            "finetune_from": "rotary",
            "options": {"scaling": scaling},
        }
        for label, scaling in _FINETUNED
    ],
    {"name": "xPos", "position": "rotary", "options": {"xpos": True}},
    {"name": "ALiBi", "position": "alibi"},
    {"name": "FIRE", "position": "fire"},
    {"name": "rotary+CAPE", "position": "rotary", "options": {"preset": "text"}},
    {"name": "ALiBi+CAPE", "position": "alibi", "options": dict(_CAPE_TEXT)},
    {"name": "FIRE+CAPE", "position": "fire", "options": dict(_CAPE_TEXT)},
    {
        "name": "rotary+randomized",
        "position": "rotary",
        "options": {"augmentation": dict(_RANDOMIZED)},
        "eval_options": {"augmentation": dict(_RANDOMIZED_AT_EVAL)},
        "notes": _NOTE_RANDOMIZED,
    },
    {
        "name": "rotary+RFS",
        "position": "rotary",
        "options": {"augmentation": dict(_RFS)},
        "eval_options": {"scaling": "pi"},  # no factor: length / L beyond L, as the paper's rule
        "notes": _NOTE_RFS + ": rotary's PI without a fixed factor.",
    },
    *[
        {
            "name": f"rotary PoSE-{label} fine-tuned",
            "position": "rotary",
            "finetune_from": "rotary",
            "finetune_factor": 1,
            "options": {"scaling": scaling, "factor": 16.0, "augmentation": dict(_POSE)},
            "notes": _NOTE_POSE.format(f"with {label}"),
        }
        for label, scaling in _FINETUNED
    ],
    {
        "name": "rotary+CAPE scaling",
        "position": "rotary",
        "options": dict(_SCALING),
        "notes": _NOTE_SCALING,
    },
    {
        "name": "ALiBi+randomized",
        "position": "alibi",
        "options": {"augmentation": dict(_RANDOMIZED)},
        "eval_options": {"augmentation": dict(_RANDOMIZED_AT_EVAL)},
        "notes": _NOTE_RANDOMIZED,
    },
    {
        "name": "ALiBi+RFS",
        "position": "alibi",
        "options": {"augmentation": dict(_RFS)},
        "notes": _NOTE_RFS + " (cape's ALiBi has no interpolation: evaluated on plain positions).",
    },
    {
        "name": "ALiBi+CAPE scaling",
        "position": "alibi",
        "options": dict(_SCALING),
        "notes": _NOTE_SCALING,
    },
]  # no ALiBi+PoSE: PoSE's paper extends RoPE models only
_QUICK_NAMES = ("nopos", "rotary", "ALiBi", "rotary+CAPE")

# quick: 5 min 48 s on the idle 2 cores from a fresh clone (2026-11-27), corpus included: 4 rows
# x 3 seeds, ~20 s of training a run (300 steps of 24 x 128 bytes, d 128, 2 layers, the fused
# rotary), the rest evaluation at 1x-32x.
# cpu-full, measured alone on the 2 cores (docs/experiments/lm.md): a trained run 4.7-9.1 min
# (FIRE+CAPE 37-40: its MLP over [B, T, T] pairs), a fine-tune under a minute, evaluation about a
# minute a run: about 8 hours for the 24 rows x 3 seeds.
_QUICK_TRAIN = train_preset(
    dict(steps=300, batch_size=24, lr=2e-3, weight_decay=0.01, warmup_steps=30),
    every=150,
    best="loss",
    log_every=50,
)
_FULL_TRAIN = train_preset(
    dict(steps=1000, batch_size=32, lr=1e-3, weight_decay=0.01, warmup_steps=100),
    every=500,
    best="loss",
    log_every=100,
)

# name -> config mapping (apply `--config` files and `--set` overrides on top)
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        "name": "lm-quick",
        "seeds": [0, 1, 2],
        "data": {"context": 128, "val_tokens": 16384},
        "model": {"dim": 128, "heads": 4, "layers": 2, "ffn_dim": 512},
        "train": _QUICK_TRAIN,
        "eval": {"factors": [1, 2, 4, 8, 16, 32], "max_tokens": 65536},
        "rows": [r for r in ROWS if r["name"] in _QUICK_NAMES],
    },
    "cpu-full": {
        "name": "lm-cpu-full",
        "seeds": [0, 1, 2],
        "data": {"context": 256, "val_tokens": 32768},
        "model": {"dim": 128, "heads": 4, "layers": 3, "ffn_dim": 512},
        "train": _FULL_TRAIN,
        "finetune": {"factor": 4, "steps": 100, "batch_size": 8, "lr": 3e-4},
        "eval": {"factors": [1, 2, 4, 8, 16], "max_tokens": 65536},
        "rows": ROWS,
    },
}

# one line per preset: what `cape experiment NAME --help` says of it
PRESET_NOTES: dict[str, str] = {
    "quick": "KJV bytes, L=128, 1x-32x, 3 seeds: about 6 minutes on 2 CPU cores, corpus included",
    "cpu-full": "every row, L=256, 1x-16x (the RoPE extensions at inference reuse rotary's "
    "runs): about 8 hours on 2 CPU cores",
}
