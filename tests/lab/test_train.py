"""cape.lab.train: schedules, config errors, checkpoints, exact resume after SIGKILL, 2-rank DDP."""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import TensorDataset

from cape.lab.config import from_mapping
from cape.lab.errors import DamagedFile
from cape.lab.train import (
    ResumableSampler,
    TrainConfig,
    Trainer,
    build_optimizer,
    build_scheduler,
    get_rng_state,
    latest_checkpoint,
    load_checkpoint,
    load_state,
    save_checkpoint,
    seed_everything,
    set_rng_state,
)

# -- a tiny regression task ---------------------------------------------------------------------


def _task(n: int = 96) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y), x, y


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):
    x, t = batch
    x = x + 0.05 * torch.randn_like(x)  # augmentation: drawn from the global RNG
    loss = F.mse_loss(model(x), t)
    return loss, {}


def test_tiny_regression_loss_decreases_and_run_dir_is_recorded(tmp_path: Path) -> None:
    data, x, y = _task()
    seed_everything(0)
    model = _mlp()
    before = F.mse_loss(model(x), y).item()
    cfg = TrainConfig(
        steps=60, batch_size=16, lr=1e-2, warmup_steps=5, eval_every=20, checkpoint_every=20, seed=0
    )
    trainer = Trainer(
        model,
        _loss,
        data,
        lambda m: {"loss": F.mse_loss(m(x), y).item()},
        cfg,
        tmp_path / "run",
        experiment={"model": "mlp"},
    )
    out = trainer.fit()
    assert out["eval_loss"] < 0.3 * before
    assert out["step"] == 60 and 0.0 <= out["engine_overhead"] < 1.0
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 60
    assert json.loads((run / "config.json").read_text())["experiment"] == {"model": "mlp"}
    env = json.loads((run / "env.json").read_text())
    assert env["packages"]["torch"] and "argv" in env and "git_commit" in env
    assert "git_changed" in env and "git_changed_count" in env
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == list(range(1, 61))
    # the summary carries the kept checkpoint's value as well as the last eval's
    evals = [r["loss"] for r in rows if r["split"] == "eval"]
    assert len(evals) == 3 and out["best_eval_loss"] == pytest.approx(min(evals))
    assert out["eval_loss"] == pytest.approx(evals[-1])
    assert (run / "metrics_train.csv").read_text().splitlines()[0].startswith("step,split,loss")
    assert (run / "checkpoints" / "best" / "model.safetensors").exists()
    assert latest_checkpoint(run / "checkpoints").name == "step_00000060"


def test_summary_of_a_resumed_run_covers_every_session(tmp_path: Path) -> None:
    data, x, y = _task()
    cfg = TrainConfig(steps=20, batch_size=16, eval_every=10, checkpoint_every=10, seed=0)

    def trainer(steps: int) -> Trainer:
        seed_everything(0)
        return Trainer(
            _mlp(),
            _loss,
            data,
            lambda m: {"loss": F.mse_loss(m(x), y).item()},
            TrainConfig(**{**cfg.to_dict(), "steps": steps}),
            tmp_path / "run",
        )

    first = trainer(10).fit()  # session 1: steps 1-10
    second = trainer(20).fit(resume=True)  # session 2: steps 11-20
    assert second["time_compute"] > first["time_compute"] > 0  # both sessions counted
    done = trainer(20).fit(resume=True)  # session 3: nothing left to train
    for key in ("eval_loss", "loss", "step", "time_compute", "time_data"):
        assert done[key] == pytest.approx(second[key]), key
    # the checkpoint holds the times up to its own writing, which it cannot count
    for key in ("time_log", "time_checkpoint"):
        assert 0 < done[key] <= second[key], key
    other = done["time_data"] + done["time_log"] + done["time_checkpoint"]
    assert done["engine_overhead"] == pytest.approx(other / (other + done["time_compute"]))


def test_bf16_and_grad_accum_and_adagrad_run(tmp_path: Path) -> None:
    data, _, _ = _task()
    seed_everything(0)
    cfg = TrainConfig(
        steps=4,
        batch_size=8,
        grad_accum=3,
        precision="bf16",
        optimizer="adagrad",
        schedule="inverse_sqrt",
        clip_norm=None,
    )
    out = Trainer(_mlp(), _loss, data, None, cfg, tmp_path).fit()
    assert math.isfinite(out["loss"]) and out["step"] == 4


