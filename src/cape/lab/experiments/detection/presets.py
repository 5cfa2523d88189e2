"""The detection experiment's presets: Table 2's protocol (the default) and Table 1's, each at a
quick size and at cpu-full's, with the paper's rows (Sine-2D, Embed-2D, MLP,
Learnable-Fourier+MLP), content only (`nopos`) and, in cpu-full, CAPE's rows."""

from __future__ import annotations

from typing import Any

from cape.lab.experiments.study_config import train_preset

__all__ = ["PRESETS", "PRESET_NOTES", "DEFAULT", "PAPER_ROWS"]

DEFAULT = "table2"

PAPER_ROWS = ("Sine-2D", "Embed-2D", "MLP", "Learnable-Fourier+MLP")
# CAPE's image values (sec. 5.1): Dmax 0.5, emax half a cell, lambda 1.4, in its units (the
# largest training grid spans 2); the positions centred per image first (CAPE's images are
# centred by construction)
_CAPE = {
    "max_global_shift": 0.5,
    "max_local_shift": "auto",
    "max_global_scaling": 1.4,
    "normalize": True,
}
_ROWS: list[dict[str, Any]] = [
    {"name": "nopos", "position": "nopos"},
    {"name": "Sine-2D", "position": "sine-2d"},
    {"name": "Embed-2D", "position": "embed-2d"},
    {"name": "MLP", "position": "lff", "options": {"fourier": False}},
    {"name": "Learnable-Fourier+MLP", "position": "lff"},
]
_CAPE_ROWS: list[dict[str, Any]] = [
    {"name": "CAPE2d", "position": "cape2d", "options": _CAPE},
    {"name": "CAPE2d grid", "position": "cape2d", "options": {**_CAPE, "fit_grid": True}},
    {
        "name": "rotary2d+CAPE",
        "position": "rotary2d",
        "options": {**{k: v for k, v in _CAPE.items() if k != "normalize"}, "fit_grid": True},
    },
]

_OPTIMISER = dict(steps=1200, batch_size=16, lr=1e-3, weight_decay=1e-4, warmup_steps=100)
_TRAIN = train_preset(_OPTIMISER, every=1200, best="loss", log_every=50)
_TABLE1 = {"held_out": 0, "normalize": True}

_QUICK: dict[str, Any] = {
    "name": "detection-quick",
    "seeds": [0, 1, 2],
    "data": {"train": 4000, "val": 200, "test": 500},
    "train": _TRAIN,
    "rows": _ROWS,
}
_FULL: dict[str, Any] = {
    "name": "detection-cpu-full",
    "seeds": [0, 1, 2],
    "data": {"train": 8000, "val": 200, "test": 1000},
    "train": {**_TRAIN, "steps": 4000, "eval_every": 1000, "checkpoint_every": 1000},
    "rows": [*_ROWS, *_CAPE_ROWS],
}

# name -> config mapping (apply `--config` files and `--set` overrides on top)
PRESETS: dict[str, dict[str, Any]] = {
    # the default: Table 2's protocol (the three largest sizes never trained on, positions
    # counted in cells), the paper's rows and content only, 3 seeds
    "table2": _QUICK,
    # Table 1's protocol (every size in training, positions in (0, 1)), the same rows
    "table1": {
        **_QUICK,
        "name": "detection-table1",
        "data": {**_QUICK["data"], **_TABLE1},
    },
    # every row (CAPE's too), larger data and 4000 steps, Table 2's protocol
    "cpu-full": _FULL,
    # the same with Table 1's protocol
    "cpu-full-table1": {
        **_FULL,
        "name": "detection-cpu-full-table1",
        "data": {**_FULL["data"], **_TABLE1},
    },
}

# one line per preset: what `cape experiment NAME --help` says of it
PRESET_NOTES: dict[str, str] = {
    "table2": "Table 2: the 3 largest sizes unseen, positions in cells; the paper's rows",
    "table1": "Table 1: every size in training, positions in (0, 1); the paper's rows",
    "cpu-full": "Table 2's protocol, every row (CAPE2d, its fitted frequencies, rotary+CAPE)",
    "cpu-full-table1": "Table 1's protocol, every row",
}
