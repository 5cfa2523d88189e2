"""The `Experiment` base: what every paper experiment shares, and what each one must provide.

An experiment package has one layout: `config.py` (the config dataclass and its `PRESETS`),
`data.py` (what `make_data` returns), `model.py` (the model and its training loss),
`evaluate.py` (`eval_records`, `format_records`), `report.py` (`render`: report.md and plots
from results.json) and `experiment.py` (the `Experiment` subclass that ties them together,
registered in `cape.lab.experiments.EXPERIMENTS`).

The base runs a study (`run`: config.yaml, every (row, seed) trained and evaluated through
`cached_runs`, results.json and the report written by rank 0), loads a run's weights
(`load_run`), builds a run's `Trainer` (`trainer`) and redraws a report (`redraw`). A subclass
provides the abstract methods and overrides the hooks (`evaluate`, `gather`, `results`,
`write`) where its study keeps more than records and training summaries.
"""

from __future__ import annotations

import dataclasses
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import nn
from torch.utils.data import Dataset

from cape.lab.experiments.run_folders import cached_runs, read_results, run_dir
from cape.lab.experiments.study_config import StudyConfig, save_config
from cape.lab.experiments.train_as import trained_row
from cape.lab.io import atomic_write, disk_full_named, write_json
from cape.lab.train import TrainConfig, Trainer, is_checkpoint, seed_everything
from cape.lab.train import distributed as D
from cape.lab.train.checkpoint import latest_checkpoint, load_checkpoint, pick_checkpoint
from cape.lab.train.lock import holds_out
from cape.models import without_positions

__all__ = ["Experiment", "Run", "Study", "Collected", "parameter_counts", "rank_slice"]

ConfigT = TypeVar("ConfigT", bound=StudyConfig)
DataT = TypeVar("DataT")
Records = Any  # a list of records, or a mapping holding them (translation's eval_records)
Row = Any  # an entry of the config's `rows`: the study's row dataclass (its `name` is unique)


@dataclass(frozen=True)
class Run(Generic[ConfigT]):
    """One (row, seed) of config `cfg`, trained in the engine run folder `folder`."""

    cfg: ConfigT
    row: Row
    seed: int
    folder: Path


@dataclass
class Study(Generic[ConfigT, DataT]):
    """What one `Experiment.run` call holds: the config, its mapping, the experiment folder,
    the data and the distributed context (`dist.rank`, `dist.device`)."""

    cfg: ConfigT
    mapping: dict[str, Any]
    out: Path
    data: DataT
    dist: D.DistInfo


@dataclass
class Collected:
    """What the runs left, gathered in config order: every record, the training summaries by
    "row/seed<k>", parameter counts by row, and what an experiment keeps besides (`extra`)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    train: dict[str, dict[str, Any]] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def rank_slice() -> slice:
    """This rank's share of a sequence, every world-size-th item from its rank: `x[rank_slice()]`
    of a tensor or list, `range(n)[rank_slice()]` for the indices of n items."""
    return slice(D.get_rank(), None, D.get_world_size())


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """Trainable parameters of the whole model ("total") and of its position encodings, every
    layer's ("position": the modules whose `kind` is "absolute" or "attention")."""

    def count(m: nn.Module) -> int:
        return sum(p.numel() for p in m.parameters() if p.requires_grad)

    encodings = [
        m for m in model.modules() if getattr(m, "kind", None) in ("absolute", "attention")
    ]
    return {"total": count(model), "position": sum(count(m) for m in encodings)}


