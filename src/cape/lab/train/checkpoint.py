"""Checkpoints that are whole or absent, loaded without running pickled code.

Layout under a checkpoint root:

    step_00000020/model.safetensors   weights (safetensors: tensors only, no code)
    step_00000020/state.pt            optimiser, scheduler, step, RNG states, sampler position,
                                      the weights file's CRC-32: tensors and plain Python
                                      values, read with weights_only
    best/                             the same two files, for the best eval metric
    latest                            text file naming the newest step_* directory (a hint)

Writing: a checkpoint is filled under a temporary name, each file synced to the disk, read back
and checked (`read_checkpoint`), then renamed into place and the folder synced; `latest` moves
last. A run killed at any instant leaves the old checkpoint or the new one, never half of one.

Reading: `latest` is not trusted alone. `resume_checkpoint` (the Trainer's resume, the run
folder's one writer) walks the step folders newest first and takes the first intact one; every
damaged one on the way (a truncated or missing file, a half-copied folder) is named in a
warning and set aside as `step_X.damaged-<time>`, never deleted. `latest_checkpoint` and
`pick_checkpoint` choose the same way without moving anything, and name the damaged file in
their error (`cape.lab.errors.DamagedFile`) when nothing intact is left.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from cape.lab.errors import DamagedFile, RunError
from cape.lab.io import atomic_write, crc32, fsync_dir, fsync_file, set_aside

__all__ = [
    "get_rng_state",
    "set_rng_state",
    "save_checkpoint",
    "load_checkpoint",
    "load_state",
    "read_checkpoint",
    "latest_checkpoint",
    "resume_checkpoint",
    "pick_checkpoint",
    "is_checkpoint",
    "prune_checkpoints",
]

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
_STEP = re.compile(r"step_(\d+)")
_log = logging.getLogger(__name__)


def get_rng_state() -> dict[str, Any]:
    """torch, CUDA, numpy and Python RNG states as tensors and plain values (weights_only-safe)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),  # uint8 tensor
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "gauss": float(np_state[4]),
        },
        "python": {
            "version": int(py_state[0]),
            "state": torch.tensor(py_state[1], dtype=torch.int64),
            "gauss": py_state[2],
        },
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"].tolist()), p["gauss"]))


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    # Copies: safetensors refuses tensors sharing storage (tied weights) and non-contiguous ones.
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}


def _why(err: BaseException) -> str:
    """The first sentence of `err`'s message (torch's run on for a paragraph)."""
    text = str(err).strip().split("\n")[0].split(". ")[0].rstrip(".")
    return text or type(err).__name__


def _replace_dir(tmp: Path, final: Path) -> None:
    """Rename `tmp` onto `final`; rename(2) cannot replace a non-empty directory, so an existing
    one (the same step saved again after a resume) is first moved into `.old_<name>.*`, then
    deleted. A kill between the two renames leaves it there: `resume_checkpoint` moves it back."""
    if final.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".old_{final.name}.", dir=final.parent))
        os.replace(final, trash / final.name)
        os.replace(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, final)


