"""What every experiment shares: config resolution (preset -> files -> `--set`), run folders."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cape.lab.config import apply_overrides, from_mapping, load_file, to_mapping
from cape.lab.errors import DamagedFile
from cape.lab.io import atomic_write, read_json, set_aside

__all__ = [
    "merge",
    "resolve_config",
    "slug",
    "save_config",
    "check_runs",
    "check_best_metric",
    "run_dir",
    "run_settings",
    "check_run_settings",
    "fit_best",
    "cached_runs",
    "is_finished",
    "finished_rows",
    "read_results",
    "archive_runs",
    "summed_accuracy",
    "plot_ok",
    "seeds_by_row",
    "train_cost_table",
]


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else (lists included) replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_config(
    cls: type,
    presets: Mapping[str, Mapping[str, Any]],
    preset: str | None = None,
    files: Sequence[str | Path] = (),
    overrides: Sequence[str] = (),
) -> tuple[Any, dict[str, Any]]:
    """The config dataclass `cls` from a preset, then each YAML/TOML file, then `key=value`
    overrides; returns (config, the resolved plain mapping for the run record)."""
    if preset is not None and preset not in presets:
        raise ValueError(f"preset must be one of {sorted(presets)}, got {preset!r}")
    mapping: dict[str, Any] = copy.deepcopy(dict(presets[preset])) if preset else {}
    for f in files:
        mapping = merge(mapping, load_file(f))
    mapping = apply_overrides(mapping, overrides)
    config = from_mapping(cls, mapping)
    return config, to_mapping(config)


_GREEK = {"λ": "lambda", "Δ": "delta", "ε": "eps", "γ": "gamma"}


def slug(name: str) -> str:
    """A folder name for a row: "CAPE λ=1" -> "cape-lambda1"."""
    for k, v in _GREEK.items():
        name = name.replace(k, v)
    name = re.sub(r"[^a-z0-9.@+]+", "-", name.lower().replace("=", ""))
    return name.strip("-") or "row"


def save_config(path: str | Path, mapping: Mapping[str, Any]) -> Path:
    """The resolved config as YAML (atomic): `cape experiment --config` reads it back."""
    import yaml

    text = yaml.safe_dump(dict(mapping), sort_keys=False, allow_unicode=True)
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def check_position(key: str, name: object) -> str:
    """A row's `position` must be a `cape.build` name (the one vocabulary of encodings)."""
    from cape.build import ENCODINGS

    if not isinstance(name, str) or name.lower() not in ENCODINGS:
        raise ValueError(
            f"{key} must be a cape.build name, one of {sorted(ENCODINGS)}, got {name!r}"
        )
    return name.lower()


def check_runs(rows: Sequence[Any], seeds: Sequence[int]) -> None:
    """What every experiment config needs: >= 1 row, >= 1 seed, unique `rows[].name`."""
    if not rows:
        raise ValueError("rows must list at least one model (name, position)")
    if not seeds:
        raise ValueError("seeds must list at least one seed")
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
        raise ValueError(f"rows[].name must be unique, got {names}")


def check_best_metric(train: Any, metric: str, mode: str, what: str) -> None:
    """The checkpoint is chosen on `metric` (`mode`), the only eval metric; `what` says why."""
    if (train.best_metric, train.best_mode) != (metric, mode):
        raise ValueError(
            f"train.best_metric must be {metric!r} with train.best_mode {mode!r} "
            f"({what}), got {train.best_metric!r}, {train.best_mode!r}"
        )


def run_dir(out: str | Path, row: Any, seed: int) -> Path:
    """The engine run folder of one (row, seed): `<out>/<slug(row.name)>/seed<seed>`."""
    return Path(out) / slug(row.name) / f"seed{seed}"


