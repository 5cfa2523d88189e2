"""Run folders: `<out>/<slug(row)>/seed<k>` per (row, seed), what each was trained with
(settings.json), the resumable run cache (eval.json), the results of a study and its archive."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cape.lab.errors import DamagedFile
from cape.lab.io import atomic_write, read_json, set_aside

__all__ = [
    "slug",
    "run_dir",
    "run_settings",
    "check_run_settings",
    "cached_runs",
    "is_finished",
    "finished_rows",
    "read_results",
    "archive_runs",
    "summed_accuracy",
]


_GREEK = {"λ": "lambda", "Δ": "delta", "ε": "eps", "γ": "gamma"}


def slug(name: str) -> str:
    """A folder name for a row: "CAPE λ=1" -> "cape-lambda1"."""
    for k, v in _GREEK.items():
        name = name.replace(k, v)
    name = re.sub(r"[^a-z0-9.@+]+", "-", name.lower().replace("=", ""))
    return name.strip("-") or "row"


def run_dir(out: str | Path, row: Any, seed: int) -> Path:
    """The engine run folder of one (row, seed): `<out>/<slug(row.name)>/seed<seed>`."""
    return Path(out) / slug(row.name) / f"seed{seed}"


# Settings that do not change what a run trains; "eval" changes only what is measured after,
# except the eval keys that decide which checkpoint is kept (the validation set and decoding).
_NOT_TRAINING = (
    "name",
    "seeds",
    "rows",
    "row.notes",  # a row's recipe in words, for the report
    "data.workers",
    "train.log_every",
    "train.progress_every",
    "train.keep_last",
    "train.num_workers",
    "train.device",
)
_PICKS_CHECKPOINT = ("eval.val_limit", "eval.val_beam", "eval.length_penalty")


def _flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run_settings(cfg: Any, row: Any) -> dict[str, Any]:
    """What one (row, seed) run of experiment config `cfg` depends on, as a flat JSON-ready
    mapping: every config key but the other rows, the seeds and the name, plus the row's own."""
    import dataclasses
    import json

    flat = _flat({**dataclasses.asdict(cfg), "row": dataclasses.asdict(row)})
    flat = {k: v for k, v in flat.items() if k not in ("name", "seeds", "rows")}
    return json.loads(json.dumps(flat))  # tuples -> lists, as they come back from the file


def _own_rows(settings: dict[str, Any]) -> dict[str, Any]:
    """An eval list of row names (`eval.hop_rows`...) matters to a run only as whether it names
    the run's own row: `--rows` keeps the chosen rows in such lists, and a run trained so must
    count as finished in the whole study."""
    name = settings.get("row.name")
    return {
        k: (name in v)
        if k.startswith("eval.") and k.endswith("_rows") and isinstance(v, list)
        else v
        for k, v in settings.items()
    }


def _measured_only(key: str) -> bool:
    """Whether a setting changes what is measured of the trained weights, not the weights: the
    `eval.*` keys but those that pick the checkpoint, and a row's `eval_options`."""
    if key.startswith("eval."):
        return key not in _PICKS_CHECKPOINT
    return key.startswith("row.eval_options")


def check_run_settings(folder: Path, settings: dict[str, Any]) -> bool:
    """Compare a run folder's `settings.json` (if any) with `settings`; reads only. True when
    `eval.*` keys or the row's `eval_options` differ (what was measured must be measured again:
    the row evaluates its weights with other options), False when nothing does or
    there is no file yet; ValueError naming the keys when a training setting differs (the eval
    keys that pick the checkpoint count as training), since the folder's checkpoints came from
    other settings. `_NOT_TRAINING` keys are ignored."""
    path = folder / "settings.json"
    if not path.is_file():
        return False
    try:
        old = read_json(path)
    except DamagedFile as e:  # what the checkpoints were trained with is unknown: ask
        raise DamagedFile(
            f"{e}; delete it if this run was trained with this config's settings "
            "(it is written again), else delete the run folder",
            path,
        ) from e
    old, settings = _own_rows(old), _own_rows(settings)
    diff = sorted(
        k
        for k in set(old) | set(settings)
        if old.get(k) != settings.get(k) and not k.startswith(_NOT_TRAINING)
    )
    training = [k for k in diff if not _measured_only(k)]
    if training:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {settings.get(k)!r}" for k in training[:8])
        raise ValueError(
            f"{folder} was trained with other settings ({shown}); use another "
            "--out folder, or delete this run to train it again"
        )
    return bool(diff)


