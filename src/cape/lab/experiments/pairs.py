"""Rows that differ from another row by one thing, and the sentence that compares them.

A study's verdict reads pairs off its config rather than off row names: a row whose options
set `keys` (CAPE's augmentation, `fit_grid`) and a twin that is the same row without them.
Every comparison uses the seeds' spread: two cells whose means differ by less than the larger
of their standard deviations are called level, whatever their order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "AUGMENTATION_KEYS",
    "METHODS",
    "augmentation_method",
    "preset_augmentation",
    "twins",
    "level",
    "decided",
    "pair_sentences",
    "verdict_pairs",
]

# the options that give a row CAPE's augmentation (`cape.build`'s fields, the whole of it, or
# a modality preset's values)
AUGMENTATION_KEYS = (
    "preset",
    "augmentation",
    "max_global_shift",
    "max_local_shift",
    "max_global_scaling",
    "normalize",
)


# the augmentations of `cape.position_sampling` by the "kind" a row's options write them with;
# any other augmentation a row's options set is CAPE's
METHODS = {
    "randomized": "Randomized positions",
    "pose": "PoSE",
    "random-float": "Random float sampling",
}


def augmentation_method(row: Mapping[str, Any]) -> str:
    """What augments a row (a config mapping): one of `METHODS`, else CAPE's augmentation."""
    aug = (row.get("options") or {}).get("augmentation")
    kind = aug.get("kind", "cape") if isinstance(aug, Mapping) else "cape"
    return METHODS.get(kind, "CAPE's augmentation")


def preset_augmentation(modality: str) -> dict[str, Any]:
    """CAPE's augmentation fields of a modality preset ("text", "audio", ...), as options for
    the encodings that take no `preset` (alibi, fire)."""
    from cape.build import AUGMENTATION_FIELDS
    from cape.encodings.sinusoidal import PRESETS

    return {k: v for k, v in PRESETS[modality].items() if k in AUGMENTATION_FIELDS}


# names that are CAPE whatever their options (their twin without augmentation is sinpos)
CAPE_NAMES = ("cape1d", "cape2d")

Cell = Mapping[str, Any]


def _without(row: Mapping[str, Any], keys: Sequence[str]) -> tuple[dict, dict]:
    # a row's notes (its recipe in words) do not make it another model; nor, for the
    # augmentations, does their evaluation rule (RFS's interpolation, randomized positions
    # sampled at evaluation): it is part of the method
    skip = {"name", "options", "notes"}
    if set(keys) & set(AUGMENTATION_KEYS):
        skip.add("eval_options")
    rest = {k: v for k, v in row.items() if k not in skip}
    options = {k: v for k, v in (row.get("options") or {}).items() if k not in keys}
    return rest, options


def twins(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> list[tuple[str, str]]:
    """(row, twin) names: `row`'s options set one of `keys` (to something but None/False) and
    `twin` is the same row (position, options, every other field) without them (or with them
    None/False). With the augmentation's keys, the CAPE names are left out: they augment by
    default."""
    out = []
    for row in rows:
        options = row.get("options") or {}
        if set(keys) & set(AUGMENTATION_KEYS) and row.get("position") in CAPE_NAMES:
            continue
        if not any(options.get(k) not in (None, False) for k in keys):
            continue
        bare = _without(row, keys)
        twin = next(
            (
                r["name"]
                for r in rows
                if r is not row
                and not any((r.get("options") or {}).get(k) not in (None, False) for k in keys)
                and _without(r, keys) == bare
            ),
            None,
        )
        if twin is not None:
            out.append((row["name"], twin))
    return out


def level(a: Cell, b: Cell) -> bool:
    """Whether two summary cells (mean, std) are within the seeds' spread of each other."""
    return abs(a["mean"] - b["mean"]) <= max(a["std"], b["std"])


def decided(a: Cell, b: Cell, holds: bool) -> bool | None:
    """A claim comparing cells a and b: `holds`, or None (undecided) where a and b are within
    the seeds' spread (`level`)."""
    return None if level(a, b) else holds


def pair_sentences(
    title: str,
    pairs: Sequence[tuple[str, str]],
    cell: Callable[[str, Any], Cell | None],
    columns: Sequence[Any],
    label: Callable[[Any], str],
    unit: str = "points",
    twin_note: str = "",
) -> list[str]:
    """One sentence per pair: `row` against `twin` (+ `twin_note`), the difference of means at
    each column (`cell(row, column)`, None when not measured), "(level)" within the seeds'
    spread."""
    out = []
    for a, b in pairs:
        diffs = []
        for col in columns:
            ca, cb = cell(a, col), cell(b, col)
            if ca is None or cb is None:
                continue
            diffs.append(
                f"{ca['mean'] - cb['mean']:+.1f} at {label(col)}"
                + (" (level)" if level(ca, cb) else "")
            )
        if diffs:
            head = f"**{title}**: `{a}` against `{b}`{twin_note}, {unit}: "
            out.append(head + ", ".join(diffs) + ".")
    return out


def verdict_pairs(
    rows: Sequence[Mapping[str, Any]],
    cell: Callable[[str, Any], Cell | None],
    columns: Sequence[Any],
    label: Callable[[Any], str],
    unit: str = "points",
) -> list[str]:
    """What every study's verdict says of its pairs (`pair_sentences`): an augmentation (CAPE's,
    or one of `METHODS`) against the same row without it, each length extension chosen at
    inference against the row whose weights it evaluates (`train_as`), and an augmentation
    drawn in every layer (`draw: per_layer`) against the same row whose layers share one draw
    (the method)."""
    reuse = [(r["name"], r["train_as"]) for r in rows if r.get("train_as")]
    by_name = {r["name"]: r for r in rows}
    return [
        *(
            sentence
            for pair in twins(rows, AUGMENTATION_KEYS)
            for sentence in pair_sentences(
                augmentation_method(by_name[pair[0]]), [pair], cell, columns, label, unit,
                twin_note=" (not augmented)",
            )
        ),
        *pair_sentences(
            "Extended at inference", reuse, cell, columns, label, unit,
            twin_note=" (the same weights)",
        ),
        *pair_sentences(
            "Augmentation drawn in every layer", twins(rows, ("draw",)), cell, columns, label,
            unit, twin_note=" (one draw shared by the layers)",
        ),
    ]  # fmt: skip
