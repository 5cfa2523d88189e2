"""`cape experiment | train | eval | plot`: the experiments from the command line.

Configs: `--preset NAME` (default: the experiment's quick preset), then each `--config FILE`
(YAML or TOML) merged on top, then each `--set key.sub=value`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cape.lab.arguments import ArgumentParser, check_out_folder
from cape.lab.config import from_mapping
from cape.lab.errors import UsageError
from cape.lab.experiments import EXPERIMENTS, Experiment, resolve_config
from cape.lab.experiments.run_folders import (
    archive_runs,
    check_run_settings,
    finished_rows,
    read_results,
    run_settings,
)
from cape.lab.experiments.study_config import MAX_SEED

__all__ = ["experiment_main", "train_main", "eval_main", "plot_main"]


def _wrapped(head: str, words: list[str], indent: int, width: int = 100) -> list[str]:
    """`head` then `words` (kept whole: row names hold spaces and hyphens) in lines of at most
    `width` characters (one word alone may be longer), the later lines indented."""
    lines, line = [], head
    for word in words:
        if line.strip() and len(line) + len(word) > width:
            lines.append(line.rstrip())
            line = " " * indent
        line += word
    return [*lines, line.rstrip()]


def presets_help(exp: Experiment, row_flag: str = "--rows NAME,NAME") -> str:
    """What `cape experiment NAME --help` adds: each preset of `exp` in one line (its rows, seeds
    and steps, then its note), then the names of the rows each preset runs (`row_flag` picks among
    them)."""
    width = max(len(name) for name in exp.presets) + 4
    lines = [f"presets of {exp.name} (--preset NAME, default {exp.default_preset}):"]
    rows = [f"rows of each preset ({row_flag}):"]
    for name in exp.presets:
        cfg, _ = resolve_config(exp.config_cls, exp.presets, name)
        n_rows, n_seeds = len(cfg.rows), len(cfg.seeds)
        size = (
            f"{n_rows} row{'s' * (n_rows != 1)} x {n_seeds} seed{'s' * (n_seeds != 1)}, "
            f"{cfg.train.steps} steps"
        )
        note = exp.preset_notes.get(name, "")
        lines.append(f"  {name:{width - 2}s}{size}{': ' + note if note else ''}")
        names = [r.name for r in cfg.rows]
        rows += _wrapped(
            f"  {name:{width - 2}s}", [n + ", " for n in names[:-1]] + names[-1:], width
        )
    return "\n".join([*lines, "", *rows])


def _help_of(argv: list[str], row: bool) -> str | None:
    """The presets and rows of the experiment `argv` names when it asks for --help, else None
    (resolving every preset is for the help only)."""
    if not {"-h", "--help"} & set(argv):
        return None
    name = next((a for a in argv if a in EXPERIMENTS), None)
    if name is None:
        return None
    return presets_help(EXPERIMENTS[name], "--row NAME" if row else "--rows NAME,NAME")


def _parser(prog: str, *, row: bool, argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog=prog,
        epilog=_help_of(list(argv), row),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", choices=sorted(EXPERIMENTS), help="which experiment")
    p.add_argument(
        "--preset",
        default=None,
        help="a preset of the experiment (default: its own default preset, mostly quick); "
        f"`{prog} NAME --help` lists them, their rows and which is the default",
    )
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="YAML/TOML config merged over the preset (repeatable)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="override one value, e.g. --set train.steps=100 (repeatable)",
    )
    p.add_argument("--out", type=Path, default=None, help="experiment folder (default runs/<name>)")
    if row:
        p.add_argument("--row", required=True, help="the row (model) name, as in the config's rows")
        p.add_argument("--seed", type=int, default=None, help="seed (default: the config's first)")
    else:
        p.add_argument(
            "--rows",
            default=None,
            metavar="NAME,NAME",
            help="run only these rows of the config (comma-separated names)",
        )
        p.add_argument(
            "--print-config", action="store_true", help="print the resolved config as YAML and exit"
        )
        p.add_argument(
            "--finished",
            action="store_true",
            help="train nothing: report the runs of --out that have finished "
            "(a study in progress); rows with none are left out",
        )
    return p


def _resolve(args: argparse.Namespace) -> tuple[Any, dict[str, Any], Path]:
    exp = EXPERIMENTS[args.name]
    preset = args.preset or (None if args.config else exp.default_preset)
    cfg, mapping = resolve_config(exp.config_cls, exp.presets, preset, args.config, args.overrides)
    if getattr(args, "rows", None):
        names = [n.strip() for n in args.rows.split(",") if n.strip()]
        known = [r["name"] for r in mapping["rows"]]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise UsageError(f"--rows must name rows of the config {known}, got {unknown or names}")
        cfg, mapping = _keep_rows(exp, mapping, names)
    out = args.out or Path("runs") / cfg.name
    try:  # the run folders' paths are written into their JSON records (UTF-8)
        str(out).encode("utf-8")
    except UnicodeEncodeError:
        raw = str(out).encode("utf-8", "surrogateescape")
        raise UsageError(
            f"--out {raw!r} is not a UTF-8 path; give a folder name in UTF-8"
        ) from None
    return cfg, mapping, out


def _keep_rows(
    exp: Experiment, mapping: dict[str, Any], names: list[str]
) -> tuple[Any, dict[str, Any]]:
    """The config and mapping with only the rows `names`."""
    mapping = {**mapping, "rows": [r for r in mapping["rows"] if r["name"] in names]}
    ev = mapping.get("eval", {})  # eval lists of row names (e.g. hop_rows) keep the chosen
    mapping["eval"] = {
        k: [n for n in v if n in names] if k.endswith("_rows") else v for k, v in ev.items()
    }
    return from_mapping(exp.config_cls, mapping), mapping


def _row(cfg: Any, args: argparse.Namespace) -> tuple[Any, int]:
    rows = {r.name: r for r in cfg.rows}
    if args.row not in rows:
        raise UsageError(f"--row must be one of {sorted(rows)}, got {args.row!r}")
    if args.seed is not None and not 0 <= args.seed <= MAX_SEED:
        raise UsageError(f"--seed must be an int in [0, 2**63 - 1], got {args.seed}")
    seed = cfg.seeds[0] if args.seed is None else args.seed
    return rows[args.row], seed


def experiment_main(argv: list[str]) -> int:
    """Train, evaluate and report every row and seed; resumes what an earlier call left."""
    args = _parser("cape experiment", row=False, argv=argv).parse_args(argv)
    cfg, mapping, out = _resolve(args)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(mapping, sort_keys=False, allow_unicode=True), end="")
        return 0
    check_out_folder(out, "--out")  # before any training: a file or a read-only folder
    if args.finished:
        names = finished_rows(cfg, out)
        if not names:
            raise UsageError(
                f"--finished: {str(out)!r} holds no finished run of the rows "
                f"{[r.name for r in cfg.rows]} (see --out, --preset, --rows)"
            )
        cfg, mapping = _keep_rows(EXPERIMENTS[args.name], mapping, names)
    EXPERIMENTS[args.name].run(cfg, mapping, out, train=not args.finished)
    print(f"report: {out / 'report.md'}")
    return 0


def train_main(argv: list[str]) -> int:
    """Train one row and seed of an experiment into <out>/<row>/seed<k> (resumable)."""
    args = _parser("cape train", row=True, argv=argv).parse_args(argv)
    cfg, _, out = _resolve(args)
    check_out_folder(out, "--out")  # before the data are made and training starts
    exp = EXPERIMENTS[args.name]
    row, seed = _row(cfg, args)
    # a folder a study trained (its settings.json) with other settings: named before any work
    check_run_settings(exp.run_dir(out, exp.trained_row(cfg, row), seed), run_settings(cfg, row))
    data = exp.make_data(cfg)
    _, summary = exp.train_run(cfg, row, seed, out, data)
    for key in sorted(summary):
        if isinstance(summary[key], (int, float)):
            print(f"{key:16s} {summary[key]:.4g}")
    print(f"run: {exp.run_dir(out, row, seed)}")
    return 0


def eval_main(argv: list[str]) -> int:
    """Evaluate one trained row and seed as the config says; prints and saves eval.json."""
    args = _parser("cape eval", row=True, argv=argv).parse_args(argv)
    cfg, _, out = _resolve(args)
    exp = EXPERIMENTS[args.name]
    row, seed = _row(cfg, args)
    run = exp.run_dir(out, row, seed)
    if not run.is_dir():  # before the data are made: they can take minutes
        raise UsageError(
            f"no run {str(run)!r}: train it first (cape train {args.name} --row {row.name} "
            f"--seed {seed} with the same --out, --preset, --config and --set)"
        )
    check_out_folder(run, "the run folder")  # eval_only.json goes there
    data = exp.make_data(cfg)
    model = exp.load_run(cfg, row, seed, out, data)
    records = exp.eval_records(cfg, row, seed, model, data, next(model.parameters()).device)
    print(exp.format_records(records))
    from cape.lab.report import write_json

    write_json(run / "eval_only.json", {"records": records})
    return 0


def plot_main(argv: list[str]) -> int:
    """Redraw report.md and the plots of an experiment folder from its results.json."""
    p = ArgumentParser(prog="cape plot")
    p.add_argument("folder", type=Path, help="an experiment folder holding results.json")
    p.add_argument(
        "--archive",
        type=Path,
        default=None,
        metavar="DEST",
        help="then copy the report, its plots and each run's eval.json, settings.json and "
        "model.json to DEST (e.g. results/NAME), without weights",
    )
    args = p.parse_args(argv)
    if not args.folder.is_dir():
        what = "is a file, not a folder" if args.folder.exists() else "does not exist"
        raise UsageError(f"{str(args.folder)!r} {what}; give an experiment folder")
    check_out_folder(args.folder, "folder")  # the report and plots are written there
    if args.archive is not None:
        check_out_folder(args.archive, "--archive")
    try:
        results = read_results(args.folder)
    except json.JSONDecodeError as e:  # a damaged file is named, not only the JSON error
        raise UsageError(f"{args.folder / 'results.json'} is not valid JSON: {e}") from e
    name = results.get("experiment") if isinstance(results, dict) else None
    if name not in EXPERIMENTS:
        raise UsageError(
            f"{args.folder / 'results.json'} names experiment {name!r}; "
            f"known: {sorted(EXPERIMENTS)}"
        )
    print(f"report: {EXPERIMENTS[name].redraw(args.folder)}")
    if args.archive is not None:
        print(f"archived {len(archive_runs(args.folder, args.archive))} files to {args.archive}")
    return 0