def cached_runs(
    rows: Sequence[Any],
    seeds: Sequence[int],
    out: str | Path,
    compute: Callable[[Any, int, Path], dict[str, Any]],
    cfg: Any = None,
    *,
    train: bool = True,
) -> Iterator[tuple[Any, int, dict[str, Any]]]:
    """Every (row, seed) in order, with what it left in `<run_dir>/eval.json`: read when it is
    there, else `compute(row, seed, folder)` (train, resumable, then evaluate), which rank 0
    writes atomically. A rerun after an interruption thus redoes only unfinished runs.

    With the experiment config `cfg`, each run folder keeps its `run_settings` in
    `settings.json`: a rerun with other training settings raises ValueError naming them
    (`check_run_settings`), one with other `eval.*` settings evaluates again without training.

    With `train=False` nothing is computed or written: only the finished runs (`is_finished`)
    are yielded, so a report of a study still in progress can be drawn from them."""
    from cape.lab.report import write_json
    from cape.lab.train import distributed as D

    jobs = [(row, seed) for row in rows for seed in seeds]
    for i, (row, seed) in enumerate(jobs):
        folder = run_dir(out, row, seed)
        path = folder / "eval.json"
        if not train:
            done = is_finished(folder, None if cfg is None else run_settings(cfg, row))
            record = _cached_eval(path, set_damaged_aside=False) if done else None
            print(
                f"[{i + 1}/{len(jobs)}] {row.name} seed {seed}"
                f"{'' if record is not None else ': not finished, left out'}",
                flush=True,
            )
            if record is not None:
                yield row, seed, record
            continue
        print(f"[{i + 1}/{len(jobs)}] {row.name} seed {seed}", flush=True)
        stale = False
        if cfg is not None:
            settings = run_settings(cfg, row)
            stale = check_run_settings(folder, settings)  # every rank reads before rank 0 writes
            D.barrier()
            if D.get_rank() == 0:
                if stale:  # gone before the new settings are: a crash cannot pair them
                    path.unlink(missing_ok=True)
                write_json(folder / "settings.json", settings)
        done = None if stale else _cached_eval(path, set_damaged_aside=D.get_rank() == 0)
        if done is None:
            done = compute(row, seed, folder)
            if D.get_rank() == 0:
                write_json(path, done)
        yield row, seed, done


def _cached_eval(path: Path, *, set_damaged_aside: bool) -> dict[str, Any] | None:
    """A run's eval.json; None when it is absent or damaged (named in a warning; with
    `set_damaged_aside` set aside, so that the run is evaluated again from its checkpoint)."""
    import logging

    try:
        return read_json(path)
    except FileNotFoundError:  # absent, or set aside by rank 0 a moment ago
        return None
    except DamagedFile as e:
        if set_damaged_aside:
            set_aside(path, f"{e}; the run is evaluated again")
        else:
            logging.getLogger(__name__).warning("%s; the run is left out", e)
        return None


def is_finished(folder: Path, settings: dict[str, Any] | None) -> bool:
    """Whether run `folder` holds an `eval.json` that `cached_runs` would read back: one whose
    `settings.json` matches `settings` in every measured key (None: not checked). Reads only;
    ValueError as `check_run_settings` when a training setting differs."""
    if not (folder / "eval.json").is_file():
        return False
    return settings is None or not check_run_settings(folder, settings)


def finished_rows(cfg: Any, out: str | Path) -> list[str]:
    """The names of the rows of experiment config `cfg` with at least one finished seed in
    experiment folder `out` (`is_finished`), in config order."""
    return [
        row.name
        for row in cfg.rows
        if any(is_finished(run_dir(out, row, s), run_settings(cfg, row)) for s in cfg.seeds)
    ]


def read_results(out: str | Path) -> dict[str, Any]:
    """The results.json of a finished experiment folder (what `cape plot` and every report's
    `redraw` re-render from); ValueError naming the folder when it has none."""
    path = Path(out) / "results.json"
    if not path.is_file():
        raise ValueError(f"{str(out)!r} has no results.json: run `cape experiment` there first")
    try:
        return read_json(path)
    except DamagedFile as e:
        raise DamagedFile(f"{e}; `cape experiment` on this folder writes it again", path) from e


# what an experiment folder keeps without weights: enough to report it again and, copied back
# into an --out folder, to skip its finished runs (cached_runs reads eval.json + settings.json)
_ARCHIVED = ("report.md", "results.json", "config.yaml", "rows.yaml", "maps.npz", "*.png")
_ARCHIVED_PER_RUN = ("eval.json", "settings.json", "model.json")


def archive_runs(out: str | Path, dest: str | Path) -> list[Path]:
    """Copy experiment folder `out`'s report, results, config, plots and every finished run's
    `eval.json`, `settings.json` and `model.json` (no checkpoints) to `dest`, keeping the
    layout; returns the copied files. `cp -r DEST/. OUT/` in a fresh checkout lets the
    experiment reuse the runs."""
    import shutil

    out, dest = Path(out), Path(dest)
    if not (out / "results.json").is_file():
        raise ValueError(f"{str(out)!r} has no results.json: nothing to archive")
    # a run still training has no eval.json yet: it is archived once it has finished
    runs = [run for run in sorted(out.glob("*/seed*")) if is_finished(run, None)]
    sources = [src for pattern in _ARCHIVED for src in sorted(out.glob(pattern))]
    sources += [run / name for run in runs for name in _ARCHIVED_PER_RUN if (run / name).is_file()]
    copied = []
    for src in sources:
        target = dest / src.relative_to(out)
        atomic_write(target, lambda tmp, src=src: shutil.copyfile(src, tmp))
        copied.append(target)
    return copied


def summed_accuracy(correct: float, count: int) -> float:
    """Accuracy in % from this rank's `correct` of `count`, summed over ranks (each rank holds a
    shard of the test set); NaN when no rank has any sample."""
    from cape.lab.train import distributed as D

    m = D.all_reduce_mean({"correct": float(correct), "n": float(count)})
    return 100.0 * m["correct"] / m["n"] if m["n"] else float("nan")
