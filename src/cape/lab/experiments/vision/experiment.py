"""The vision experiment: ViTs with each encoding trained at one resolution, tested at others.

`VISION.run(cfg, mapping, out)`: for every row and seed, train (resumable; a row with
`finetune_size` is then fine-tuned, in `ft/`), evaluate (`eval_records`, cached in the run
folder's `eval.json`), then write `results.json`, `report.md` and the plots. Layout of `out`:
`config.yaml`, `<row>/seed<k>/` (engine run folder: metrics, checkpoints, eval.json),
`results.json`, `maps.npz`, `report.md`, `*.png`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from cape.lab.experiments.base import Collected, Experiment, Run, Study, rank_slice
from cape.lab.experiments.vision import evaluate, report
from cape.lab.experiments.vision.config import PRESET_NOTES, PRESETS, RowConfig, VisionConfig
from cape.lab.experiments.vision.data import VisionData
from cape.lab.experiments.vision.model import classify_loss, make_model
from cape.lab.io import write_json
from cape.lab.train import Trainer
from cape.models.vit import ViT

__all__ = ["VisionExperiment", "VISION"]


class VisionExperiment(Experiment[VisionConfig, VisionData], evaluate=evaluate, report=report):
    """Rows of `VisionConfig`; the report adds the position maps of each row's first seed and
    every row's throughput."""

    name, config_cls, presets = "vision", VisionConfig, PRESETS
    preset_notes = PRESET_NOTES

    def make_data(self, cfg: VisionConfig) -> VisionData:
        """The images the config names (rendered and cached on first use)."""
        return VisionData(cfg.data)

    def make_model(
        self, cfg: VisionConfig, row: RowConfig, data: Any, *, evaluation: bool = False
    ) -> ViT:
        """The row's ViT; `data`: the `VisionData` or its number of classes."""
        return make_model(cfg, row, data if isinstance(data, int) else data.num_classes)

    def weights_folder(self, cfg: VisionConfig, row: RowConfig, seed: int, out: str | Path) -> Path:
        """The run folder, or its fine-tune's (`ft/`) when the row fine-tunes."""
        return self.run_dir(out, row, seed) / ("ft" if row.finetune_size else "")

    def fit(
        self, run: Run[VisionConfig], data: VisionData, model: nn.Module
    ) -> tuple[nn.Module, dict[str, Any]]:
        """Train at `train_size`; with a fine-tune, also the "+ft" model (in `ft/`), returned."""
        model, summary = self.fitted(self._trainer(run, data, model))
        if run.row.finetune_size:
            ft = dataclasses.replace(run, folder=run.folder / "ft")
            model, tuned = self.fitted(self._trainer(ft, data, model, finetune=True))
            summary = {**summary, **{f"ft_{k}": v for k, v in tuned.items()}}
        return model, summary

    def _trainer(
        self, run: Run[VisionConfig], data: VisionData, model: nn.Module, *, finetune: bool = False
    ) -> Trainer:
        """The engine for a row's training (at `train_size`, UniViT sizes drawn per batch) or for
        its fine-tune (at `finetune_size`, lr / 10, `finetune_steps`)."""
        cfg, row = run.cfg, run.row
        size = row.finetune_size if finetune else row.train_size
        tcfg = cfg.train
        if finetune:
            steps = row.finetune_steps
            tcfg = dataclasses.replace(
                tcfg,
                steps=steps,
                lr=tcfg.lr * 0.1,
                warmup_steps=min(tcfg.warmup_steps, steps // 10),
                eval_every=min(tcfg.eval_every, steps),
                checkpoint_every=min(tcfg.checkpoint_every, steps),
            )
        val_x, val_y = data.tensors("val", size)

        def eval_fn(m: nn.Module) -> dict[str, float]:
            shard = rank_slice()
            probs = evaluate.predict(m, val_x[shard], cfg.eval.batch_size)  # type: ignore[arg-type]
            return {"acc": evaluate.accuracy(probs, val_y[shard])}

        sizes = [] if finetune else list(row.univit_sizes)
        train_set = data.dataset("train", size if finetune else row.data_size)
        loss_fn = classify_loss(sizes, packed=row.packed and not finetune)
        collate = train_set.collate
        return self.trainer(
            run, model, loss_fn, train_set, eval_fn, collate, train=tcfg, finetune=finetune
        )

    def removed_records(
        self, study: Study, row: RowConfig, seed: int, model: nn.Module
    ) -> list[dict[str, Any]]:
        """The accuracy at every test size with the positions taken out (`evaluate`)."""
        return evaluate.removed_records(study.cfg, row, seed, model, study.data, study.dist.device)

    def gather(self, study: Study, got: Collected, row: Any, seed: int, done: dict) -> None:
        """Records and summaries, and the position maps of each row's first seed (rank 0)."""
        super().gather(study, got, row, seed, done)
        cfg = study.cfg
        if cfg.eval.figures and seed == cfg.seeds[0] and study.dist.rank == 0:
            got.extra.setdefault("maps", {}).update(self._maps(study, got, row, seed))

    def _maps(self, study: Study, got: Collected, row: RowConfig, seed: int) -> dict[str, Any]:
        """The row's maps from its weights, else (a run restored from its eval.json alone)
        those of the folder's maps.npz as found before this report replaces it."""
        try:
            model = self.load_run(study.cfg, row, seed, study.out, study.data)
        except FileNotFoundError:
            if "archived" not in got.extra:  # read once, before the report replaces it
                got.extra["archived"] = report.saved_maps(study.out)
            kept = report.row_maps(got.extra["archived"], row.name)
            print(
                f"no weights for {row.name} seed {seed}: "
                + ("its maps come from maps.npz" if kept else "its maps are left out"),
                flush=True,
            )
            return kept
        return report.position_maps(model, row, study.cfg.eval.sizes)

    def results(self, study: Study, got: Collected) -> dict[str, Any]:
        """Records and summaries, and the data's real counts (a folder's fractions decide them)."""
        data = study.data
        counts = {s: data.count(s) for s in ("train", "val", "test")}
        return {
            "records": got.records,
            "train": got.train,
            "data": {"counts": counts, "classes": data.num_classes},
        }

    def write(self, study: Study, results: dict[str, Any], got: Collected) -> Path:
        """Figure 4's speeds (every row timed here, in one process, freshly built models), then
        results.json, maps.npz and the report."""
        cfg, data, out = study.cfg, study.data, study.out
        models = {r.name: make_model(cfg, r, data.num_classes) for r in cfg.rows}
        sizes = sorted(set(cfg.eval.sizes) | {r.train_size for r in cfg.rows})
        results["throughput"] = evaluate.throughput(
            models, sizes, cfg.eval.batch_size, device=study.dist.device
        )
        maps: dict[str, np.ndarray] = got.extra.get("maps", {})
        write_json(out / "results.json", results)
        report.save_maps(out, maps)
        return report.render(out, results, maps)


VISION = VisionExperiment()
