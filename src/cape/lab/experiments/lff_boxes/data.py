"""The LFF boxes experiment's data: screens of boxes, every split (`make_data`)."""

from __future__ import annotations

import dataclasses

from cape.lab.data.boxes import Screens, make_splits
from cape.lab.experiments.lff_boxes.config import LffBoxesConfig

__all__ = ["make_data"]


def make_data(cfg: LffBoxesConfig) -> dict[str, Screens]:
    """The screens of every split (`cape.lab.data.boxes.make_splits`; generated, not cached)."""
    return make_splits(**dataclasses.asdict(cfg.data))  # the DataConfig fields are its arguments
