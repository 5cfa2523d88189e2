"""Fault injection on run folders: kills during a checkpoint write, damaged files of every kind,
torn log lines, a dangling `latest`, two writers, a stale lock, a file or read-only --out
(a busy folder under DDP: tests/lab/test_train.py's 2-rank run).

Each training case damages a run that stopped at step 15 (checkpoints every 5 steps, 20 steps in
all), resumes it, and checks that no finished step is lost: the final weights equal an
uninterrupted run's bit for bit, and the log holds each step once, as that run's does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from cape.lab.cli import main as cli
from cape.lab.data.images.render import load_split, make_split
from cape.lab.data.translation.corpus import CorpusError, verify_translation_corpus
from cape.lab.errors import DamagedFile, RunFolderBusy, UsageError
from cape.lab.experiments.run_folders import cached_runs, check_run_settings, read_results, run_dir
from cape.lab.train import TrainConfig, Trainer, pick_checkpoint, seed_everything
from cape.lab.train.lock import FolderLock

STEPS = 20
_G = torch.Generator().manual_seed(0)
_X = torch.randn(64, 8, generator=_G)
_Y = _X @ torch.randn(8, 1, generator=_G)


def _loss(model: nn.Module, batch):
    x, t = batch
    x = x + 0.05 * torch.randn_like(x)  # augmentation from the global RNG: resume restores it
    return F.mse_loss(model(x), t), {}


# a constant lr: a run stopped at 15 of 15 steps trains as the first 15 steps of 20 do
_CFG = dict(batch_size=8, lr=1e-2, schedule="constant", eval_every=5, checkpoint_every=5)


def _trainer(run: Path, steps: int = STEPS) -> Trainer:
    seed_everything(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    cfg = TrainConfig(steps=steps, keep_last=5, seed=0, **_CFG)
    evaluate = lambda m: {"loss": F.mse_loss(m(_X), _Y).item()}  # noqa: E731
    return Trainer(model, _loss, TensorDataset(_X, _Y), evaluate, cfg, run)


def _train(run: Path, steps: int = STEPS, resume: bool = True) -> Trainer:
    (trainer := _trainer(run, steps)).fit(resume=resume)
    return trainer


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the subprocesses' setting: the same float sums everywhere
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[dict[str, torch.Tensor], str]:
    """The uninterrupted run: final weights and metrics.jsonl."""
    run = tmp_path_factory.mktemp("reference")
    trainer = _train(run, resume=False)
    return trainer.model.state_dict(), (run / "metrics.jsonl").read_text()


@pytest.fixture
def stopped(tmp_path: Path) -> Path:
    """A run that stopped cleanly after step 15 (checkpoints 5, 10, 15; best/ at some step)."""
    _train(tmp_path / "run", steps=15)
    return tmp_path / "run"


def _assert_same_as_reference(trainer: Trainer, run: Path, reference) -> None:
    weights, log = reference
    got = trainer.model.state_dict()
    assert trainer.step == STEPS
    assert all(torch.equal(got[k], weights[k]) for k in weights)  # bit for bit
    assert (run / "metrics.jsonl").read_text() == log  # every step once, none lost


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- checkpoints ----------------------------------------------------------------------------------

KILLED = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import torch
    sys.path.insert(0, sys.argv[2])
    from test_faults import _train

    torch.set_num_threads(1)
    save = torch.save

    def dying_save(state, f):  # half of step 15's state.pt reaches the disk, then SIGKILL
        if ".tmp_step_00000015." in getattr(f, "name", ""):
            save(state, f)
            f.truncate(f.tell() // 2)
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        save(state, f)

    torch.save = dying_save
    _train(Path(sys.argv[1]))
""")


