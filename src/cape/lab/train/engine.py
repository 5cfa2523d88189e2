"""`Trainer`: one training loop for every experiment, resumable to the bit.

Data order comes from `ResumableSampler` (seed + epoch, sharded by rank), augmentation from the
global RNGs seeded with seed + rank; both are checkpointed, so a resumed run repeats exactly
what the uninterrupted run would have done (CPU, deterministic mode).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from cape.lab.errors import DamagedFile, Preempted, UsageError
from cape.lab.io import set_aside
from cape.lab.progress import StepLines
from cape.lab.train import distributed as D
from cape.lab.train import preempt
from cape.lab.train.checkpoint import (
    get_rng_state,
    load_checkpoint,
    read_checkpoint,
    resume_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from cape.lab.train.config import TrainConfig
from cape.lab.train.lock import locked_folder
from cape.lab.train.logging import MetricsLogger, progress, write_run_record
from cape.lab.train.optim import build_optimizer, build_scheduler
from cape.lab.train.sampler import ResumableBatchSampler, ResumableSampler
from cape.lab.train.seeding import seed_everything, set_deterministic

__all__ = ["Trainer"]

LossFn = Callable[[nn.Module, Any], tuple[torch.Tensor, dict[str, float]]]
EvalFn = Callable[[nn.Module], dict[str, float]]


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


class Trainer:
    """Train `model` on `train_data` with `loss_fn(model, batch) -> (loss, metrics)`.

    `eval_fn(model) -> metrics` runs every `eval_every` steps under `no_grad` (on every rank; its
    metrics are averaged over ranks). `on_step_end(trainer, step, metrics)` runs after each
    optimiser step, after that step's logging and checkpointing; `metrics` holds that step's
    values as the loss function gave them (tensors stay on the device: no host sync per step
    unless a metric is logged, every `log_every` steps). Under torchrun the model is
    wrapped in DDP; only rank 0 writes to `run_dir`, holding its lock during `fit` (a second
    process on the same folder gets `RunFolderBusy`). Build the model after `seed_everything`.

    SIGTERM or SIGUSR1 during `fit` (a cluster's preemption) stops it at the end of the current
    step, every rank at the same one: that step is checkpointed and `fit` raises `Preempted`
    (`cape` exits 75); `fit(resume=True)` continues bit-exactly (`cape.lab.train.preempt`).

    Exact resume covers RNG draws in the main process (loss_fn, collate_fn with num_workers=0);
    draws inside DataLoader workers are seeded per epoch iterator, not checkpointed.

    `batches`: an epoch-wise batch sampler (`all_batches(epoch)`, `rank`, `world_size`, as
    `cape.lab.data.DurationBatchSampler`) that forms the batches instead of `config.batch_size`
    random samples; the position within its epoch is checkpointed the same way.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        train_data: Dataset,
        eval_fn: EvalFn | None,
        config: TrainConfig,
        run_dir: str | Path,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        *,
        on_step_end: Callable[[Trainer, int, dict[str, float]], None] | None = None,
        experiment: dict[str, Any] | None = None,
        batches: Any = None,
    ) -> None:
        self.cfg, self.loss_fn, self.eval_fn = config, loss_fn, eval_fn
        self.on_step_end, self.experiment = on_step_end, experiment or {}
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.dist = D.init_distributed(config.device)
        self.device = self.dist.device
        if config.deterministic:
            set_deterministic(True)
        self.model = model.to(self.device)
        self.ddp: nn.Module = self.model
        if self.dist.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=ids)
        self.optimizer = build_optimizer(self.model, config)
        self.scheduler = build_scheduler(self.optimizer, config)
        # A private generator: creating a DataLoader iterator would otherwise consume the global
        # RNG, and a resumed run creates one at a point where the original did not.
        self._loader_gen = torch.Generator().manual_seed(config.seed + self.dist.rank)
        common = dict(
            collate_fn=collate_fn,
            num_workers=config.num_workers,
            generator=self._loader_gen,
            pin_memory=self.device.type == "cuda",
        )
        if batches is not None:  # the caller forms the batches (e.g. by duration)
            self.sampler: ResumableSampler | ResumableBatchSampler = ResumableBatchSampler(batches)
            if not self.sampler.shard():
                raise ValueError("batches gives this rank no batch in epoch 0")
            self._per_batch = 1
            self.loader = DataLoader(train_data, batch_sampler=self.sampler, **common)
        else:
            self.sampler = ResumableSampler(
                len(train_data),
                num_replicas=self.dist.world_size,
                rank=self.dist.rank,
                seed=config.seed,
            )
            if len(self.sampler.shard()) < config.batch_size:
                raise ValueError(
                    f"batch_size={config.batch_size} exceeds this rank's "
                    f"{len(self.sampler.shard())} samples per epoch"
                )
            self._per_batch = config.batch_size
            self.loader = DataLoader(
                train_data,
                batch_size=config.batch_size,
                sampler=self.sampler,
                drop_last=True,
                **common,
            )
        self._it: Iterator[Any] | None = None
        self.step = 0
        self.best: float | None = None
        self.logger = MetricsLogger(self.run_dir, enabled=self.dist.rank == 0)
        self.times = {"data": 0.0, "compute": 0.0, "log": 0.0, "checkpoint": 0.0, "eval": 0.0}
        # the last logged metrics: checkpointed with the times, so that the summary of a resumed
        # run covers every session, even one that had nothing left to train
        self.last_train: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}
        # Augmentation differs per rank; model init (seeded by the caller) does not.
        seed_everything(config.seed + self.dist.rank)

    # -- data ---------------------------------------------------------------------------------
    def _next_batch(self) -> Any:
        if self._it is None:
            self._it = iter(self.loader)
        try:
            batch = next(self._it)
        except StopIteration:  # epoch over: the next epoch reshuffles with seed + epoch
            self.sampler.set_epoch(self.sampler.epoch + 1)
            self._it = iter(self.loader)
            batch = next(self._it)
        self.sampler.advance(self._per_batch)
        return _to_device(batch, self.device)

    # -- checkpoints ----------------------------------------------------------------------------
    def _extra(self) -> dict[str, Any]:
        return {
            "sampler": self.sampler.state_dict(),
            "best": self.best,
            "times": dict(self.times),
            "last_train": dict(self.last_train),
            "last_eval": dict(self.last_eval),
        }

    def save(self, name: str | None = None) -> None:
        """Checkpoint on rank 0 with every rank's RNG state (a collective: call on all ranks)."""
        rngs = D.all_gather_object(get_rng_state())
        if self.dist.rank == 0:
            save_checkpoint(
                self.ckpt_dir,
                self.step,
                self.model,
                self.optimizer,
                self.scheduler,
                self._extra(),
                name=name,
                rng=rngs,
                keep_last=self.cfg.keep_last,
            )
        D.barrier()

    def resume(self) -> bool:
        """Load the newest intact checkpoint of `run_dir`, if any; True when one was loaded.
        Rank 0 chooses (damaged ones are set aside, `resume_checkpoint`) and tells the others
        (a collective). A damaged best/ is set aside too, and the next evaluation saves anew."""
        found, best_lost = None, False
        if self.dist.rank == 0:
            found = resume_checkpoint(self.ckpt_dir)
            best_lost = self._set_aside_damaged_best()
        name, best_lost = D.all_gather_object((found[0].name if found else None, best_lost))[0]
        if name is None:
            return False
        read = found[1:] if found is not None else None
        try:
            state = load_checkpoint(
                self.ckpt_dir / name, self.model, self.optimizer, self.scheduler, read=read
            )
        except RuntimeError as e:  # load_state_dict: names or shapes of another model
            lines = [ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()] or [str(e)]
            raise UsageError(
                f"{self.ckpt_dir / name} holds the weights of another model "
                f"({lines[0].split(';')[0]}): the run was trained with other settings; use "
                f"another --out folder, or delete {self.ckpt_dir.parent} to train it again"
            ) from e
        self.step = state["step"]
        self.sampler.load_state_dict(state["extra"]["sampler"])
        self.best = None if best_lost else state["extra"]["best"]
        self.times.update(state["extra"].get("times", {}))  # none recorded: counted from zero
        self.last_train = dict(state["extra"].get("last_train", {}))
        self.last_eval = dict(state["extra"].get("last_eval", {}))
        self._it = None
        rngs = state["rng"]
        if len(rngs) == self.dist.world_size:
            set_rng_state(rngs[self.dist.rank])
        else:  # another world size: exact resume is impossible, stay reproducible anyway
            seed_everything(self.cfg.seed + self.dist.rank + 1_000_003 * self.step)
        return True

    def _set_aside_damaged_best(self) -> bool:
        best = self.ckpt_dir / "best"
        if not best.exists():
            return False
        try:
            read_checkpoint(best)
        except DamagedFile as e:
            set_aside(best, f"{e}; the next evaluation saves a new best")
            return True
        return False

    # -- loop -----------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16"
        )

    def _train_step(self) -> dict[str, Any]:
        cfg, sums = self.cfg, {}
        self.optimizer.zero_grad(set_to_none=True)
        for micro in range(cfg.grad_accum):
            t0 = time.perf_counter()
            batch = self._next_batch()
            t1 = time.perf_counter()
            self.times["data"] += t1 - t0
            last = micro == cfg.grad_accum - 1
            # Gradients are all-reduced once, on the last micro-batch.
            sync = (
                self.ddp.no_sync()
                if isinstance(self.ddp, DistributedDataParallel) and not last
                else contextlib.nullcontext()
            )
            with sync:
                with self._autocast():
                    loss, metrics = self.loss_fn(self.ddp, batch)
                (loss / cfg.grad_accum).backward()
            for k, v in {"loss": loss.detach(), **metrics}.items():
                # tensors stay on the device: float() here would wait for the GPU every step;
                # fit() converts them only on the steps it logs
                v = v.detach() if isinstance(v, torch.Tensor) else float(v)
                sums[k] = sums.get(k, 0.0) + v / cfg.grad_accum
            self.times["compute"] += time.perf_counter() - t1
        t2 = time.perf_counter()
        if cfg.clip_norm is not None:
            sums["grad_norm"] = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), cfg.clip_norm
            )
        sums["lr"] = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        self.times["compute"] += time.perf_counter() - t2
        return sums

    def evaluate(self) -> dict[str, float]:
        """`eval_fn` in eval mode, without gradients, averaged over ranks."""
        assert self.eval_fn is not None
        self.model.eval()
        try:
            with torch.no_grad(), self._autocast():
                metrics = self.eval_fn(self.model)
        finally:
            self.model.train()
        return D.all_reduce_mean({k: float(v) for k, v in metrics.items()})

    def _is_better(self, value: float) -> bool:
        if self.best is None:
            return True
        return value < self.best if self.cfg.best_mode == "min" else value > self.best

    def fit(self, resume: bool = False) -> dict[str, float]:
        """Train to `cfg.steps`. Returns the last train metrics (all-reduced), the last eval
        metrics as `eval_<name>`, `step`, seconds per category and `engine_overhead`: the
        fraction of loop time spent on data, logging and checkpoints rather than compute. A
        resumed run's metrics and seconds include the sessions before (from its checkpoint).
        Logged rows of the steps trained again (after the checkpoint) are dropped first."""
        with locked_folder(self.run_dir), preempt.catching_stop_signals():
            return self._fit(resume)

    def _fit(self, resume: bool) -> dict[str, float]:
        cfg = self.cfg
        if self.dist.rank == 0:
            write_run_record(self.run_dir, {"train": cfg.to_dict(), "experiment": self.experiment})
        if resume:
            self.resume()
        self.logger.truncate(self.step)
        self.model.train()
        run = self.experiment  # which run of a study the lines are about, when it says
        where = f" {run['row']} seed{run['seed']}" if {"row", "seed"} <= set(run) else ""
        lines = StepLines(cfg.steps, self.step, f"train{where}", every=cfg.progress_every)
        for _ in progress(range(self.step, cfg.steps), total=cfg.steps - self.step, desc="train"):
            metrics = self._train_step()
            step, final = self.step, self.step == cfg.steps
            lines.update(step, metrics.get("loss"))  # off a terminal, every progress_every s
            t0 = time.perf_counter()
            if (cfg.log_every and step % cfg.log_every == 0) or final:
                self.last_train = D.all_reduce_mean(metrics)
                self.logger.log(step, self.last_train, "train")
            t1 = time.perf_counter()
            self.times["log"] += t1 - t0
            if (
                self.eval_fn is not None
                and cfg.eval_every
                and (step % cfg.eval_every == 0 or final)
            ):
                eval_m = self.last_eval = self.evaluate()
                self.logger.log(step, eval_m, "eval")
                t2 = time.perf_counter()
                self.times["eval"] += t2 - t1
                if cfg.best_metric not in eval_m:
                    raise KeyError(
                        f"best_metric {cfg.best_metric!r} not in eval metrics {sorted(eval_m)}"
                    )
                if self._is_better(eval_m[cfg.best_metric]):
                    self.best = eval_m[cfg.best_metric]
                    self.save(name="best")
                self.times["checkpoint"] += time.perf_counter() - t2
            t3 = time.perf_counter()
            saved = bool(cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or final))
            if saved:
                self.save()
            self.times["checkpoint"] += time.perf_counter() - t3
            if self.on_step_end is not None:
                self.on_step_end(self, step, metrics)
            self._stop_if_signalled(saved)
        self.logger.close()
        return self._summary(self.last_train, self.last_eval)

    def _stop_if_signalled(self, saved: bool) -> None:
        """At a step's end: when any rank caught SIGTERM/SIGUSR1 (`preempt`), checkpoint this
        step (unless just saved) and raise `Preempted` naming it; a collective under DDP."""
        signum = preempt.agreed()
        if not signum:
            return
        t0 = time.perf_counter()
        if not saved:
            self.save()
        self.times["checkpoint"] += time.perf_counter() - t0
        self.logger.close()
        where = self.ckpt_dir / f"step_{self.step:08d}"
        raise Preempted(
            f"stopped by {preempt.signal_name(signum)} after step {self.step} of "
            f"{self.cfg.steps}, saved in {where}; run the same command again to resume",
            rank=self.dist.rank,
        )

    def _summary(self, train_m: dict[str, float], eval_m: dict[str, float]) -> dict[str, float]:
        t = self.times
        overhead = t["data"] + t["log"] + t["checkpoint"]
        total = overhead + t["compute"]
        out = dict(train_m)
        out.update({f"eval_{k}": v for k, v in eval_m.items()})
        if self.best is not None:  # the kept checkpoint's value, which the last eval may not be
            out[f"best_eval_{self.cfg.best_metric}"] = self.best
        out["step"] = float(self.step)
        out.update({f"time_{k}": v for k, v in t.items()})
        out["engine_overhead"] = overhead / total if total > 0 else 0.0
        return out
