"""What a run leaves behind: metrics (JSONL, CSV, TensorBoard when installed), config and
environment records (`cape.lab.io.write_json`). `progress` (from `cape.lab.progress`) is
re-exported here for the engine's users."""

from __future__ import annotations

import csv
import importlib.metadata
import json
import logging
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from cape.lab.errors import DamagedFile
from cape.lab.io import atomic_write, write_json
from cape.lab.progress import progress
from cape.lab.train.distributed import get_world_size, is_main
from cape.lab.train.lock import make_folder

__all__ = [
    "MetricsLogger",
    "git_state",
    "progress",
    "read_metrics",
    "run_info",
    "write_run_record",
]

_log = logging.getLogger(__name__)


class MetricsLogger:
    """Appends one row per `log()` to `metrics.jsonl` and `metrics_<split>.csv` in `run_dir`,
    and scalars `<split>/<name>` to TensorBoard events in `run_dir/tensorboard` when the
    `tensorboard` package is installed (`tensorboard=False` turns that off).

    Every line is flushed, so a killed run keeps what it logged (TensorBoard events are flushed
    every 2 minutes and by `close()`). CSV columns are fixed by the first row of each split
    (later new keys go to JSONL only, which is the complete record).
    Only rank 0 writes; elsewhere every method is a no-op.

    Healing: a file whose last line was cut by a kill gets that line removed (with a warning
    naming the file) before anything is appended; `truncate` (the Trainer's resume) also drops
    damaged lines elsewhere and keeps one row per step and split (see there).
    """

    def __init__(
        self, run_dir: str | Path, *, enabled: bool | None = None, tensorboard: bool = True
    ) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = is_main() if enabled is None else enabled
        self._jsonl: Any = None
        self._csv: dict[str, tuple[Any, csv.DictWriter]] = {}
        self._tb: Any = None
        self._tb_class: Any = None
        self._purge_step: int | None = None
        if not self.enabled:
            return
        make_folder(self.run_dir)  # a file or read-only folder there: UsageError naming it
        if tensorboard:
            try:  # optional: torch's writer imports the tensorboard package
                from torch.utils.tensorboard import SummaryWriter

                self._tb_class = SummaryWriter
            except ImportError:
                self._tb_class = None

    @property
    def tensorboard_dir(self) -> Path:
        return self.run_dir / "tensorboard"

    def _tb_writer(self) -> Any:
        """The SummaryWriter (None without tensorboard), opened at the first `log()` and again
        after `close()`. After `truncate(step)` it purges the events of steps > `step` that an
        earlier run wrote, as the JSONL and CSV rows are dropped."""
        if self._tb is None and self._tb_class is not None:
            self._tb = self._tb_class(str(self.tensorboard_dir), purge_step=self._purge_step)
            self._purge_step = None
        return self._tb

    @property
    def jsonl_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    def csv_path(self, split: str) -> Path:
        return self.run_dir / f"metrics_{split}.csv"

    def log(self, step: int, metrics: dict[str, float], split: str = "train") -> None:
        if not self.enabled:
            return
        row = {"step": step, "split": split, **{k: float(v) for k, v in metrics.items()}}
        if self._jsonl is None:
            _cut_torn_line(self.jsonl_path)
            self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")  # noqa: SIM115
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        self._csv_writer(split, list(row)).writerow(row)
        self._csv[split][0].flush()
        tb = self._tb_writer()
        if tb is not None:
            for k, v in metrics.items():
                tb.add_scalar(f"{split}/{k}", float(v), step)

    def _csv_writer(self, split: str, keys: list[str]) -> csv.DictWriter:
        if split not in self._csv:
            path = self.csv_path(split)
            _cut_torn_line(path)
            header = None
            if path.exists() and path.stat().st_size > 0:  # resumed run: keep its columns
                with open(path, encoding="utf-8", newline="") as f:
                    header = next(csv.reader(f), None)
            fh = open(path, "a", encoding="utf-8", newline="")  # noqa: SIM115
            writer = csv.DictWriter(fh, fieldnames=header or keys, extrasaction="ignore")
            if header is None:
                writer.writeheader()
            self._csv[split] = (fh, writer)
        return self._csv[split][1]

    def truncate(self, step: int) -> None:
        """Drop rows logged after `step`: a resumed run logs the steps it repeats again, so no
        step appears twice. The files are healed on the way, each repair named in a warning:
        a torn last line is cut; a damaged line elsewhere (not a whole row, e.g. a torn line
        that rows were appended to without healing it first) is dropped, as its step's values
        cannot be trusted; of two rows for one step (and split) the later is kept."""
        if not self.enabled:
            return
        self.close()
        self._purge_step = step + 1
        for path in [self.jsonl_path, *sorted(self.run_dir.glob("metrics_*.csv"))]:
            if path.is_file():
                _keep_rows_to(path, step)

    def close(self) -> None:
        """Flush and close every file (TensorBoard events included); a later `log()` reopens."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        for fh, _ in self._csv.values():
            fh.close()
        self._csv = {}
        if self._tb is not None:
            self._tb.close()  # flushes the pending events and ends the writer thread
            self._tb = None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a `metrics.jsonl` (none when it does not exist). A torn last line (a write cut
    by a kill) is skipped with a warning naming the file; a damaged line before it raises
    DamagedFile naming the file and the line."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    torn = lines.pop()  # "" when the file ends with a newline
    if torn:
        _log.warning("%s: skipped its torn last line (a write interrupted)", path)
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise DamagedFile(f"{path}: line {n} is not a JSON row (the file is damaged)", path)
        rows.append(row)
    return rows


def _cut_torn_line(path: Path) -> None:
    """Remove a last line without its newline (a write cut by a kill) before appending."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    kept = data[: data.rfind(b"\n") + 1]
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(kept))
    _log.warning(
        "%s: cut its torn last line (%d bytes, a write interrupted)", path, len(data) - len(kept)
    )