def test_sigkill_during_a_checkpoint_write_and_its_stale_lock(tmp_path, reference, caplog):
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    run, here = tmp_path / "run", Path(__file__).parent
    proc = subprocess.run([sys.executable, script, run, here], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    ckpts = run / "checkpoints"
    assert [p.name[:19] for p in ckpts.glob(".tmp_*")] == [".tmp_step_00000015."]
    assert (ckpts / "latest").read_text() == "step_00000010\n"  # step 15 never became visible
    owner = json.loads((run / ".lock.owner").read_text())  # the killed one never released it
    with caplog.at_level(logging.WARNING):
        trainer = _train(run)
    said = "\n".join(_warnings(caplog))
    holder = f"PID {owner['pid']} on host {owner['host']} since {owner['started']}"
    assert (
        f"{run}: took over the lock {run / '.lock'} left by {holder} (that process is gon" in said
    )
    assert f"{ckpts}: removed .tmp_step_00000015." in said and "writing was interrupted" in said
    assert not list(ckpts.glob(".tmp_*"))
    _assert_same_as_reference(trainer, run, reference)


@pytest.mark.parametrize("file", ["model.safetensors", "state.pt"])
@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_damaged_newest_checkpoint_is_set_aside(stopped, reference, caplog, file, damage):
    path = stopped / "checkpoints" / "step_00000015" / file
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    else:
        path.unlink()
    with pytest.raises(DamagedFile, match=rf"step_00000015/{file} is (damaged|missing)"):
        pick_checkpoint(stopped / "checkpoints", "step_00000015")
    with caplog.at_level(logging.WARNING):
        trainer = _train(stopped)
    (said,) = [w for w in _warnings(caplog) if str(path) in w]
    assert said.startswith(f"{path} is {'damaged' if damage == 'truncated' else 'missing'} (")
    assert "; set aside as " in said and "\n" not in said
    aside = list((stopped / "checkpoints").glob("step_00000015.damaged-*"))
    assert len(aside) == 1 and (aside[0] / file).exists() == (damage == "truncated")
    _assert_same_as_reference(trainer, stopped, reference)  # resumed from step 10


def test_bit_flip_in_the_weights_is_caught_by_the_recorded_crc(stopped, reference, caplog):
    path = stopped / "checkpoints" / "step_00000015" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # inside a tensor: safetensors alone reads it without complaint
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        trainer = _train(stopped)
    assert any("CRC-32 differs" in w and str(path) in w for w in _warnings(caplog))
    _assert_same_as_reference(trainer, stopped, reference)


@pytest.mark.parametrize("pointer", ["step_00000020\n", "", "step_000"])
def test_dangling_or_truncated_latest_and_a_half_written_folder(
    stopped, reference, caplog, pointer
):
    ckpts = stopped / "checkpoints"
    (ckpts / "latest").write_text(pointer)
    half = ckpts / "step_00000020"  # as an older version's interrupted copy could leave it
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"\x00" * 10)
    with caplog.at_level(logging.WARNING):
        trainer = _train(stopped)
    said = _warnings(caplog)
    assert any(w.startswith(f"{half / 'state.pt'} is missing") for w in said)
    latest = f"{ckpts / 'latest'} names"
    assert any(w.startswith(latest) and w.endswith("resuming from step_00000015") for w in said)
    _assert_same_as_reference(trainer, stopped, reference)  # from 15, not from 0


def test_pointer_not_moved_yet_resumes_from_the_newer_whole_step(stopped, reference, caplog):
    (stopped / "checkpoints" / "latest").write_text("step_00000010\n")  # killed before it moved
    with caplog.at_level(logging.WARNING):
        trainer = _train(stopped)
    assert _warnings(caplog) == []  # nothing was damaged
    _assert_same_as_reference(trainer, stopped, reference)


def test_a_save_interrupted_between_its_renames_is_restored(stopped, reference, caplog):
    ckpts = stopped / "checkpoints"
    trash = ckpts / ".old_best.x1"  # save_checkpoint moved best/ here, then was killed
    trash.mkdir()
    (ckpts / "best").rename(trash / "best")
    with caplog.at_level(logging.WARNING):
        trainer = _train(stopped)
    assert any("restored best (a save was interrupted)" in w for w in _warnings(caplog))
    assert pick_checkpoint(ckpts, "best") == ckpts / "best" and not trash.exists()
    _assert_same_as_reference(trainer, stopped, reference)


def test_damaged_best_is_set_aside_and_saved_anew(stopped, reference, caplog):
    best = stopped / "checkpoints" / "best" / "model.safetensors"
    best.write_bytes(best.read_bytes()[:-7])
    with pytest.raises(DamagedFile, match=r"best/model\.safetensors is damaged .*'latest' or one"):
        pick_checkpoint(stopped / "checkpoints", "best")
    with caplog.at_level(logging.WARNING):
        trainer = _train(stopped)
    assert any("the next evaluation saves a new best" in w for w in _warnings(caplog))
    assert pick_checkpoint(stopped / "checkpoints", "best") == stopped / "checkpoints" / "best"
    _assert_same_as_reference(trainer, stopped, reference)


def test_pick_checkpoint_names_the_damaged_file_when_no_step_is_whole(stopped, caplog):
    ckpts = stopped / "checkpoints"
    for step in (5, 10, 15):
        (ckpts / f"step_{step:08d}" / "state.pt").write_bytes(b"PK\x03\x04")
    with caplog.at_level(logging.WARNING):
        with pytest.raises(DamagedFile, match=r"no intact checkpoint in .*step_00000015/state\.pt"):
            pick_checkpoint(ckpts, "latest")
    assert len(_warnings(caplog)) == 3  # each damaged step named once
    assert (ckpts / "step_00000015").is_dir()  # a reader moves nothing


