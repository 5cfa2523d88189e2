"""Bring folders written by cape 0.1's lab to the files the lab reads (it reads those only):

- a translation run whose model.json names CAPE "cape" and keeps `alpha` among the position
  options: the same model in `cape.build`'s name ("cape1d") with Seq2Seq's own `alpha`;
- an lm run without model.json: the model.json its lm experiment writes, from the run's
  config.json (the study's config and the row, as `cape eval lm` builds the model) and, for a
  BPE corpus, the run's bpe.model;
- a vision study's results.json without "data" (rendered images): the counts and classes
  the experiment records, which for rendered images are the configured ones.

    python scripts/migrate_runs.py FOLDER [FOLDER ...]

FOLDER: a run, <out>/<row>/seed<k>, or a study's folder holding results.json.

A folder that needs nothing is left as it is. Exit 2 naming the folder or file for a folder
that is not such a run or a file that does not say what it must.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from cape.lab.io import read_json_object, write_json


def current_translation_spec(model: dict[str, Any]) -> dict[str, Any]:
    """A translation model.json's "model" in `cape.build`'s names: position "cape" is
    "cape1d", and `alpha` moves from the position options to Seq2Seq's own keyword."""
    model = dict(model)
    options = dict(model.get("position_options") or {})
    if "alpha" in options:
        model["alpha"] = options.pop("alpha")
    if model.get("position") == "cape":
        model["position"] = "cape1d"
    model["position_options"] = options
    return model


def lm_spec_from_config(run: Path) -> dict[str, Any]:
    """The model.json of lm run `run`, from its config.json: the model `cape eval lm` builds
    (the study's config and the row), the tokenizer and the training context L."""
    from cape.lab.config import from_mapping
    from cape.lab.experiments.lm.config import LMConfig
    from cape.lab.experiments.lm.model import make_model

    path = run / "config.json"
    record = read_json_object(path).get("experiment") or {}
    if not isinstance(record, dict) or record.get("experiment") != "lm":
        what = record.get("experiment") if isinstance(record, dict) else record
        raise ValueError(f"run {str(run)!r} is a {what!r} run, not an lm one")
    if not isinstance(record.get("config"), dict) or not isinstance(record.get("row"), str):
        raise ValueError(f'{path}: "experiment" must hold a "config" object and a "row" name')
    cfg = from_mapping(LMConfig, record["config"])
    if record["row"] not in [r.name for r in cfg.rows]:
        raise ValueError(f"{path}: row {record['row']!r} is not among its config's rows")
    row = cfg.row(record["row"])
    if cfg.data.tokenizer == "bytes":
        vocab = 257
    else:
        from cape.lab.data.text_corpus import BpeTokenizer

        if not (run / "bpe.model").is_file():
            raise ValueError(f"run {str(run)!r} has no bpe.model: copy its corpus entry's")
        vocab = BpeTokenizer(run / "bpe.model").vocab_size
    return {"model": make_model(cfg, row, vocab).spec, "experiment": "lm", "row": row.name,
            "tokenizer": cfg.data.tokenizer, "context": cfg.data.context}  # fmt: skip


def vision_data(cfg: dict[str, Any]) -> dict[str, Any]:
    """A vision results.json's "data" for rendered images (config mapping `cfg`): the
    configured counts and the classes of the source."""
    from cape.lab.data.images.fonts import CHARSET
    from cape.lab.data.images.relations import RELATIONS

    source = cfg["data"]["source"]
    if source not in ("chars", "relations"):
        raise ValueError(f"data.source {source!r}: only rendered images have known counts")
    counts = {split: cfg["data"][split] for split in ("train", "val", "test")}
    return {"counts": counts, "classes": len(CHARSET if source == "chars" else RELATIONS)}


def migrate_results(path: Path) -> str:
    """Bring a study's results.json at `path` to the current format -> what was done."""
    results = read_json_object(path)
    if results.get("experiment") != "vision" or "data" in results:
        return "nothing to do"
    out = {}
    for key, value in results.items():
        if key == "throughput":  # where the experiment writes "data": before the timings
            out["data"] = vision_data(results["config"])
        out[key] = value
    out.setdefault("data", vision_data(results["config"]))
    write_json(path, out)
    return 'results.json with "data"'


def migrate(run: Path) -> str:
    """Bring run folder or study folder `run` to the current files -> what was done."""
    if (run / "results.json").is_file():
        return migrate_results(run / "results.json")
    spec_path = run / "model.json"
    if spec_path.is_file():
        spec = read_json_object(spec_path)
        if spec.get("experiment") != "translation" or not isinstance(spec.get("model"), dict):
            return "nothing to do"
        model = current_translation_spec(spec["model"])
        if model == spec["model"]:
            return "nothing to do"
        write_json(spec_path, {**spec, "model": model})
        return "model.json in cape.build's names"
    if not (run / "config.json").is_file():
        raise ValueError(f"run {str(run)!r} has neither model.json nor config.json")
    write_json(spec_path, lm_spec_from_config(run))
    return "model.json written from config.json"


def main(argv: list[str]) -> int:
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__, file=sys.stderr)
        return 2
    for arg in argv:
        run = Path(arg)
        try:
            if not run.is_dir():
                raise ValueError(f"run {arg!r} is not a folder")
            print(f"{run}: {migrate(run)}")
        except ValueError as e:
            print(f"migrate_runs: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