class Experiment(ABC, Generic[ConfigT, DataT]):
    """One paper experiment. Class attributes: `name` (the CLI's), `config_cls` (the study's
    `StudyConfig` subclass), `presets` (name -> mapping),
    `default_preset`, `preset_notes` (preset name -> one line, what `--help` says of it);
    `best_weights`: runs keep and load the checkpoint of the best validation metric (else the
    latest); `loads_for_evaluation`: `load_run` builds the row's evaluation model (its
    `eval_options`) rather than its trained row's model."""

    name: ClassVar[str]
    config_cls: ClassVar[type[StudyConfig]]
    presets: ClassVar[dict[str, dict[str, Any]]]
    default_preset: ClassVar[str] = "quick"
    preset_notes: ClassVar[dict[str, str]] = {}
    best_weights: ClassVar[bool] = False
    loads_for_evaluation: ClassVar[bool] = False

    def __init_subclass__(cls, *, evaluate: Any = None, report: Any = None, **kwargs: Any) -> None:
        """`evaluate`, `report`: the experiment package's modules (the layout above), whose
        `eval_records`, `format_records` and `render` the subclass takes as its own."""
        super().__init_subclass__(**kwargs)
        if evaluate is not None:
            cls.eval_records = staticmethod(evaluate.eval_records)
            cls.format_records = staticmethod(evaluate.format_records)
        if report is not None:
            cls.render = staticmethod(report.render)

    # --- what each experiment provides -------------------------------------------------------

    @abstractmethod
    def make_data(self, cfg: ConfigT) -> DataT:
        """The data of every split the config names (made or read from its cache)."""

    @abstractmethod
    def make_model(
        self, cfg: ConfigT, row: Row, data: DataT | None, *, evaluation: bool = False
    ) -> nn.Module:
        """The row's untrained model; with `evaluation`, its encoding takes the row's
        `eval_options` too (rows that have them)."""

    @abstractmethod
    def fit(self, run: Run[ConfigT], data: DataT, model: nn.Module) -> tuple[nn.Module, dict]:
        """Train `model` (freshly seeded) for `run`, resuming from the checkpoints in its folder
        (`self.trainer`, `self.fitted`) -> (model, training summary)."""

    @abstractmethod
    def eval_records(
        self,
        cfg: ConfigT,
        row: Row,
        seed: int,
        model: nn.Module,
        data: DataT,
        device: torch.device,
    ) -> Records:
        """Every measurement the config asks for, of one trained model (on `device`)."""

    @abstractmethod
    def format_records(self, records: Records) -> str:
        """The evaluation records as a markdown table (what `cape eval` prints)."""

    @abstractmethod
    def render(self, out: Path, results: dict[str, Any]) -> Path:
        """report.md and the plots in `out` from `results`; returns report.md's path."""

    # --- one run -----------------------------------------------------------------------------

    run_dir = staticmethod(run_dir)

    @staticmethod
    def trained_row(cfg: StudyConfig, row: Row) -> Row:
        """The row whose weights `row` evaluates: the one its `train_as` names, else itself."""
        return trained_row(cfg.rows, row) if getattr(row, "train_as", None) else row

    def train_run(
        self, cfg: ConfigT, row: Row, seed: int, out: str | Path, data: DataT
    ) -> tuple[nn.Module, dict[str, Any]]:
        """Train one (row, seed) into `run_dir(out, row, seed)`, resuming from its checkpoints
        -> (model, summary); a `train_as` row trains (or resumes) the row it names."""
        row = self.trained_row(cfg, row)
        seed_everything(seed)
        model = self.make_model(cfg, row, data)
        return self.fit(Run(cfg, row, seed, run_dir(out, row, seed)), data, model)

    def weights_folder(self, cfg: ConfigT, row: Row, seed: int, out: str | Path) -> Path:
        """The engine run folder holding the final weights of (row, seed)."""
        return run_dir(out, self.trained_row(cfg, row), seed)

    def load_run(
        self, cfg: ConfigT, row: Row, seed: int, out: str | Path, data: DataT | None = None
    ) -> nn.Module:
        """The weights of a trained run (those of the row its `train_as` names): the best
        checkpoint with `best_weights` (else the latest), in the row's model."""
        source = self.trained_row(cfg, row)
        folder = self.weights_folder(cfg, row, seed, out)
        if self.best_weights:
            path = pick_checkpoint(folder / "checkpoints", "best")
        else:
            path = latest_checkpoint(folder / "checkpoints")
            if path is None:
                raise FileNotFoundError(
                    f"no checkpoint in {folder}; train it first "
                    f"(cape train {self.name} --row {source.name!r})"
                )
        if self.loads_for_evaluation:
            model = self.make_model(cfg, row, data, evaluation=True)
        else:
            model = self.make_model(cfg, source, data)
        load_checkpoint(path, model)
        return model

    def trainer(
        self,
        run: Run[ConfigT],
        model: nn.Module,
        loss_fn: Callable[..., Any],
        train_set: Dataset,
        eval_fn: Callable[[nn.Module], dict[str, float]],
        collate: Callable[..., Any] | None = None,
        *,
        train: TrainConfig | None = None,
        batches: Any = None,
        **record: Any,
    ) -> Trainer:
        """The engine of `run`: `train` (default the config's) with the run's seed, and the
        experiment record {"experiment", "row", "seed", **record, "config"}."""
        cfg, seed = run.cfg, run.seed
        experiment = {"experiment": self.name, "row": run.row.name, "seed": seed, **record}
        experiment["config"] = dataclasses.asdict(cfg)
        tcfg = dataclasses.replace(train or cfg.train, seed=seed)
        return Trainer(
            model,
            loss_fn,
            train_set,
            eval_fn,
            tcfg,
            run.folder,
            collate,
            experiment=experiment,
            batches=batches,
        )

    def save_spec(
        self, run: Run[ConfigT], model: nn.Module, bpe: Path | None = None, **extra: Any
    ) -> None:
        """Rank 0 writes the run folder's model.json: the model's `spec`, the experiment, the
        row and `extra` (what `cape transcribe`, `cape translate` and `cape generate` rebuild a
        model from), then a copy of the tokenizer's `bpe` model as bpe.model, if given."""
        if D.get_rank() == 0:
            run.folder.mkdir(parents=True, exist_ok=True)
            spec = {"model": model.spec, "experiment": self.name, "row": run.row.name, **extra}
            write_json(run.folder / "model.json", spec)
            if bpe is not None:
                atomic_write(run.folder / "bpe.model", lambda tmp: shutil.copyfile(bpe, tmp))

    def fitted(self, trainer: Trainer) -> tuple[nn.Module, dict[str, Any]]:
        """Run `trainer` (resuming) -> (model, summary): with `best_weights`, the model holds
        the weights of the best validation metric when a best/ checkpoint was saved."""
        with disk_full_named(trainer.run_dir):  # torch's checkpoint writer: one line, the folder
            summary = trainer.fit(resume=True)
        best = trainer.run_dir / "checkpoints" / "best"
        if self.best_weights and is_checkpoint(best):
            load_checkpoint(best, trainer.model)
        return trainer.model, summary

    # --- a study -----------------------------------------------------------------------------

    def run(
        self, cfg: ConfigT, mapping: dict[str, Any], out: str | Path, *, train: bool = True
    ) -> dict[str, Any]:
        """Train and evaluate every (row, seed), then write the report; returns the results.
        With `train=False`, report only the runs that have finished (`--finished`). The
        folder is locked for the whole call; rank 0 saves config.yaml first."""
        return holds_out(self._run)(cfg, mapping, out, train=train)

    def _run(
        self, cfg: ConfigT, mapping: dict[str, Any], out: str | Path, *, train: bool = True
    ) -> dict[str, Any]:
        out = Path(out)
        dist = D.init_distributed(cfg.train.device)
        if dist.rank == 0:
            save_config(out / "config.yaml", mapping)
        study = Study(cfg, mapping, out, self.make_data(cfg), dist)
        got = Collected()

        def compute(row: Row, seed: int, folder: Path) -> dict[str, Any]:
            return self.compute(study, row, seed, folder)

        runs = cached_runs(cfg.rows, cfg.seeds, out, compute, cfg, train=train)
        for row, seed, done in runs:
            self.gather(study, got, row, seed, done)
        results = {"experiment": self.name, "name": cfg.name, "config": mapping}
        results.update(self.results(study, got))
        if dist.rank == 0:
            self.write(study, results, got)
        D.barrier()
        return results

    def evaluated_model(
        self, study: Study[ConfigT, DataT], row: Row, seed: int
    ) -> tuple[nn.Module, dict]:
        """The model a run is evaluated with, and its training summary: a `train_as` row's
        weights are those of an earlier row (loaded), the others are trained here and take
        their `eval_options` (`for_evaluation`)."""
        cfg, out, data = study.cfg, study.out, study.data
        if getattr(row, "train_as", None) is not None:
            model = self.load_run(cfg, row, seed, out, data)
            return model.to(study.dist.device), {"train_as": row.train_as}
        model, summary = self.train_run(cfg, row, seed, out, data)
        return self.for_evaluation(cfg, row, model), summary

    def for_evaluation(self, cfg: ConfigT, row: Row, model: nn.Module) -> nn.Module:
        """A trained model as the row evaluates it (default: itself)."""
        return model

    def compute(
        self, study: Study[ConfigT, DataT], row: Row, seed: int, folder: Path
    ) -> dict[str, Any]:
        """What one (row, seed) leaves in its eval.json: trained (resumable), then evaluated."""
        model, summary = self.evaluated_model(study, row, seed)
        model.to(study.dist.device).eval()
        done = {**self.evaluate(study, row, seed, model, folder), "summary": summary}
        self.measure_removed(study, row, seed, model, done)
        if self.counts_parameters:
            done["params"] = parameter_counts(model)
        return done

    counts_parameters: ClassVar[bool] = False
    """`compute` keeps the run's `parameter_counts` (results' "params" by row)."""

    def removed_metric(
        self, study: Study[ConfigT, DataT], row: Row, seed: int, model: nn.Module
    ) -> float | None:
        """The study's main metric at the training size, measured on `model` (None: this
        experiment has no such measurement). `measure_removed` calls it with the model's
        positions taken out."""
        return None

    def removed_records(
        self, study: Study[ConfigT, DataT], row: Row, seed: int, model: nn.Module
    ) -> list[dict[str, Any]]:
        """Evaluation records measured on `model`, for a study whose report tabulates the
        positions-removed check beyond its main metric (vision: accuracy at every test size;
        speech: WER and CER per duration bin). `measure_removed` calls it with the model's
        positions taken out; default: none."""
        return []

    def measure_removed(
        self, study: Study[ConfigT, DataT], row: Row, seed: int, model: nn.Module, done: dict
    ) -> None:
        """The positions-removed check of a run (`cape.models.without_positions`): with every
        position the model holds taken out at test time, `removed_metric` becomes `done`'s
        "removed" ({"row", "seed", "value"}) and `removed_records` join `done["records"]`;
        nothing for a model without positions."""
        with without_positions(model) as had:
            if not had:
                return
            value = self.removed_metric(study, row, seed, model)
            records = self.removed_records(study, row, seed, model)
        if value is not None:
            done["removed"] = {"row": row.name, "seed": seed, "value": value}
        if records:
            done["records"] = [*done["records"], *records]

    def evaluate(
        self, study: Study[ConfigT, DataT], row: Row, seed: int, model: nn.Module, folder: Path
    ) -> dict[str, Any]:
        """The evaluation part of a run's eval.json (default: `eval_records`' mapping, where it
        gives one that holds the records and more, else {"records": its list})."""
        records = self.eval_records(study.cfg, row, seed, model, study.data, study.dist.device)
        return records if isinstance(records, dict) else {"records": records}

    def gather(
        self, study: Study[ConfigT, DataT], got: Collected, row: Row, seed: int, done: dict
    ) -> None:
        """Add what one (row, seed) left (`done`, its eval.json) to `got`."""
        got.records += done["records"]
        got.train[f"{row.name}/seed{seed}"] = done["summary"]
        if "removed" in done:
            got.extra.setdefault("removed", []).append(done["removed"])
        if "params" in done:
            got.params[row.name] = done["params"]

    def results(self, study: Study[ConfigT, DataT], got: Collected) -> dict[str, Any]:
        """results.json after "experiment", "name" and "config" (default: the records, any
        `extra`, the training summaries and, where counted, the parameters)."""
        out = {"records": got.records, **got.extra, "train": got.train}
        return {**out, "params": got.params} if self.counts_parameters else out

    def write(self, study: Study[ConfigT, DataT], results: dict[str, Any], got: Collected) -> Path:
        """Rank 0's end of a study: results.json, the plots and report.md; returns report.md's
        path."""
        write_json(study.out / "results.json", results)
        return self.render(study.out, results)

    # --- reports -----------------------------------------------------------------------------

    def redraw(self, folder: str | Path) -> Path:
        """Re-render report.md and the plots of a finished experiment folder (`cape plot`)."""
        return self.render(Path(folder), read_results(folder))