def fit_best(trainer: Any) -> tuple[Any, dict[str, float]]:
    """Train (resuming from the run's checkpoints), then load the weights of the best eval
    metric when a best/ checkpoint was saved; -> (model, the training summary)."""
    from cape.lab.train.checkpoint import is_checkpoint, load_checkpoint

    summary = trainer.fit(resume=True)
    best = trainer.run_dir / "checkpoints" / "best"
    if is_checkpoint(best):
        load_checkpoint(best, trainer.model)
    return trainer.model, summary


# Settings that do not change what a run trains; "eval" changes only what is measured after,
# except the eval keys that decide which checkpoint is kept (the validation set and decoding).
_NOT_TRAINING = (
    "name",
    "seeds",
    "rows",
    "data.workers",
    "train.log_every",
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


def check_run_settings(folder: Path, settings: dict[str, Any]) -> bool:
    """Compare a run folder's `settings.json` (if any) with `settings`; reads only. True when
    `eval.*` keys differ (what was measured must be measured again), False when nothing does or
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
    diff = sorted(
        k
        for k in set(old) | set(settings)
        if old.get(k) != settings.get(k) and not k.startswith(_NOT_TRAINING)
    )
    training = [k for k in diff if not k.startswith("eval.") or k in _PICKS_CHECKPOINT]
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
_ARCHIVED_PER_RUN = ("eval.json", "settings.json")


def archive_runs(out: str | Path, dest: str | Path) -> list[Path]:
    """Copy experiment folder `out`'s report, results, config, plots and every finished run's
    `eval.json` and `settings.json` (no checkpoints) to `dest`, keeping the layout; returns the
    copied files. `cp -r DEST/. OUT/` in a fresh checkout lets the experiment reuse the runs."""
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


def plot_ok() -> bool:
    """Whether matplotlib (the `plot` extra) is there: reports skip their PNGs without it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def seeds_by_row(results: Mapping[str, Any]) -> dict[str, list[int]]:
    """The seeds each row of `results` holds, from its runs (`results["train"]` keys
    "row/seedN"), in the order they ran: a report drawn with `--finished` may hold fewer seeds
    for some rows than the config lists."""
    seeds: dict[str, list[int]] = {}
    for key in results.get("train", {}):
        row, _, seed = key.rpartition("/seed")
        seeds.setdefault(row, []).append(int(seed))
    return seeds


def train_cost_table(
    rep: Any, results: Mapping[str, Any], metric: str = "eval_acc", label: str = "final val acc"
) -> None:
    """The training cost of every run (`results["train"]`: name -> the Trainer's summary) as a
    table of `rep` (`cape.lab.report.Report`): compute and data-loading seconds, the loader's share,
    the engine's overhead and the final validation `metric`, with its best value (that of the
    checkpoint kept, `best_<metric>` in the summary) where the run recorded one."""
    lines = [
        f"| run | train s | data s | loader share | engine overhead | {label} |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in results["train"].items():
        total = sum(s.get(f"time_{k}", 0.0) for k in ("data", "compute", "log", "checkpoint"))
        digits = 3 if metric == "eval_bpd" else 1
        value, best = s.get(metric, float("nan")), s.get(f"best_{metric}")
        value_s = "–" if math.isnan(value) else f"{value:.{digits}f}"
        if best is not None and f"{best:.{digits}f}" != value_s:
            value_s += f" (best {best:.{digits}f})"
        if not total:  # re-evaluated from a checkpoint that predates the time record
            lines.append(f"| {name} | – | – | – | – | {value_s} |")
            continue
        lines.append(
            f"| {name} | {s.get('time_compute', 0):.0f} | {s.get('time_data', 0):.1f} | "
            f"{s.get('time_data', 0.0) / total:.1%} | "
            f"{s.get('engine_overhead', float('nan')):.1%} | {value_s} |"
        )
    rep.table(
        "\n".join(lines),
        caption="Training cost per run (every session of a resumed run); "
        "–: not recorded (a run evaluated again from a checkpoint older than that record).",
    )
