"""Checkpoints that are written atomically and loaded without running pickled code.

Layout under a checkpoint root:

    step_00000020/model.safetensors   weights (safetensors: tensors only, no code)
    step_00000020/state.pt            optimiser, scheduler, step, RNG states, sampler position:
                                      tensors and plain Python values, read with weights_only
    best/                             the same two files, for the best eval metric
    latest                            text file naming the newest step_* directory

A directory is filled under a temporary name and renamed into place, and `latest` is replaced
atomically, so a run killed at any instant leaves either the old or the new checkpoint.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from cape.lab.io import atomic_write

__all__ = [
    "get_rng_state",
    "set_rng_state",
    "save_checkpoint",
    "load_checkpoint",
    "load_state",
    "latest_checkpoint",
    "pick_checkpoint",
    "is_checkpoint",
    "prune_checkpoints",
]

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"


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


def _replace_dir(tmp: Path, final: Path) -> None:
    """Rename `tmp` onto `final`; rename(2) cannot replace a non-empty directory, so an existing
    one (the same step saved again after a resume) is first moved aside, then deleted."""
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
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    dirname = name or f"step_{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp_{dirname}.", dir=root))
    try:
        save_file(_weights(model), str(tmp / MODEL_FILE))
        state = {
            "step": int(step),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": get_rng_state() if rng is None else rng,
            "extra": extra or {},
        }
        torch.save(state, tmp / STATE_FILE)
        final = root / dirname
        _replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if name is None:
        atomic_write(root / "latest", lambda p: Path(p).write_text(dirname + "\n"))
        if keep_last is not None:
            prune_checkpoints(root, keep_last)
    return final


def prune_checkpoints(root: str | Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step_* directories (never `best/`, never latest)."""
    root = Path(root)
    latest = latest_checkpoint(root)
    steps = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in steps[: max(0, len(steps) - keep_last)]:
        if latest is None or old.resolve() != latest.resolve():
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The directory named by `root/latest`, or None when there is no complete checkpoint."""
    pointer = Path(root) / "latest"
    if not pointer.exists():
        return None
    path = Path(root) / pointer.read_text().strip()
    return path if (path / STATE_FILE).exists() and (path / MODEL_FILE).exists() else None


def is_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a complete checkpoint folder (weights and state)."""
    return (Path(path) / MODEL_FILE).is_file() and (Path(path) / STATE_FILE).is_file()


def pick_checkpoint(root: str | Path, checkpoint: str = "best") -> Path:
    """The checkpoint folder `checkpoint` names in `root` (RUN/checkpoints): "best" (best/, or
    the newest step when best/ was never saved), "latest", or a folder name; FileNotFoundError
    naming what is there when it is absent."""
    root = Path(root)
    if not isinstance(checkpoint, str) or not checkpoint:
        raise ValueError(
            f"checkpoint must be 'best', 'latest' or a checkpoint name, got {checkpoint!r}"
        )
    if checkpoint in ("best", "latest"):
        best = root / "best"
        if checkpoint == "best" and is_checkpoint(best):
            return best
        found = latest_checkpoint(root)
        if found is None:
            raise FileNotFoundError(f"no checkpoint in {root}: train it first")
        return found
    if PurePosixPath(checkpoint).name != checkpoint or checkpoint in (".", ".."):
        raise ValueError(f"checkpoint must be a folder name inside {root}, got {checkpoint!r}")
    if not is_checkpoint(root / checkpoint):
        have = sorted(p.name for p in root.iterdir() if is_checkpoint(p)) if root.is_dir() else []
        raise FileNotFoundError(
            f"no checkpoint {root / checkpoint}; available: {have or 'none (train it first)'}"
        )
    return root / checkpoint


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
) -> dict[str, Any]:
    """Restore weights (safetensors) and, when given, optimiser and scheduler in place.

    Returns the state dict: `step`, `rng` (not applied: callers pick their rank's entry and call
    `set_rng_state`), `extra`.
    """
    path = Path(path)
    weights = load_file(str(path / MODEL_FILE), device="cpu")
    model.load_state_dict(weights, strict=strict)
    state = load_state(path / STATE_FILE, map_location=map_location)
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    return state
