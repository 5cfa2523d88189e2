"""Seeding and deterministic mode: what makes a run (and its resume) repeat to the bit."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["seed_everything", "set_deterministic"]


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (all devices). Call it, then build the model, so that every
    rank initialises identical weights (DDP broadcasts rank 0's anyway)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_deterministic(enabled: bool = True) -> None:
    """Deterministic kernels only (errors on ops without one); needed for bitwise resume."""
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.benchmark = not enabled
    torch.backends.cudnn.deterministic = enabled
