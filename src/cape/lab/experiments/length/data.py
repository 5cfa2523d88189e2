"""The length experiment's data: uniform random tokens, every split (`make_data`)."""

from __future__ import annotations

from cape.lab.data.text.lookup import Splits, make_splits
from cape.lab.experiments.length.config import LengthConfig

__all__ = ["make_data"]


def make_data(cfg: LengthConfig) -> Splits:
    """The sequences of every split (`cape.lab.data.text.lookup.make_splits`; made, not cached:
    a second or so)."""
    d = cfg.data
    return make_splits(
        d.train,
        d.val,
        cfg.eval.test,
        cfg.eval.lengths,
        vocab=d.vocab,
        offset=d.offset,
        min_len=d.min_len,
        max_len=d.max_len,
        seed=d.seed,
    )