def _tb_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_metrics_logger_writes_tensorboard_events_read_back_exactly(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from cape.lab.train import MetricsLogger

    logger = MetricsLogger(tmp_path, enabled=True)
    train = {s: {"loss": 1.0 / s, "lr": 1e-3 * s} for s in range(1, 6)}
    for step, metrics in train.items():
        logger.log(step, metrics, "train")
    logger.log(5, {"acc": 0.75}, "eval")
    logger.close()  # flushes and closes the writer: everything is on disk now
    got = _tb_scalars(logger.tensorboard_dir)
    assert sorted(got) == ["eval/acc", "train/loss", "train/lr"]
    for name in ("loss", "lr"):  # events store float32
        assert [s for s, _ in got[f"train/{name}"]] == list(train)
        assert [v for _, v in got[f"train/{name}"]] == pytest.approx(
            [m[name] for m in train.values()], rel=1e-6
        )
    assert got["eval/acc"] == [(5, 0.75)]
    # a resumed run truncates to its checkpoint's step: repeated steps replace the old events
    logger.truncate(3)
    for step in (4, 5):
        logger.log(step, {"loss": 10.0 * step, "lr": 0.5}, "train")
    logger.close()
    got = _tb_scalars(logger.tensorboard_dir)
    assert got["train/loss"] == [
        (1, 1.0),
        (2, 0.5),
        (3, pytest.approx(1 / 3)),
        (4, 40.0),
        (5, 50.0),
    ]


def test_engine_times_account_for_the_loop(tmp_path: Path) -> None:
    """Each category's seconds are counted and `engine_overhead` is their non-compute share.

    The < 5% target itself is measured by `cape bench train`, not here: timings in unit tests
    depend on what else the machine runs.
    """
    x, y = torch.randn(64, 8, 16), torch.randn(64, 8, 16)
    seed_everything(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    cfg = TrainConfig(steps=6, batch_size=8, checkpoint_every=3, log_every=1)

    def loss(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]):
        return F.mse_loss(m(b[0]), b[1]), {}

    t0 = time.perf_counter()
    out = Trainer(model, loss, TensorDataset(x, y), None, cfg, tmp_path).fit()
    wall = time.perf_counter() - t0
    cats = {k: out[f"time_{k}"] for k in ("data", "compute", "log", "checkpoint")}
    assert all(v > 0 for v in cats.values()), cats  # every category was timed
    assert sum(cats.values()) <= wall
    other = cats["data"] + cats["log"] + cats["checkpoint"]
    assert out["engine_overhead"] == pytest.approx(other / sum(cats.values()))


def _lrs(cfg: TrainConfig) -> list[float]:
    opt = build_optimizer(nn.Linear(2, 2), cfg)
    sched = build_scheduler(opt, cfg)
    lrs = []
    for _ in range(cfg.steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def test_schedules_match_closed_forms() -> None:
    w, total, lr = 10, 100, 0.5
    cos = _lrs(TrainConfig(steps=total, lr=lr, warmup_steps=w, schedule="cosine"))
    for s in (0, 4, 9, 10, 37, 99):
        t = (s - w) / (total - w)
        expect = lr * (s + 1) / w if s < w else lr * 0.5 * (1 + math.cos(math.pi * t))
        assert cos[s] == pytest.approx(expect, rel=1e-12)
    inv = _lrs(TrainConfig(steps=total, lr=lr, warmup_steps=w, schedule="inverse_sqrt"))
    for s in (0, 9, 10, 50, 99):
        expect = lr * (s + 1) / w if s < w else lr * math.sqrt(w / (s + 1))
        assert inv[s] == pytest.approx(expect, rel=1e-12)
    const = _lrs(TrainConfig(steps=20, lr=lr, warmup_steps=4, schedule="constant"))
    assert const[1] == pytest.approx(lr / 2) and const[4:] == pytest.approx([lr] * 16)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"optimizer": "sgd"}, "optimizer"),
        ({"schedule": "linear"}, "schedule"),
        ({"precision": "fp16"}, "precision"),
        ({"steps": 0}, "steps"),
        ({"grad_accum": -1}, "grad_accum"),
        ({"lr": 0.0}, "lr"),
        ({"clip_norm": -1.0}, "clip_norm"),
        ({"best_mode": "low"}, "best_mode"),
    ],
)
def test_config_errors_name_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=rf"train\.{key} must"):
        TrainConfig(**kwargs)
    with pytest.raises(ValueError, match=rf"train\.{key} must"):
        from_mapping(TrainConfig, kwargs, "train.")


