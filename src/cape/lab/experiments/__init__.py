"""Paper experiments: each is an `Experiment` (`cape.lab.experiments.base`) in a package of the
same layout (config, data, model, evaluate, report, experiment).

`EXPERIMENTS` maps a name to its `Experiment`; the `cape experiment/train/eval/plot` commands go
through it, so a new experiment is one more entry.
"""

from __future__ import annotations

from cape.lab.experiments.asr.experiment import ASR
from cape.lab.experiments.base import Experiment
from cape.lab.experiments.detection.experiment import DETECTION
from cape.lab.experiments.length.experiment import LENGTH
from cape.lab.experiments.lff_boxes.experiment import LFF_BOXES
from cape.lab.experiments.lff_generation.experiment import LFF_GENERATION
from cape.lab.experiments.lm.experiment import LM
from cape.lab.experiments.run_folders import slug
from cape.lab.experiments.study_config import merge, resolve_config
from cape.lab.experiments.translation.experiment import TRANSLATION
from cape.lab.experiments.vision.experiment import VISION

__all__ = ["Experiment", "EXPERIMENTS", "merge", "resolve_config", "slug"]

EXPERIMENTS: dict[str, Experiment] = {
    e.name: e for e in (VISION, LFF_GENERATION, LFF_BOXES, DETECTION, ASR, TRANSLATION, LENGTH, LM)
}
