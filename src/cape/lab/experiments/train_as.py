"""Rows that evaluate another row's weights: `train_as` names the row whose trained weights a row
evaluates, and `eval_options` change its encoding at evaluation only (RoPE's PI, NTK or YaRN
chosen at inference from the training length). Shared by the experiments whose rows take them."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cape.lab.experiments.study_config import check_position, row_key

__all__ = [
    "ReusableRow",
    "check_reuse_fields",
    "check_train_as",
    "trained_row",
    "evaluation_model",
    "seeded_evaluation",
]


@dataclass
class ReusableRow:
    """The fields first in a row whose weights other rows may reuse (the length and translation
    experiments' `RowConfig`): its name, `position` (a `cape.build` name) with `options`, then
    `eval_options` and `train_as` as above. Subclasses add their own fields and checks."""

    name: str = ""
    position: str = ""
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    eval_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    train_as: str | None = None

    def check_fields(self) -> str:
        """Check these fields (`position` stored lower-case) -> `rows[<name>]`, the prefix of
        the subclass's own errors."""
        key = row_key(self.name)
        self.position = check_position(f"{key}.position", self.position)
        if not isinstance(self.options, dict):
            raise ValueError(f"{key}.options must be a mapping, got {self.options!r}")
        check_reuse_fields(key, self)
        return key


def check_reuse_fields(key: str, row: Any) -> None:
    """ValueError naming `key` unless `row.eval_options` is a mapping and `row.train_as` a row
    name or None."""
    if not isinstance(row.eval_options, dict):
        raise ValueError(f"{key}.eval_options must be a mapping, got {row.eval_options!r}")
    if row.train_as is not None and not isinstance(row.train_as, str):
        raise ValueError(f"{key}.train_as must be a row name or null, got {row.train_as!r}")


def check_train_as(rows: Sequence[Any], same: Sequence[str] = ()) -> None:
    """Every `train_as` names an earlier row that trains its own weights, with the same
    `position` and the fields in `same` (those that shape the trained model), while the row's
    own `options` stay empty (its weights were trained with the other row's); ValueError
    naming the row otherwise."""
    by_name = {r.name: r for r in rows}
    for i, row in enumerate(rows):
        if row.train_as is None:
            continue
        key = f"rows[{row.name}]"
        earlier = [r.name for r in rows[:i] if r.train_as is None]
        if row.train_as not in earlier:
            raise ValueError(
                f"{key}.train_as must name an earlier row that trains its own weights "
                f"(one of {earlier}), got {row.train_as!r}"
            )
        source = by_name[row.train_as]
        for field in ("position", *same):
            if getattr(source, field) != getattr(row, field):
                raise ValueError(
                    f"{key}.{field} must be that of its train_as row {source.name!r} "
                    f"({getattr(source, field)!r}), got {getattr(row, field)!r}"
                )
        if row.options:
            raise ValueError(
                f"{key}.options must be empty with train_as (the weights are {source.name!r}'s, "
                f"trained with its options): put evaluation changes in eval_options"
            )


def trained_row(rows: Sequence[Any], row: Any) -> Any:
    """The row whose weights `row` evaluates: the one its `train_as` names, else itself."""
    if row.train_as is None:
        return row
    return next(r for r in rows if r.name == row.train_as)


def evaluation_model(row: Any, trained: nn.Module, make: Callable[[], nn.Module]) -> nn.Module:
    """`trained` itself when the row has no `eval_options`, else `make()` (the row's model with
    them) holding `trained`'s weights: strict loading, so the options must not change which
    parameters the encodings hold."""
    if not row.eval_options:
        return trained
    evaluator = make()
    evaluator.load_state_dict(trained.state_dict(), strict=True)
    device = next(trained.parameters()).device
    return evaluator.to(device).train(trained.training)


@contextlib.contextmanager
def seeded_evaluation(seed: int, device: Any) -> Iterator[None]:
    """An evaluation whose positions are drawn (randomized positions' `sample_at_eval`) draws
    from `seed`, whatever ran before it: a resumed run evaluates as a fresh one. The global
    generators (the CPU's, and the device's on CUDA) are as they were afterwards."""
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
