"""Elastic restarts of `cape train` (a tiny `length` run, CPU, deterministic).

`torchrun --max-restarts 1` resumes a run whose rank died from its newest checkpoint. In every
case the final weights equal an uninterrupted run's bit for bit, and the log holds each step
once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import cape

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
def reference_ddp(tmp_path_factory) -> Path:
    """An uninterrupted run on 2 CPU ranks (gloo)."""
    out = tmp_path_factory.mktemp("reference_ddp")
    done = _train(_CAPE_DDP, out)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


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