def _row_key(line: str, header: list[str] | None) -> tuple[int, str] | None:
    """(step, split) of one JSONL row (`header` None) or CSV row; None for a damaged line."""
    try:
        if header is None:
            row = json.loads(line)
            step, split = row["step"], row.get("split", "")
        else:
            fields = next(csv.reader([line]))
            if len(fields) != len(header):
                return None
            step, split = int(fields[0]), ""
    except (ValueError, KeyError, TypeError, StopIteration):
        return None
    return (step, split) if isinstance(step, int) else None


def _keep_rows_to(path: Path, step: int) -> None:
    """Rewrite metrics file `path` with its whole rows of steps <= `step`, one per key."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    torn = lines.pop()  # "" when the file ends with a newline
    header: list[str] | None = None
    head: list[str] = []
    if path.suffix == ".csv" and lines:
        head = lines[:1]
        header = next(csv.reader(head))
        lines = lines[1:]
    rows: dict[tuple[int, str], str] = {}
    damaged, repeated = [], 0
    for n, line in enumerate(lines, len(head) + 1):
        if not line.strip():
            continue
        key = _row_key(line, header)
        if key is None:
            damaged.append(n)
        elif key[0] <= step:
            repeated += rows.pop(key, None) is not None
            rows[key] = line  # the later row of a step replaces the earlier
    body = "".join(line + "\n" for line in head + list(rows.values()))
    atomic_write(path, lambda tmp: Path(tmp).write_text(body, encoding="utf-8"))
    if torn:
        _log.warning("%s: cut its torn last line (a write interrupted)", path)
    if damaged:
        _log.warning("%s: dropped damaged line(s) %s (not a whole row)", path, damaged[:10])
    if repeated:
        _log.warning("%s: %d step(s) were logged twice; kept the later row", path, repeated)


def _git(args: list[str], cwd: Path) -> str:
    out = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5, check=True
    )
    return out.stdout


def git_state(path: Path) -> dict[str, Any] | None:
    """The checkout holding `path`: its commit and the tracked files that differ from it
    (`changed`, at most 50 listed, `changed_count` all of them). None outside a checkout or
    without git. A run trained from uncommitted code says so here, since its commit alone
    would not reproduce it."""
    try:
        commit = _git(["rev-parse", "HEAD"], path).strip()
        status = _git(["status", "--porcelain", "--untracked-files=no"], path)
    except (OSError, subprocess.SubprocessError):
        return None
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return {"commit": commit or None, "changed": changed[:50], "changed_count": len(changed)}


def _code_state() -> dict[str, Any] | None:
    # the package's own checkout first (an editable install), then the working directory
    for cwd in (Path(__file__).resolve().parent, Path.cwd()):
        state = git_state(cwd)
        if state is not None:
            return state
    return None


def run_info() -> dict[str, Any]:
    """Python and package versions, git commit and uncommitted changes (`git_changed`,
    `git_changed_count`; None outside a checkout), command line."""
    versions: dict[str, str | None] = {}
    for pkg in ("cape", "torch", "numpy", "safetensors", "tqdm", "tensorboard"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    code = _code_state()
    return {
        "python": sys.version,
        "platform": platform.platform(),
        "packages": versions,
        "git_commit": code["commit"] if code else None,
        "git_changed": code["changed"] if code else None,
        "git_changed_count": code["changed_count"] if code else None,  # the list stops at 50
        "argv": list(sys.argv),
        "world_size": get_world_size(),
    }


def write_run_record(run_dir: Path, config: dict[str, Any]) -> None:
    """`config.json` (the full config) and `env.json` (`run_info()`), written atomically."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "config.json", config)
    write_json(run_dir / "env.json", run_info())