def save_checkpoint(
    root: str | Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    extra: dict[str, Any] | None = None,
    *,
    name: str | None = None,
    rng: Any = None,
    keep_last: int | None = None,
) -> Path:
    """Write `root/step_XXXXXXXX` (or `root/name`, e.g. "best") and return its path.

    `extra` holds plain values/tensors (sampler position, best metric, ...); `rng` defaults to
    this process's `get_rng_state()` (the Trainer passes a list, one state per rank). Step
    directories update `latest` and, with `keep_last`, only the newest `keep_last` are kept.
    The folder appears only once written, synced and read back whole (see the module's note).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    dirname = name or f"step_{step:08d}"
    final = root / dirname
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp_{dirname}.", dir=root))
    try:
        save_file(_weights(model), str(tmp / MODEL_FILE))
        fsync_file(tmp / MODEL_FILE)
        state = {
            "step": int(step),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": get_rng_state() if rng is None else rng,
            "extra": extra or {},
            "model_crc32": crc32(tmp / MODEL_FILE),
        }
        with open(tmp / STATE_FILE, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            read_checkpoint(tmp)
        except DamagedFile as e:  # e.g. a disk that dropped a write: keep the old checkpoint
            raise RunError(f"writing checkpoint {final} failed: {e}") from e
        fsync_dir(tmp)
        _replace_dir(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if name is None:
        _point(root, dirname)
        if keep_last is not None:
            prune_checkpoints(root, keep_last)
    return final


def _step_dirs(root: Path) -> list[Path]:
    """The step_<n> folders of `root`, newest first (not the `.damaged-*` ones set aside)."""
    if not root.is_dir():
        return []
    steps = [p for p in root.iterdir() if _STEP.fullmatch(p.name) and p.is_dir()]
    return sorted(steps, key=lambda p: int(p.name[5:]), reverse=True)


def _point(root: Path, name: str) -> None:
    atomic_write(root / "latest", lambda p: Path(p).write_text(name + "\n"))


def _pointer(root: Path) -> str | None:
    """What `latest` says ('' when it is unreadable), None when there is no such file."""
    try:
        return (root / "latest").read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return ""


def prune_checkpoints(root: str | Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step_* directories (never `best/`, never the one
    `latest` names, never a damaged one set aside)."""
    root = Path(root)
    latest = _pointer(root)
    for old in _step_dirs(root)[keep_last:]:
        if old.name != latest:
            shutil.rmtree(old, ignore_errors=True)


def read_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(weights, state) of checkpoint folder `path`, both read whole and checked: DamagedFile
    naming the file and what is wrong when one is missing, truncated, not of its format, refused
    by weights_only, or (weights) differs from the CRC-32 the state recorded."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint folder {path}")
    model_file, state_file = path / MODEL_FILE, path / STATE_FILE
    for file in (model_file, state_file):
        if not file.is_file():
            raise DamagedFile(f"{file} is missing (a half-written checkpoint)", file)
    try:
        weights = load_file(str(model_file), device="cpu")
    except Exception as e:  # SafetensorError, OSError, ...: whatever the file holds
        raise DamagedFile(
            f"{model_file} is damaged (not a whole safetensors file: {_why(e)})", model_file
        ) from e
    try:
        state = load_state(state_file, map_location)
    except pickle.UnpicklingError as e:  # torch's message is a page long; this is its gist
        why = "refused by weights_only: it holds more than tensors and plain values"
        raise DamagedFile(f"{state_file} is damaged ({why})", state_file) from e
    except Exception as e:  # RuntimeError (zip), EOFError, OSError, ...
        raise DamagedFile(
            f"{state_file} is damaged (not a whole torch file: {_why(e)})", state_file
        ) from e
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise DamagedFile(f"{state_file} is damaged (it records no step)", state_file)
    crc = state.get("model_crc32")  # optional: a state without one checks the file's form only
    if crc is not None and crc32(model_file) != crc:
        raise DamagedFile(
            f"{model_file} is damaged (its CRC-32 differs from the one {STATE_FILE} recorded)",
            model_file,
        )
    return weights, state


def _restore_interrupted(root: Path) -> None:
    """Undo what a kill inside `save_checkpoint` left: a folder moved to `.old_*` whose
    replacement never arrived goes back; unfinished `.tmp_*` folders (never checkpoints) go."""
    for trash in sorted(root.glob(".old_*")):
        for kept in trash.iterdir() if trash.is_dir() else ():
            if not (root / kept.name).exists():
                os.replace(kept, root / kept.name)
                _log.warning("%s: restored %s (a save was interrupted)", root, kept.name)
        shutil.rmtree(trash, ignore_errors=True)
    for tmp in sorted(root.glob(".tmp_*")):
        shutil.rmtree(tmp, ignore_errors=True)
        _log.warning("%s: removed %s, a checkpoint whose writing was interrupted", root, tmp.name)