# -- logs -----------------------------------------------------------------------------------------


def test_torn_last_lines_are_cut_with_a_warning(stopped, reference, caplog):
    jsonl, csv = stopped / "metrics.jsonl", stopped / "metrics_train.csv"
    with open(jsonl, "a") as f:
        f.write('{"step": 16, "split": "tr')  # a kill during a write
    with open(csv, "a") as f:
        f.write("16,train,0.0")
    with caplog.at_level(logging.WARNING):
        trainer = _train(stopped)
    said = _warnings(caplog)
    for path in (jsonl, csv):
        assert f"{path}: cut its torn last line (a write interrupted)" in said
    _assert_same_as_reference(trainer, stopped, reference)
    steps = [int(line.split(",")[0]) for line in csv.read_text().splitlines()[1:]]
    assert steps == list(range(1, STEPS + 1))


def test_damaged_middle_line_is_dropped_and_repeated_steps_kept_once(stopped, reference, caplog):
    jsonl = stopped / "metrics.jsonl"
    rows = jsonl.read_text().splitlines(keepends=True)  # steps 1-5, 5 (eval), 6, ...
    torn = rows[3][:10] + rows[4]  # step 4's row cut by a kill, step 5's appended to it
    again = rows[6:8]  # steps 6 and 7 logged a second time (an older version's restart)
    jsonl.write_text("".join(rows[:3] + [torn] + rows[5:8] + again + rows[8:]))
    with caplog.at_level(logging.WARNING):
        trainer = _train(stopped)
    said = _warnings(caplog)
    assert f"{jsonl}: dropped damaged line(s) [4] (not a whole row)" in said
    assert f"{jsonl}: 2 step(s) were logged twice; kept the later row" in said
    # the damaged line held the train rows of steps 4 and 5: those are lost, nothing else
    lost = [(4, "train"), (5, "train")]
    rows = [json.loads(ln) for ln in reference[1].splitlines()]
    expect = [json.dumps(r) for r in rows if (r["step"], r["split"]) not in lost]
    assert jsonl.read_text().splitlines() == expect
    assert all(torch.equal(trainer.model.state_dict()[k], v) for k, v in reference[0].items())


# -- eval.json, results.json, settings.json -------------------------------------------------------


def test_damaged_eval_json_is_evaluated_again_results_and_settings_named(tmp_path, caplog):
    row = SimpleNamespace(name="A")
    calls = []

    def compute(row, seed, folder):
        calls.append(seed)
        return {"records": [{"acc": 1.0}], "summary": {}}

    assert [d for *_, d in cached_runs([row], [0], tmp_path, compute)][0]["records"]
    path = run_dir(tmp_path, row, 0) / "eval.json"
    path.write_text(path.read_text()[:20])
    with caplog.at_level(logging.WARNING):
        ((_, _, done),) = cached_runs([row], [0], tmp_path, compute)
    assert calls == [0, 0] and json.loads(path.read_text()) == done
    assert any(w.startswith(f"{path} is damaged (not JSON") for w in _warnings(caplog))
    assert len(list(path.parent.glob("eval.json.damaged-*"))) == 1
    (tmp_path / "results.json").write_text('{"experiment": "vis')
    with pytest.raises(DamagedFile, match=r"results\.json is damaged \(not JSON: .*writes it"):
        read_results(tmp_path)
    (path.parent / "settings.json").write_text('{"train.steps": 1')  # what trained it: unknown
    with pytest.raises(DamagedFile, match=r"settings\.json is damaged .*delete it if this run"):
        check_run_settings(path.parent, {"train.steps": 1})


# -- one writer per run folder --------------------------------------------------------------------


def test_second_writer_exits_2_naming_the_holder(tmp_path):
    out = tmp_path / "exp"
    with FolderLock(out):  # this process holds it; the same process asking again is refused too
        with pytest.raises(RunFolderBusy, match=rf"{out} is in use by PID {os.getpid()} on host "):
            _train(out)
        second = subprocess.run(
            [sys.executable, "-m", "cape.lab", "experiment", "vision", "--out", str(out)],
            capture_output=True,
            text=True,
        )
    assert second.returncode == 2
    (line,) = second.stderr.splitlines()
    assert line.startswith(f"cape experiment: error: {out} is in use by PID {os.getpid()} on host ")
    assert line.endswith(f"(lock {out / '.lock'})") and " since 20" in line
    assert not (out / "config.yaml").exists()  # the second process wrote nothing


