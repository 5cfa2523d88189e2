"""The LFF boxes experiment's data: screens of boxes, every split (`make_data`)."""

from __future__ import annotations

from cape.lab.data.boxes import Screens, make_splits
from cape.lab.experiments.lff_boxes.config import LffBoxesConfig

__all__ = ["make_data"]


def make_data(cfg: LffBoxesConfig) -> dict[str, Screens]:
    """The screens of every split (`cape.lab.data.boxes.make_splits`; generated, not cached)."""
    d = cfg.data
    return make_splits(
        d.train,
        d.val,
        d.test,
        seed=d.seed,
        canvas=d.canvas,
        min_boxes=d.min_boxes,
        max_boxes=d.max_boxes,
        max_size=d.max_size,
        plant=d.plant,
    )