def test_train_mapping_goes_through_from_mapping() -> None:
    # the same messages as every other config section: the dotted key and what is allowed
    with pytest.raises(ValueError, match=r"train\.lr must be a number, got 'x'"):
        from_mapping(TrainConfig, {"lr": "x"}, "train.")
    with pytest.raises(
        ValueError,
        match=r"unknown config key\(s\) \['train\.stepz'\]; allowed under "
        r"train: \[.*'steps'",
    ):
        from_mapping(TrainConfig, {"stepz": 3}, "train.")
    with pytest.raises(ValueError, match=r"train\.optimizer must be one of \['adamw', 'adagrad'\]"):
        from_mapping(TrainConfig, {"optimizer": "sgd"}, "train.")
    with pytest.raises(ValueError, match="train.deterministic must be true or false"):
        from_mapping(TrainConfig, {"deterministic": 1}, "train.")
    with pytest.raises(ValueError, match="train.steps must be an integer"):
        from_mapping(TrainConfig, {"steps": 2.5}, "train.")
    cfg = from_mapping(TrainConfig, {"lr": 1, "clip_norm": None, "precision": "bf16"}, "train.")
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and cfg.clip_norm is None
    assert from_mapping(TrainConfig, cfg.to_dict(), "train.") == cfg


def test_resumable_sampler_shards_and_resumes_mid_epoch() -> None:
    shards = [ResumableSampler(10, num_replicas=3, rank=r, seed=1).shard() for r in range(3)]
    assert set(sum(shards, [])) == set(range(10)) and [len(s) for s in shards] == [4, 4, 4]
    s = ResumableSampler(10, seed=1)
    first = list(s)
    s.advance(4)
    t = ResumableSampler(10, seed=1)
    t.load_state_dict(s.state_dict())
    assert list(t) == first[4:]
    t.set_epoch(1)
    assert list(t) != first and sorted(t) == list(range(10))


# -- checkpoints --------------------------------------------------------------------------------


class _Evil:
    """Unpickling this would create a file: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoint_round_trip_restores_everything(tmp_path: Path) -> None:
    seed_everything(0)
    model = _mlp()
    cfg = TrainConfig(steps=10, warmup_steps=3, weight_decay=0.1)
    opt, sched = build_optimizer(model, cfg), build_scheduler(build_optimizer(model, cfg), cfg)
    opt = sched.optimizer
    for _ in range(3):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        sched.step()
    path = save_checkpoint(tmp_path, 3, model, opt, sched, {"sampler": {"epoch": 1, "index": 5}})
    draws = (torch.rand(3), np.random.rand(), random.random())

    seed_everything(123)
    other = _mlp()
    opt2 = build_optimizer(other, cfg)
    sched2 = build_scheduler(opt2, cfg)
    state = load_checkpoint(latest_checkpoint(tmp_path), other, opt2, sched2)
    assert path == latest_checkpoint(tmp_path)
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(opt.state.values(), opt2.state.values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    assert sched2.last_epoch == 3 and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert state["step"] == 3 and state["extra"]["sampler"] == {"epoch": 1, "index": 5}
    set_rng_state(state["rng"])
    again = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(draws[0], again[0]) and draws[1:] == again[1:]
    assert set(load_file(str(path / "model.safetensors"))) == set(model.state_dict())


def test_pickled_code_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "ckpt" / "step_00000001"
    save_checkpoint(tmp_path / "ckpt", 1, _mlp())
    torch.save({"step": 1, "rng": _Evil(str(marker))}, evil / "state.pt")
    with pytest.raises(pickle.UnpicklingError):
        load_state(evil / "state.pt")
    # a checkpoint refused so is damaged for the engine: named, never half loaded
    with pytest.raises(DamagedFile, match=r"step_00000001/state\.pt is damaged \(refused by wei"):
        load_checkpoint(evil, _mlp())
    assert not marker.exists()


def test_keep_last_and_atomic_layout(tmp_path: Path) -> None:
    model = _mlp()
    for step in (5, 10, 15, 20):
        save_checkpoint(tmp_path, step, model, keep_last=2)
    save_checkpoint(tmp_path, 20, model, name="best")
    save_checkpoint(tmp_path, 20, model, keep_last=2)  # same step again (after a resume)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["best", "latest", "step_00000015", "step_00000020"]
    assert (tmp_path / "latest").read_text().strip() == "step_00000020"
    assert get_rng_state()["torch"].dtype == torch.uint8


# -- subprocesses: exact resume and DDP ---------------------------------------------------------

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    import torch, torch.nn.functional as F
    from torch import nn
    from torch.utils.data import TensorDataset
    from safetensors.torch import save_file
    from cape.lab.train import Trainer, TrainConfig, seed_everything, get_rank, cleanup

    torch.set_num_threads(1)
    mode, run_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
    kill_at, steps = int(sys.argv[4]), int(sys.argv[5])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(96, 1, generator=g)
    seed_everything(1)  # then build the model: same init on every rank
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 1))

    def loss_fn(m, batch):
        xb, t = batch
        xb = xb + 0.05 * torch.randn_like(xb)  # augmentation
        pred = m(xb)
        return F.mse_loss(pred, t), {"mae": (pred - t).abs().mean().item()}

    def eval_fn(m):
        return {"loss": F.mse_loss(m(x), y).item()}

    def hook(trainer, step, metrics):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    cfg = TrainConfig(steps=steps, batch_size=16, grad_accum=2, lr=1e-2, warmup_steps=5,
                      eval_every=10, checkpoint_every=5, keep_last=2, seed=3, deterministic=True)
    rank = int(os.environ.get("RANK", "0"))
    if mode == "ddp":
        run_dir = os.path.join(run_dir, f"rank{rank}")  # rank 1's must stay empty
        from cape.lab.errors import RunFolderBusy
        try:  # a folder another process holds: every rank stops, none waits on rank 0
            Trainer(nn.Linear(8, 1), loss_fn, TensorDataset(x, y), None, cfg, out + "/busy").fit()
        except RunFolderBusy as e:
            with open(os.path.join(out, f"busy{rank}.txt"), "w") as f:
                f.write(str(e))
    trainer = Trainer(model, loss_fn, TensorDataset(x, y), eval_fn, cfg, run_dir, on_step_end=hook)
    if mode == "ddp":
        with open(os.path.join(out, f"aug{get_rank()}.json"), "w") as f:
            json.dump(torch.rand(3).tolist(), f)
    final = trainer.fit(resume=(mode == "resume"))
    final = {k: v for k, v in final.items() if not k.startswith("time_") and k != "engine_overhead"}
    tag = f"{mode}{rank}"
    with open(os.path.join(out, f"final_{tag}.json"), "w") as f:
        json.dump(final, f)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              os.path.join(out, f"weights_{tag}.safetensors"))
    cleanup()
""")


