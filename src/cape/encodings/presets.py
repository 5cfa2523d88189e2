"""The papers' presets, and CAPE's augmentation written as fields -> an encoding's keywords.

Every encoding takes CAPE's augmentation as `augmentation=` a `cape.Augmentation`. Config files,
`cape.build` and `PRESETS` write it as its four fields (`max_global_shift`, `max_local_shift`,
`max_global_scaling`, `normalize`), with max_local_shift="auto" for CAPE2d's emax = 1/N per
axis (`CAPE2d(auto_local_shift=True)`): `field_options` and `preset_options` turn the fields
into constructor keywords. `CAPE1d`, `CAPE2d` and `SineND` took the fields as keywords
themselves; `legacy_augmentation` keeps that working, with a DeprecationWarning.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from ..augment import AUGMENTATION_FIELDS, Augmentation, check_augmentation

__all__ = ["PRESETS", "field_options", "preset_options", "legacy_augmentation"]

# The papers' values per modality (CAPE sec. 5, appendices C.2, D.1), written as CAPE's
# augmentation fields (as config files write them; `preset` and `cape.build` turn them into
# `augmentation=`). max_local_shift="auto" is CAPE2d's `auto_local_shift=True`.
PRESETS: dict[str, dict[str, object]] = {
    # MT: Dmax 5-50 tokens (5 best for 6L-6L), emax 0.5 keeps token order, no scaling/mean-norm
    "text": dict(
        max_global_shift=5.0, max_local_shift=0.5, max_global_scaling=1.0, normalize=False
    ),
    # ASR: time in seconds, omega x30, Dmax 60 s, emax = half the 30 ms frame step, lambda 1.1-2
    "audio": dict(
        max_global_shift=60.0,
        max_local_shift=0.015,
        max_global_scaling=1.1,
        normalize=True,
        freq_scale=30.0,
    ),
    # ViT: Dmax 0.5, emax 1/N per axis ("auto"), lambda 1.4
    "image": dict(max_global_shift=0.5, max_local_shift="auto", max_global_scaling=1.4),
}


def _active(aug: Augmentation | None) -> Augmentation | None:
    """None for an augmentation that does nothing (no draw, no mean-normalisation): the
    module is then the plain sinusoid, with its cached eval-mode tables."""
    return aug if aug is not None and (aug.random or aug.normalize) else None


def _is_auto(value: object) -> bool:
    return isinstance(value, str) and value == "auto"


def field_options(fields: Mapping[str, object], *, auto_local: bool = False) -> dict[str, object]:
    """CAPE's augmentation fields, as `PRESETS` and config files write them -> the constructor
    keywords of an encoding: `augmentation` (a `cape.Augmentation`, None when it would do
    nothing), and `auto_local_shift=True` for max_local_shift="auto" where `auto_local` (CAPE2d;
    elsewhere "auto" is refused by `Augmentation`)."""
    fields = dict(fields)
    out: dict[str, object] = {}
    if auto_local and _is_auto(fields.get("max_local_shift")):
        fields["max_local_shift"] = 0.0
        out["auto_local_shift"] = True
    out["augmentation"] = _active(Augmentation(**fields)) if fields else None  # type: ignore[arg-type]
    return out


def preset_options(
    modality: str, overrides: Mapping[str, object], *, auto_local: bool = False
) -> dict[str, object]:
    """`PRESETS[modality]` with `overrides` (constructor options, or augmentation fields that
    replace the preset's one by one, or `augmentation=` that replaces them all) -> constructor
    keywords (`field_options`)."""
    values = dict(PRESETS[modality])
    options = dict(overrides)
    fields = {k: values.pop(k) for k in AUGMENTATION_FIELDS if k in values}
    given = {k: options.pop(k) for k in AUGMENTATION_FIELDS if k in options}
    if "augmentation" in options:
        if given:
            raise ValueError(f"give augmentation or its fields {sorted(given)}, not both")
        return {**values, **options}
    return {**values, **field_options(fields | given, auto_local=auto_local), **options}


def legacy_augmentation(
    cls: str,
    augmentation: object,
    legacy: Mapping[str, object],
    extra: str = "",
) -> Augmentation | None:
    """`augmentation=` (checked), or the deprecated flat keywords (those given, not None) as a
    `cape.Augmentation` with a DeprecationWarning that writes the new form; both: ValueError.
    extra: what the new form adds after augmentation= (CAPE2d's auto_local_shift=True)."""
    given = {k: v for k, v in legacy.items() if v is not None}
    if not given:
        return check_augmentation(augmentation)
    if augmentation is not None:
        raise ValueError(
            f"{cls}: give augmentation= or the deprecated keywords {sorted(given)}, not both"
        )
    fields = ", ".join(f"{k}={v!r}" for k, v in given.items() if not _is_auto(v))
    warnings.warn(
        f"{cls}'s keywords {', '.join(given)} are deprecated: write "
        f"{cls}(dim, augmentation=cape.Augmentation({fields}){extra})",
        DeprecationWarning,
        stacklevel=3,  # the caller of the encoding's constructor
    )
    return Augmentation(**{k: v for k, v in given.items() if not _is_auto(v)})  # type: ignore[arg-type]
