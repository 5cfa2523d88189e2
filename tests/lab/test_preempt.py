"""Preemption and elastic restarts of `cape train` (a tiny `length` run, CPU, deterministic).

SIGTERM / SIGUSR1 stop a run at the end of its current step with that step checkpointed and
exit 75; under torchrun every rank stops after the same step, whichever rank got the signal.
`torchrun --max-restarts 1` resumes a run whose rank died from its newest checkpoint. In every
case the final weights equal an uninterrupted run's bit for bit, and the log holds each step
once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import TensorDataset

import cape
from cape.lab.errors import Preempted
from cape.lab.train import TrainConfig, Trainer, latest_checkpoint, preempt, seed_everything

STEPS = 120
TRAIN = [
    "length",
    "--row",
    "nopos",
    *("--set", f"train.steps={STEPS}", "--set", "train.checkpoint_every=40"),
    *("--set", "train.deterministic=true", "--set", "train.progress_every=0.001"),
]
_SRC = str(Path(cape.__file__).resolve().parents[1])  # the cape under test, in every process
_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "PYTHONPATH": _SRC}
_TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
_CAPE = [sys.executable, "-m", "cape.lab", "train"]
_CAPE_DDP = [*_TORCHRUN, "-m", "cape.lab", "train"]
_STOPPED = re.compile(
    r"^cape train: stopped by (SIG\w+) after step (\d+) of 120, saved in (\S+); "
    r"run the same command again to resume$",
    re.M,
)

# a rank that SIGKILLs itself after step KILL_AT of the first round (a marker file says it did)
DYING = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from cape.lab.train import engine

    step, mark = engine.Trainer._train_step, Path(os.environ["KILL_MARK"])

    def dying_step(self):
        out = step(self)
        if self.step == 30 and os.environ["RANK"] == os.environ["KILL_RANK"] and not mark.exists():
            mark.write_text(os.environ["TORCHELASTIC_RESTART_COUNT"])
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    engine.Trainer._train_step = dying_step
    from cape.lab.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def _train(cmd: list[str], out: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*cmd, *TRAIN, "--out", str(out)],
        env={**_ENV, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


def _signalled(cmd: list[str], out: Path, signum: int, target: str = "self") -> tuple[int, str]:
    """Start a run, send `signum` once it has logged a step (to the process itself, or to
    torchrun's worker of rank 1 when `target` is "rank1"); its exit code and stderr."""
    err_path = out.with_suffix(".err")
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [*cmd, *TRAIN, "--out", str(out)], env=_ENV, stdout=subprocess.DEVNULL, stderr=err
        )
    deadline = time.monotonic() + 120
    while not re.search(r"step \d+/120", err_path.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()
        time.sleep(0.02)
    pid = proc.pid
    if target == "rank1":  # the worker started second: RANK=1
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
        pid = int(children.stdout.split()[-1])
    os.kill(pid, signum)
    return proc.wait(timeout=120), err_path.read_text()


def _final(out: Path) -> dict[str, torch.Tensor]:
    return load_file(
        str(out / "nopos" / "seed0" / "checkpoints" / f"step_{STEPS:08d}" / "model.safetensors")
    )


def _same_run(out: Path, reference: Path) -> None:
    got, want = _final(out), _final(reference)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    log = Path("nopos") / "seed0" / "metrics.jsonl"
    assert (out / log).read_text() == (reference / log).read_text()  # each step once


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted run in one process."""
    out = tmp_path_factory.mktemp("reference")
    done = _train(_CAPE, out)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def reference_ddp(tmp_path_factory) -> Path:
    """An uninterrupted run on 2 CPU ranks (gloo)."""
    out = tmp_path_factory.mktemp("reference_ddp")
    done = _train(_CAPE_DDP, out)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _stopped_at(err: str, signame: str, out: Path) -> int:
    match = _STOPPED.search(err)
    assert match and match[1] == signame, err[-3000:]
    assert len(_STOPPED.findall(err)) == 1  # rank 0 alone says so
    step, where = int(match[2]), Path(match[3])
    ckpts = out / "nopos" / "seed0" / "checkpoints"
    assert 0 < step < STEPS and where == ckpts / f"step_{step:08d}"
    assert latest_checkpoint(ckpts) == where  # the newest checkpoint is the step it stopped at
    return step


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_a_stop_signal_saves_the_step_and_resume_is_bit_exact(tmp_path, reference, signum):
    out = tmp_path / "run"
    code, err = _signalled(_CAPE, out, signum)
    assert code == 75, err[-3000:]
    _stopped_at(err, signal.Signals(signum).name, out)
    resumed = _train(_CAPE, out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _same_run(out, reference)


def test_under_torchrun_every_rank_stops_after_the_step_one_rank_was_signalled(
    tmp_path, reference_ddp
):
    out = tmp_path / "run"
    code, err = _signalled(_CAPE_DDP, out, signal.SIGUSR1, target="rank1")
    assert code == 1, err[-3000:]  # torchrun's own code when a worker exits non-zero
    assert "exitcode: 75" in err
    _stopped_at(err, "SIGUSR1", out)  # rank 0 saved the step rank 1 was signalled at
    resumed = _train(_CAPE_DDP, out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _same_run(out, reference_ddp)


@pytest.mark.parametrize("rank", ["0", "1"])
def test_torchrun_max_restarts_resumes_after_a_rank_dies(tmp_path, reference_ddp, rank):
    """Rank 0 killed: the restarted rank 1 used to read the dead round's gloo address from
    torchrun's store, and rank 0's lock is left behind (taken over)."""
    script, out, mark = tmp_path / "dying.py", tmp_path / "run", tmp_path / "killed"
    script.write_text(DYING)
    cmd = [*_TORCHRUN, "--max-restarts", "1", str(script), "train"]
    done = _train(cmd, out, KILL_RANK=rank, KILL_MARK=str(mark))
    assert done.returncode == 0, done.stderr[-3000:]
    assert mark.read_text() == "0"  # it died in the first round
    assert "exitcode: -9" in done.stderr and "connectFullMesh" not in done.stderr
    _same_run(out, reference_ddp)


# -- in one process ------------------------------------------------------------------------------


def test_the_handlers_record_the_signal_and_are_restored(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with preempt.catching_stop_signals():
        assert preempt.requested() == 0 and preempt.agreed() == 0
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal changes nothing
        assert preempt.requested() == preempt.agreed() == signal.SIGUSR1
    assert signal.getsignal(signal.SIGTERM) is before and preempt.requested() == 0


def test_trainer_raises_preempted_after_saving_the_step(tmp_path):
    seed_everything(0)
    x = torch.randn(64, 4)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    cfg = TrainConfig(steps=20, batch_size=8, checkpoint_every=10, eval_every=0, seed=0)

    def hook(trainer, step, metrics):
        if step == 7:
            os.kill(os.getpid(), signal.SIGTERM)

    trainer = Trainer(
        nn.Linear(4, 1),
        lambda m, b: (F.mse_loss(m(b[0]), b[1]), {}),
        data,
        None,
        cfg,
        tmp_path,
        on_step_end=hook,
    )
    with pytest.raises(Preempted, match=r"^stopped by SIGTERM after step 7 of 20, saved in "):
        trainer.fit()
    assert latest_checkpoint(tmp_path / "checkpoints") == tmp_path / "checkpoints" / "step_00000007"
    assert not (tmp_path / ".lock.owner").exists()  # the lock released
