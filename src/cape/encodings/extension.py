"""`Rotary`'s options beyond the training length, checked and set on the module: the length
extension (`scaling`: PI, NTK, YaRN, with `train_length` / `factor`) and xPos. The formulas are
in `cape.functional.rope_scaling`; this only validates and stores what `Rotary` reads."""

from __future__ import annotations

from typing import Any

from .._checks import check_bool, check_choice, check_float, check_limit

__all__ = ["init_extension"]


def init_extension(
    rot: Any,
    scaling: str | None,
    train_length: float | None,
    factor: float | None,
    yarn_alpha: float,
    yarn_beta: float,
    xpos: bool,
    xpos_scale_base: float,
    xpos_center: float | None,
) -> None:
    """Check the options (ValueError/TypeError naming the argument) and set them on `rot`, a
    `Rotary` whose `pos_dim` and `head_dim` are already set."""
    check_choice("scaling", scaling, (None, "pi", "ntk", "yarn"))
    rot.scaling = scaling
    rot.train_length = (
        None
        if train_length is None
        else check_limit("train_length", check_float("train_length", train_length, strict=True))
    )
    rot.factor = (
        None
        if factor is None
        else check_limit("factor", check_float("factor", factor, minimum=1.0))
    )
    rot.yarn_alpha = check_float("yarn_alpha", yarn_alpha)
    rot.yarn_beta = check_limit("yarn_beta", check_float("yarn_beta", yarn_beta))
    if not rot.yarn_alpha < rot.yarn_beta:
        raise ValueError(f"yarn_alpha must be < yarn_beta, got {yarn_alpha} and {yarn_beta}")
    rot.xpos = check_bool("xpos", xpos)
    rot.xpos_scale_base = check_limit(
        "xpos_scale_base", check_float("xpos_scale_base", xpos_scale_base, strict=True)
    )
    rot.xpos_center = (
        None
        if xpos_center is None
        else check_limit(
            "xpos_center", check_float("xpos_center", xpos_center, minimum=-float("inf"))
        )
    )
    if xpos and rot.pos_dim != 1:
        raise ValueError(f"xpos applies to pos_dim=1 (1-D positions), got pos_dim={rot.pos_dim}")
    if scaling is None:
        for name, value in (("train_length", train_length), ("factor", factor)):
            if value is not None:
                raise ValueError(f"{name} applies with scaling ('pi', 'ntk', 'yarn'), got None")
        return
    if rot.pos_dim != 1:
        raise ValueError("scaling applies to pos_dim=1 (1-D positions), got pos_dim=2")
    if scaling == "ntk" and rot.head_dim < 4:
        raise ValueError(f"scaling='ntk' needs head_dim >= 4 (hd - 2 > 0), got {rot.head_dim}")
    if scaling == "yarn" and train_length is None:
        raise ValueError("train_length is required for scaling='yarn' (its ramp reads it)")
    if train_length is None and factor is None:
        raise ValueError(f"scaling={scaling!r} needs train_length (a factor per call) or factor")
