"""The rows of `cape bench slowdown`: each label stands for a `cape.build` name and its options
(`ROWS`), with what a cell of the table changes in them (`row_position`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BenchRow", "ROWS", "ENCODINGS", "PEERS", "check_label", "row_position", "describe"]


@dataclass(frozen=True)
class BenchRow:
    """One row of the bench: the `cape.build` name and options its label stands for.

    cell: what the cell changes ("length": `num_positions` = the cell's length; "causal":
    no mean-normalisation in the decoder), "" when nothing.
    """

    position: str
    options: Mapping[str, Any] = field(default_factory=dict)
    cell: str = ""


ROWS: dict[str, BenchRow] = {
    "nopos": BenchRow("nopos"),
    "relpos-100": BenchRow("relpos", {"max_distance": 100}),
    "relpos-1000": BenchRow("relpos", {"max_distance": 1000}),
    "cape1d": BenchRow(
        "cape1d", {"preset": "text", "max_global_scaling": 1.1, "normalize": True}, "causal"
    ),
    "sinpos": BenchRow("sinpos"),
    "abspos": BenchRow("abspos", {}, "length"),
    "lff": BenchRow("lff", {"pos_dim": 1}),
    "rotary": BenchRow("rotary"),
    # the peers of the 2021 rows, timed on request (`--encodings nopos,sinpos,alibi,fire,xpos`):
    # two attention biases and xPos (rotary with its per-position scale, trained as such)
    "alibi": BenchRow("alibi"),
    "fire": BenchRow("fire"),
    "xpos": BenchRow("rotary", {"xpos": True}),
}
ENCODINGS = ("nopos", "relpos-100", "relpos-1000", "cape1d", "sinpos", "abspos", "lff", "rotary")
PEERS = ("alibi", "fire", "xpos")


def check_label(encoding: object) -> str:
    if encoding not in ROWS:
        raise ValueError(
            f"encoding must be one of the bench's labels {list(ROWS)}, got {encoding!r}"
        )
    return encoding  # type: ignore[return-value]


def row_position(encoding: str, kind: str, max_length: int) -> tuple[str, dict[str, Any]]:
    """The `cape.build` name and options of the label `encoding` in a `kind` model whose
    longest input is `max_length` tokens (`ROWS`, with what the cell changes)."""
    row = ROWS[check_label(encoding)]
    options = dict(row.options)
    if row.cell == "length":  # one table row per position of the cell
        options["num_positions"] = max_length
    elif row.cell == "causal" and kind == "decoder":
        # mean-normalisation looks at later tokens: a causal decoder must not use it
        options["normalize"] = False
    return row.position, options


def describe(encoding: str) -> str:
    """`label = name(options)`, as the module docstring and `--help` list the labels."""
    row = ROWS[check_label(encoding)]
    opts = [f"{k}={v!r}".replace("'", '"') for k, v in row.options.items()]
    if row.cell == "length":
        opts.append("num_positions=<the cell's length>")
    return f"{encoding} = {row.position}" + (f"({', '.join(opts)})" if opts else "")