def test_stale_lock_is_taken_over_and_a_clean_release_leaves_none(tmp_path, caplog):
    # what a SIGKILLed holder leaves (a real one: the first test): a free OS lock, its owner file
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = {"pid": gone.pid, "host": socket.gethostname(), "started": "2026-11-26 10:20:01"}
    (tmp_path / ".lock.owner").write_text(json.dumps(dead))
    with caplog.at_level(logging.WARNING), FolderLock(tmp_path):
        owner = json.loads((tmp_path / ".lock.owner").read_text())
    assert owner["pid"] == os.getpid()
    (said,) = _warnings(caplog)
    assert said == (
        f"{tmp_path}: took over the lock {tmp_path / '.lock'} left by PID {dead['pid']} on host "
        f"{dead['host']} since 2026-11-26 10:20:01 (that process is gone)"
    )
    assert not (tmp_path / ".lock.owner").exists()  # released cleanly: nothing to take over


# -- --out that cannot be a run folder ------------------------------------------------------------


def _read_only_folder(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o555)
        return tmp_path / "ro"
    try:  # root writes through permissions, not into sysfs
        (Path("/sys") / "cape-test").mkdir()
    except PermissionError:
        return Path("/sys")
    pytest.skip("running as root without a read-only /sys: no read-only folder to try")


@pytest.mark.parametrize("kind", ["file", "file parent", "read-only"])
def test_out_that_cannot_be_a_run_folder_exits_2(tmp_path, capsys, kind):
    (tmp_path / "f").write_text("x")
    bad = _read_only_folder(tmp_path) if kind == "read-only" else tmp_path / "f"
    out = bad if kind == "file" else bad / "run"
    assert cli(["experiment", "vision", "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()  # the CLI checks --out in its own words
    assert line.startswith("cape experiment: error: ") and str(bad) in line
    # the engine refuses such a folder itself (a library user, `cape train`'s run folder)
    with pytest.raises(UsageError, match=re.escape(str(bad))) as err:
        _trainer(out / "seed0").fit()
    said = str(err.value)
    if kind == "read-only":
        assert said.startswith(f"{out / 'seed0'} cannot be used as a run folder (")
    else:
        assert said.startswith(f"{bad} is a file: a run folder must be a folder; the run folder")


# -- corpora --------------------------------------------------------------------------------------


def test_damaged_image_split_and_shard_are_set_aside_and_rendered_again(tmp_path, caplog):
    kw = dict(shard_size=4, workers=1, keep_shards=True)
    path = make_split(tmp_path, "val", 8, 12, **kw)
    images, labels, _ = load_split(path)
    shard = path.with_name(path.stem + ".shards") / "shard_00001.npz"
    shard.write_bytes(shard.read_bytes()[:-30])
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with caplog.at_level(logging.WARNING):
        assert make_split(tmp_path, "val", 8, 12, **kw) == path
    said = _warnings(caplog)
    for file in (path, shard):
        (aside,) = file.parent.glob(f"{file.name}.damaged-*")  # kept, not deleted
        (line,) = [w for w in said if w.startswith(f"{file} is damaged (")]
        assert line.endswith(f"; it is rendered again; set aside as {aside}")
    again, labels_again, _ = load_split(path)
    assert np.array_equal(again, images) and np.array_equal(labels_again, labels)


def test_damaged_translation_manifest_is_named(tmp_path):
    (tmp_path / "manifest.json").write_text('{"settings": {"seed": 0}, "coun')
    with pytest.raises(CorpusError, match=r"manifest\.json is damaged \(not JSON: .*makes it"):
        verify_translation_corpus(tmp_path)


def test_read_metrics_skips_a_torn_last_line_and_names_a_damaged_one(tmp_path, caplog) -> None:
    from cape.lab.experiments.lff_generation.evaluate import read_curve
    from cape.lab.train.logging import read_metrics

    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 10, "split": "eval", "bpd": 3.5}, {"step": 20, "split": "eval", "bpd": 3.25}]
    whole = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(whole + '{"step": 30, "split": "ev')  # a kill in the middle of a write
    with caplog.at_level(logging.WARNING):
        assert read_metrics(path) == rows
    assert str(path) in caplog.text and "torn" in caplog.text
    assert read_curve(tmp_path) == [{"step": 10, "bpd": 3.5}, {"step": 20, "bpd": 3.25}]
    path.write_text('{"step": 10}\n{"step": 2\n{"step": 30}\n')
    with pytest.raises(DamagedFile, match=r"metrics\.jsonl: line 2 "):
        read_metrics(path)
    assert read_metrics(tmp_path / "absent.jsonl") == []
