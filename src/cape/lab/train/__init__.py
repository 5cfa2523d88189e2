"""Training engine: one loop (DDP, bf16, accumulation, exact resume) for every experiment."""

from cape.lab.train.checkpoint import (
    get_rng_state,
    is_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    load_state,
    pick_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from cape.lab.train.config import TrainConfig
from cape.lab.train.distributed import (
    DistInfo,
    all_reduce_mean,
    barrier,
    cleanup,
    get_rank,
    get_world_size,
    init_distributed,
    is_main,
)
from cape.lab.train.engine import Trainer
from cape.lab.train.logging import MetricsLogger, progress, run_info
from cape.lab.train.optim import build_optimizer, build_scheduler, lr_factor
from cape.lab.train.sampler import ResumableBatchSampler, ResumableSampler
from cape.lab.train.seeding import seed_everything, set_deterministic

__all__ = [
    "TrainConfig",
    "Trainer",
    "ResumableSampler",
    "ResumableBatchSampler",
    "seed_everything",
    "set_deterministic",
    "run_info",
    "build_optimizer",
    "build_scheduler",
    "lr_factor",
    "save_checkpoint",
    "load_checkpoint",
    "load_state",
    "latest_checkpoint",
    "pick_checkpoint",
    "is_checkpoint",
    "get_rng_state",
    "set_rng_state",
    "MetricsLogger",
    "progress",
    "DistInfo",
    "init_distributed",
    "all_reduce_mean",
    "barrier",
    "cleanup",
    "get_rank",
    "get_world_size",
    "is_main",
]