def resume_checkpoint(
    root: str | Path,
) -> tuple[Path, dict[str, torch.Tensor], dict[str, Any]] | None:
    """The newest intact step checkpoint of `root` as (path, weights, state), or None when
    there is none. For the run folder's one writer: damaged step folders newer than it are set
    aside (one warning each), an interrupted save is tidied, and `latest` is pointed at the
    result (with a warning when it named a step that is missing or damaged)."""
    root = Path(root)
    if not root.is_dir():
        return None
    _restore_interrupted(root)
    pointer = _pointer(root)
    for path in _step_dirs(root):
        try:
            weights, state = read_checkpoint(path)
        except DamagedFile as e:
            set_aside(path, str(e))
            continue
        if pointer != path.name:
            if pointer is not None and not (_STEP.fullmatch(pointer) and (root / pointer).is_dir()):
                _log.warning(
                    "%s names %r, which is missing or damaged; resuming from %s",
                    root / "latest",
                    pointer,
                    path.name,
                )
            _point(root, path.name)
        return path, weights, state
    if pointer:
        _log.warning("%s names %r, but no intact checkpoint is left", root / "latest", pointer)
    return None


def _newest_intact(root: Path) -> tuple[Path | None, list[DamagedFile]]:
    """The newest step folder that reads whole, and the damage met on the way (each named in a
    warning, nothing moved)."""
    damage = []
    for path in _step_dirs(root):
        try:
            read_checkpoint(path)
        except DamagedFile as e:
            _log.warning("%s; skipped for an older intact checkpoint", e)
            damage.append(e)
            continue
        return path, damage
    return None, damage


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest intact step folder of `root`, or None when there is none. Each damaged newer
    one is named in a warning (and left in place: only the run's writer sets it aside)."""
    return _newest_intact(Path(root))[0]


def is_checkpoint(path: str | Path) -> bool:
    """Whether `path` holds both files of a checkpoint (weights and state); not read."""
    return (Path(path) / MODEL_FILE).is_file() and (Path(path) / STATE_FILE).is_file()


def pick_checkpoint(root: str | Path, checkpoint: str = "best") -> Path:
    """The checkpoint folder `checkpoint` names in `root` (RUN/checkpoints): "best" (best/, or
    the newest intact step when best/ was never saved), "latest" (the newest intact step), or a
    folder name. FileNotFoundError naming what is there when it is absent; DamagedFile naming
    the damaged file when the one asked for (or every step) does not read whole."""
    root = Path(root)
    if not isinstance(checkpoint, str) or not checkpoint:
        raise ValueError(
            f"checkpoint must be 'best', 'latest' or a checkpoint name, got {checkpoint!r}"
        )
    if checkpoint in ("best", "latest"):
        if checkpoint == "best" and (root / "best").exists():
            return _checked(root / "best", root)
        found, damage = _newest_intact(root)
        if found is not None:
            return found
        if damage:
            more = f" (and {len(damage) - 1} more damaged)" if len(damage) > 1 else ""
            raise DamagedFile(f"no intact checkpoint in {root}: {damage[0]}{more}", damage[0].path)
        raise FileNotFoundError(f"no checkpoint in {root}: train it first")
    if PurePosixPath(checkpoint).name != checkpoint or checkpoint in (".", ".."):
        raise ValueError(f"checkpoint must be a folder name inside {root}, got {checkpoint!r}")
    if not (root / checkpoint).is_dir():
        have = sorted(p.name for p in root.iterdir() if is_checkpoint(p)) if root.is_dir() else []
        raise FileNotFoundError(
            f"no checkpoint {root / checkpoint}; available: {have or 'none (train it first)'}"
        )
    return _checked(root / checkpoint, root)


def _checked(path: Path, root: Path) -> Path:
    try:
        read_checkpoint(path)
    except DamagedFile as e:
        others = sorted(p.name for p in _step_dirs(root) if p != path)
        raise DamagedFile(
            f"{e}; pick another checkpoint: 'latest' or one of {others}", e.path
        ) from e
    return path


def load_state(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a state file with `weights_only=True`: a pickle that would run code is refused
    (`pickle.UnpicklingError`), whatever its contents."""
    return torch.load(path, map_location=map_location, weights_only=True)


def load_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    *,
    map_location: str | torch.device = "cpu",
    strict: bool = True,
    read: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Restore weights (safetensors) and, when given, optimiser and scheduler in place; both
    files are read and checked before anything changes (DamagedFile naming a damaged one).
    `read`: what `read_checkpoint(path)` returned, when the caller has it already.

    Returns the state dict: `step`, `rng` (not applied: callers pick their rank's entry and call
    `set_rng_state`), `extra`.
    """
    weights, state = read if read is not None else read_checkpoint(path, map_location)
    model.load_state_dict(weights, strict=strict)
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    return state