def _run(args: list[str], tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    script = tmp_path / "train_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    return subprocess.run(
        [sys.executable, *args[:-5], str(script), *args[-5:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _weights_equal(a: Path, b: Path) -> bool:
    wa, wb = load_file(str(a)), load_file(str(b))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sigkill_and_resume_matches_uninterrupted_run_bitwise(tmp_path: Path) -> None:
    kill_at = random.Random(0).randint(6, 38)  # a "random" step, fixed for reproducibility
    kill_at += kill_at % 5 == 0  # not on a checkpoint step, so some work is redone
    out = tmp_path / "out"
    out.mkdir()
    full = _run(["full", str(tmp_path / "a"), str(out), "-1", "40"], tmp_path)
    assert full.returncode == 0, full.stderr
    killed = _run(["resume", str(tmp_path / "b"), str(out), str(kill_at), "40"], tmp_path)
    assert killed.returncode == -9, killed.stderr  # SIGKILL
    assert not (out / "final_resume0.json").exists()
    resumed = _run(["resume", str(tmp_path / "b"), str(out), "-1", "40"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr

    a = json.loads((out / "final_full0.json").read_text())
    b = json.loads((out / "final_resume0.json").read_text())
    assert a == b and a["step"] == 40  # floats compared exactly
    assert _weights_equal(out / "weights_full0.safetensors", out / "weights_resume0.safetensors")
    logs = [(tmp_path / d / "metrics.jsonl").read_text() for d in ("a", "b")]
    assert logs[0] == logs[1]  # steps logged before the kill and redone appear once


@pytest.mark.slow
def test_ddp_two_cpu_ranks_with_gloo(tmp_path: Path) -> None:
    from cape.lab.train.lock import FolderLock

    out = tmp_path / "out"
    out.mkdir()
    launch = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone"]
    with FolderLock(out / "busy"):  # held by this process while the ranks try it
        res = _run([*launch, "ddp", str(tmp_path / "run"), str(out), "-1", "10"], tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    for rank in (0, 1):  # rank 1 learnt rank 0's outcome instead of waiting for it
        busy = (out / f"busy{rank}.txt").read_text()
        assert busy.startswith(f"{out / 'busy'} is in use by PID {os.getpid()} on host ")
    aug = [json.loads((out / f"aug{r}.json").read_text()) for r in range(2)]
    assert aug[0] != aug[1]  # seed + rank: different augmentation draws
    finals = [json.loads((out / f"final_ddp{r}.json").read_text()) for r in range(2)]
    assert finals[0] == finals[1] and finals[0]["step"] == 10  # all-reduced metrics
    assert _weights_equal(out / "weights_ddp0.safetensors", out / "weights_ddp1.safetensors")
    rank0, rank1 = tmp_path / "run" / "rank0", tmp_path / "run" / "rank1"
    assert (rank0 / "metrics.jsonl").exists() and latest_checkpoint(rank0 / "checkpoints")
    assert not rank1.exists() or not any(rank1.iterdir())


def test_batches_resume_mid_epoch_and_read_what_the_sampler_forms(tmp_path: Path) -> None:
    """Trainer(batches=DurationBatchSampler): every step reads one of its batches, in its
    order; stopping mid-epoch and resuming gives the same weights as one uninterrupted run."""
    from cape.lab.data import DurationBatchSampler

    data, x, y = _task(40)
    durations = torch.rand(40, generator=torch.Generator().manual_seed(1)).numpy() + 0.5
    seen: list[list[int]] = []

    def collate(items):
        seen.append([int(i) for i, _ in items])
        return torch.stack([x for _, (x, _) in items]), torch.stack([t for _, (_, t) in items])

    indexed = [(i, data[i]) for i in range(len(data))]

    def run(folder: str, steps: int) -> nn.Module:
        seed_everything(0)
        model = _mlp()
        cfg = TrainConfig(
            steps=steps, batch_size=1, lr=1e-2, schedule="constant", checkpoint_every=3, seed=0
        )
        sampler = DurationBatchSampler(durations, 6, seed=5)
        Trainer(model, _loss, indexed, None, cfg, tmp_path / folder, collate, batches=sampler).fit(
            resume=True
        )
        return model

    full = run("full", 10)
    expect = sum((DurationBatchSampler(durations, 6, seed=5).all_batches(e) for e in (0, 1)), [])
    assert seen == expect[:10]  # 7 batches per epoch: steps 8-10 are epoch 1's
    run("part", 4)
    seen.clear()
    part = run("part", 10)  # resumes from the checkpoint of step 4 (the last step saves)
    assert seen == expect[4:10]
    for a, b in zip(full.parameters(), part.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_step_metrics_stay_tensors_until_logged(tmp_path: Path) -> None:
    """No float() per step (a host sync on GPUs): the loss, the loss function's tensor metrics
    and the gradient norm reach on_step_end as tensors; only logged steps convert them."""
    data, _, _ = _task(64)
    seed_everything(0)
    seen: dict[int, dict] = {}

    def loss(m: nn.Module, b):
        out = F.mse_loss(m(b[0]), b[1])
        return out, {"twice": 2 * out.detach(), "const": 1.5}

    cfg = TrainConfig(steps=10, batch_size=16, log_every=5, seed=0)
    Trainer(
        _mlp(),
        loss,
        data,
        None,
        cfg,
        tmp_path,
        on_step_end=lambda t, step, m: seen.__setitem__(step, dict(m)),
    ).fit()
    for m in seen.values():
        assert all(isinstance(m[k], torch.Tensor) for k in ("loss", "twice", "grad_norm"))
        assert m["const"] == 1.5
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 10]
    for r in rows:
        assert r["loss"] == float(seen[r["step"]]["loss"])
        assert r["twice"] == pytest.approx(2 * r["loss"])
        assert r["grad_norm"] == float(seen[r["step"]]["grad_norm"])


def test_git_state_names_uncommitted_tracked_files(tmp_path: Path) -> None:
    """A run's env.json says when its code differs from its commit (the commit alone would not
    reproduce it); untracked files such as data and runs are not listed."""
    import subprocess

    from cape.lab.train.logging import git_state

    assert git_state(tmp_path) is None  # not a checkout
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "model.py").write_text("a = 1\n")
    subprocess.run([*git, "add", "model.py"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=tmp_path, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.strip()
    (tmp_path / "runs.txt").write_text("untracked\n")
    assert git_state(tmp_path) == {"commit": head, "changed": [], "changed_count": 0}
    (tmp_path / "model.py").write_text("a = 2\n")
    assert git_state(tmp_path) == {"commit": head, "changed": ["model.py"], "changed_count": 1}
