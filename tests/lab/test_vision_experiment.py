"""The vision experiment: config resolution, evaluation helpers, and a tiny end-to-end run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml

from cape.lab.cli import main as cli
from cape.lab.experiments import EXPERIMENTS, merge, resolve_config, slug
from cape.lab.experiments.vision.config import PRESETS, VisionConfig
from cape.lab.experiments.vision.evaluate import (
    accuracy,
    extent_for,
    native_targets,
    predict,
    round_to_patch,
    tta_sizes,
)


def test_merge_and_slug():
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    out = merge(base, {"a": {"c": [3]}, "e": 2})
    assert out == {"a": {"b": 1, "c": [3]}, "d": 1, "e": 2}
    assert base["a"]["c"] == [1, 2]  # not mutated
    assert slug("CAPE λ=1.4") == "cape-lambda1.4"
    assert slug("UniViT CAPE Δ=0") == "univit-cape-delta0"
    assert slug("CAPE@24") == "cape@24"


def test_every_preset_resolves():
    for name in PRESETS:
        cfg, mapping = resolve_config(VisionConfig, PRESETS, name)
        assert cfg.rows and mapping["name"] == cfg.name
        # the mapping round-trips to the same config (what config.yaml stores)
        again, _ = resolve_config(VisionConfig, {"x": mapping}, "x")
        assert again == cfg


def test_config_file_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  steps: 7\nmodel:\n  dim: 64\n")
    cfg, _ = resolve_config(VisionConfig, PRESETS, "quick", [f], ["train.lr=0.01", "seeds=[1,2]"])
    assert (cfg.train.steps, cfg.model.dim, cfg.train.lr, cfg.seeds) == (7, 64, 0.01, [1, 2])
    assert cfg.train.batch_size == PRESETS["quick"]["train"]["batch_size"]  # merged, not replaced
    t = tmp_path / "c.toml"
    t.write_text("[eval]\nsizes = [16, 32]\n")
    cfg, _ = resolve_config(VisionConfig, PRESETS, "quick", [t])
    assert cfg.eval.sizes == [16, 32]


@pytest.mark.parametrize(
    "override, words",
    [
        ("model.dimx=3", ["model.dimx", "dim"]),
        ("train.precision=fp8", ["train.precision", "bf16"]),
        ("rows=[{name: a, position: cape3d}]", ["position", "cape2d"]),
        ("eval.sizes=[30]", ["30", "patch"]),
        ("eval.extents=[half]", ["eval.extents", "ratio"]),
        ("train.steps=many", ["train.steps", "integer"]),
        ("rows=[{name: a, position: nopos, model: {patch: 2}}]", ["rows[a].model", "patch", "dim"]),
    ],
)
def test_bad_config_names_key_and_allowed(override, words):
    with pytest.raises((ValueError, TypeError)) as err:
        resolve_config(VisionConfig, PRESETS, "quick", [], [override])
    for w in words:
        assert w in str(err.value)


def test_row_model_changes_only_that_row():
    from cape.lab.experiments.vision.model import make_model

    cfg = resolve_config(
        VisionConfig,
        PRESETS,
        "quick",
        [],
        [
            "rows=[{name: base, position: cape2d}, {name: small, position: cape2d, "
            "model: {dim: 16, depth: 1}}]"
        ],
    )[0]
    dim, depth = cfg.model.dim, cfg.model.depth
    assert (dim, depth) != (16, 1)
    base, small = (make_model(cfg, row, 36) for row in cfg.rows)
    assert len(base.encoder.layers) == depth and len(small.encoder.layers) == 1
    assert base.patch_embed.out_channels == dim and small.patch_embed.out_channels == 16
    assert (cfg.model.dim, cfg.model.depth) == (dim, depth)  # the shared config is not changed


def test_cli_bad_config_exit_codes(capsys):
    assert cli(["experiment", "vision", "--set", "model.dimx=3"]) == 2
    assert "model.dimx" in capsys.readouterr().err
    assert cli(["experiment", "vision", "--preset", "huge"]) == 2
    assert cli(["plot", "/nonexistent-folder"]) == 2
    assert cli(["experiment", "vision", "--print-config"]) == 0
    assert "vision-quick" in capsys.readouterr().out
    # --rows picks rows of the preset by name, with their options
    assert (
        cli(
            [
                "experiment",
                "vision",
                "--preset",
                "cpu-full",
                "--rows",
                "sinpos,CAPE d64",
                "--print-config",
            ]
        )
        == 0
    )
    rows = yaml.safe_load(capsys.readouterr().out)["rows"]
    assert [r["name"] for r in rows] == ["sinpos", "CAPE d64"] and rows[1]["model"] == {"dim": 64}
    assert cli(["experiment", "vision", "--rows", "sinpos,nobody", "--print-config"]) == 2
    assert "--rows must name rows of the config" in capsys.readouterr().err


def test_eval_helpers_closed_forms():
    assert extent_for("1", 96, 32) == 1.0
    assert extent_for("ratio", 96, 32) == 3.0
    assert math.isclose(extent_for("sqrt", 56, 32), math.sqrt(56 / 32))
    assert [round_to_patch(s, 4) for s in (1, 5, 6, 13, 127)] == [4, 4, 8, 12, 128]
    assert tta_sizes(32, 4) == [28, 32, 36] and tta_sizes(4, 4) == [4, 8]
    assert native_targets([13, 30], 12, 32, "fixed 24", 4) == [24, 24]
    assert native_targets([13, 30], 12, 32, "min", 4) == [12, 12]
    assert native_targets([13, 30], 12, 32, "max", 4) == [32, 32]
    assert native_targets([13, 30], 12, 32, "original", 4) == [12, 32]
    with pytest.raises(ValueError, match="strategy"):
        native_targets([13], 12, 32, "median", 4)


def test_predict_and_accuracy_match_a_direct_computation():
    torch.manual_seed(0)
    from cape.models import ViT

    model = ViT(5, image_size=8, patch=4, dim=16, depth=1, heads=2, position="sinpos2d")
    x, y = torch.randn(11, 3, 8, 8), torch.randint(0, 5, (11,))
    probs = predict(model, x, batch_size=4)
    model.eval()
    with torch.no_grad():
        ref = model(x).softmax(-1)
    torch.testing.assert_close(probs, ref)
    assert accuracy(probs, y) == pytest.approx(100 * (ref.argmax(-1) == y).float().mean().item())


def test_packed_loss_mixes_sizes_in_one_batch():
    from cape.lab.experiments.vision.model import classify_loss

    batches = []

    class Probe(torch.nn.Module):
        def forward(self, images):
            assert isinstance(images, list)
            batches.append({im.shape[-1] for im in images})
            return torch.zeros(len(images), 3, requires_grad=True)

    torch.manual_seed(0)
    loss_fn = classify_loss([8, 12, 16], packed=True)
    for _ in range(5):
        loss_fn(Probe(), (torch.randn(8, 3, 16, 16), torch.zeros(8, dtype=torch.long)))
    assert set().union(*batches) == {8, 12, 16}
    assert any(len(b) > 1 for b in batches)  # several sizes within one batch


def test_univit_loss_draws_sizes_from_the_list():
    from cape.lab.experiments.vision.model import classify_loss

    seen = []

    class Probe(torch.nn.Module):
        def forward(self, images):
            seen.append(images.shape[-1])
            return torch.zeros(images.shape[0], 3, requires_grad=True)

    torch.manual_seed(0)
    loss_fn = classify_loss([8, 12, 16])
    batch = (torch.randn(2, 3, 16, 16), torch.tensor([0, 1]))
    for _ in range(30):
        loss, metrics = loss_fn(Probe(), batch)
        assert loss.item() == pytest.approx(math.log(3))
    assert set(seen) == {8, 12, 16}


TINY = [
    "name=tiny",
    "seeds=[0]",
    "data.source=chars",
    "eval.figures=true",
    "data.train=48",
    "data.val=16",
    "data.test=16",
    "data.test_fonts=8",
    "data.native=12",
    "data.workers=1",
    "model.dim=16",
    "model.depth=1",
    "model.heads=2",
    "train.steps=3",
    "train.batch_size=16",
    "train.eval_every=3",
    "train.checkpoint_every=3",
    "train.warmup_steps=0",
    "train.log_every=1",
    "eval.sizes=[8,16]",
    "eval.batch_size=8",
    "eval.extents=['1',ratio,sqrt]",
    "eval.tta=true",
    "eval.native_bins=[12,40,129]",
    "rows=[{name: nopos, position: nopos, train_size: 12}, "
    "{name: CAPE, position: cape2d, train_size: 12, options: {preset: image}}, "
    "{name: UniViT, position: cape2d, train_size: 12, univit_sizes: [8, 16]}, "
    "{name: abspos ft, position: abspos2d, train_size: 12, finetune_size: 16, finetune_steps: 2}, "
    "{name: packed, position: cape2d, train_size: 12, univit_sizes: [8, 16], packed: true}]",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vision")
    args = ["--set", f"data.root={out / 'data'}"]
    for item in TINY:
        args += ["--set", item]
    assert cli(["experiment", "vision", *args, "--out", str(out / "run")]) == 0
    return out, args


def test_experiment_end_to_end(tiny_run):
    out, _ = tiny_run
    run = out / "run"
    results = json.loads((run / "results.json").read_text())
    recs = results["records"]
    rows = {r["row"] for r in recs}
    assert rows == {"nopos", "CAPE", "UniViT", "abspos ft", "packed"}
    for row in rows:
        plain = {
            r["size"]
            for r in recs
            if r["row"] == row and r["method"] == "plain" and r["set"] == "test"
        }
        assert plain == {8, 12, 16}  # eval sizes and the training size
        assert {r["bin"] for r in recs if r["row"] == row and r["set"] == "native"} == {
            "12-39",
            "40-128",
        }
        assert any(r["set"] == "test_fonts" for r in recs if r["row"] == row)
        assert any(r["method"] == "tta" for r in recs if r["row"] == row)
    # extents only for the continuous encodings; gamma = 1 equals the plain result
    assert not any(r["method"].startswith("extent") for r in recs if r["row"] == "nopos")
    for size in (8, 12, 16):
        one = [
            r["acc"]
            for r in recs
            if r["row"] == "CAPE"
            and r["size"] == size
            and r["set"] == "test"
            and r["method"] in ("plain", "extent 1")
        ]
        assert len(one) == 2 and one[0] == one[1]
    for r in recs:
        assert 0.0 <= r["acc"] <= 100.0 or (r["set"] == "native" and math.isnan(r["acc"]))
    report = (run / "report.md").read_text()
    assert "| nopos |" in report and "Table 6" in report and "Table 5" in report
    # Figure 4's speeds: every row timed together after training, at each eval size
    timed = {(t["row"], t["size"]) for t in results["throughput"]}
    assert timed == {(r, s) for r in rows for s in (8, 12, 16)}
    assert all(t["images_per_s"] > 0 for t in results["throughput"]) and "round-robin" in report
    for png in ("accuracy_vs_resolution.png", "throughput.png", "similarity.png", "embeddings.png"):
        assert (run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run / "abspos-ft" / "seed0" / "ft" / "checkpoints").is_dir()
    with np.load(run / "maps.npz") as z:
        assert any(k.startswith("embed|CAPE|") for k in z.files)


def test_experiment_rerun_resumes_without_training(tiny_run, monkeypatch):
    out, args = tiny_run
    from cape.lab.experiments.vision.experiment import VISION as vision

    def boom(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(vision, "train_run", boom)
    before = json.loads((out / "run" / "results.json").read_text())["records"]
    assert cli(["experiment", "vision", *args, "--out", str(out / "run")]) == 0
    after = json.loads((out / "run" / "results.json").read_text())["records"]
    assert after == before


def test_rerun_with_other_settings_reevaluates_or_refuses(tiny_run, tmp_path, capsys):
    import shutil

    from cape.lab.train import Trainer

    out, args = tiny_run
    run = tmp_path / "run"
    shutil.copytree(out / "run", run)
    # another eval size: every run is evaluated again, none trained again (no optimizer step)
    steps = []
    real = Trainer._train_step
    Trainer._train_step = lambda self: steps.append(1) or real(self)  # type: ignore[method-assign]
    try:
        assert (
            cli(["experiment", "vision", *args, "--set", "eval.sizes=[8,16,20]", "--out", str(run)])
            == 0
        )
    finally:
        Trainer._train_step = real  # type: ignore[method-assign]
    assert not steps
    recs = json.loads((run / "results.json").read_text())["records"]
    assert {r["size"] for r in recs if r["row"] == "CAPE" and r["method"] == "plain"} == {
        8,
        12,
        16,
        20,
    }
    # another model: refused with the key named (exit 2), nothing overwritten
    capsys.readouterr()
    assert cli(["experiment", "vision", *args, "--set", "model.dim=8", "--out", str(run)]) == 2
    assert "model.dim: 16 -> 8" in capsys.readouterr().err


def test_runs_restored_from_eval_json_alone(tiny_run, tmp_path, monkeypatch, capsys):
    """eval.json + settings.json of each run (what results/ keeps of a long experiment) are enough
    for a later session to report them and add rows or seeds without training them again."""
    import shutil

    from cape.lab.experiments.vision.experiment import VISION as vision

    out, args = tiny_run
    # a run still training (settings.json, no eval.json yet) stays out of the archive; in a
    # copy, so that the module's shared run folder is left as it was
    training = tmp_path / "training"
    shutil.copytree(out / "run", training)
    (training / "cape" / "seed9").mkdir()
    shutil.copyfile(
        training / "cape" / "seed0" / "settings.json", training / "cape" / "seed9" / "settings.json"
    )
    assert cli(["plot", str(training), "--archive", str(tmp_path / "docs9")]) == 0
    assert (tmp_path / "docs9" / "cape" / "seed0" / "settings.json").is_file()
    assert not (tmp_path / "docs9" / "cape" / "seed9").exists()
    assert cli(["plot", str(out / "run"), "--archive", str(tmp_path / "docs")]) == 0
    kept = sorted(
        str(p.relative_to(tmp_path / "docs")) for p in (tmp_path / "docs").rglob("*") if p.is_file()
    )
    assert "nopos/seed0/eval.json" in kept and "cape/seed0/settings.json" in kept
    assert "report.md" in kept and "accuracy_vs_resolution.png" in kept
    assert not any("checkpoints" in k or k.endswith(".safetensors") for k in kept)
    shutil.copytree(tmp_path / "docs", tmp_path / "run")  # what a later session starts from
    (tmp_path / "run" / "results.json").unlink()
    monkeypatch.setattr(vision, "train_run", lambda *a, **k: pytest.fail("trained again"))
    assert cli(["experiment", "vision", *args, "--out", str(tmp_path / "run")]) == 0
    # the maps of runs without weights are carried over from the archive's maps.npz, not lost
    assert "its maps come from maps.npz" in capsys.readouterr().out
    before = json.loads((out / "run" / "results.json").read_text())["records"]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["records"] == before
    trained, restored = (np.load(p / "maps.npz") for p in (out / "run", tmp_path / "run"))
    assert sorted(restored.files) == sorted(trained.files) and trained.files
    for k in trained.files:
        np.testing.assert_array_equal(restored[k], trained[k])
    # without maps.npz there is nothing to carry: said so, and the report is still written
    (tmp_path / "run" / "maps.npz").unlink()
    assert cli(["experiment", "vision", *args, "--out", str(tmp_path / "run")]) == 0
    assert "its maps are left out" in capsys.readouterr().out
    assert (tmp_path / "run" / "report.md").is_file()


def test_plot_redraws_the_report(tiny_run):
    out, _ = tiny_run
    report = out / "run" / "report.md"
    text = report.read_text()
    report.unlink()
    (out / "run" / "accuracy_vs_resolution.png").unlink()
    assert cli(["plot", str(out / "run")]) == 0
    assert report.read_text() == text
    assert (out / "run" / "accuracy_vs_resolution.png").is_file()


def test_train_and_eval_commands(tiny_run, capsys):
    out, args = tiny_run
    run = out / "run"
    assert cli(["train", "vision", *args, "--out", str(run), "--row", "CAPE"]) == 0
    assert cli(["eval", "vision", *args, "--out", str(run), "--row", "CAPE"]) == 0
    text = capsys.readouterr().out
    assert "| test | 16 | plain |" in text
    assert cli(["eval", "vision", *args, "--out", str(out / "empty"), "--row", "CAPE"]) == 2
    assert cli(["train", "vision", *args, "--out", str(run), "--row", "nope"]) == 2


def test_registry_holds_one_complete_experiment_per_name():
    from cape.lab.experiments import Experiment

    for name, exp in EXPERIMENTS.items():
        assert isinstance(exp, Experiment) and exp.name == name
        assert not type(exp).__abstractmethods__, f"{name} leaves {type(exp).__abstractmethods__}"
        cfg, mapping = resolve_config(exp.config_cls, exp.presets, exp.default_preset)
        assert isinstance(cfg, exp.config_cls) and mapping["rows"]


@pytest.mark.slow
def test_experiment_under_torchrun_two_cpu_ranks(tmp_path):
    """`torchrun -m cape.lab experiment vision`: 2 gloo ranks train (packed UniViT included), shard
    the evaluation and sum it; only rank 0 writes the report."""
    import os
    import subprocess
    import sys

    rows = (
        "rows=[{name: CAPE, position: cape2d, train_size: 12}, "
        "{name: packed, position: cape2d, train_size: 12, univit_sizes: [8, 16], packed: true}]"
    )
    args = [a for a in TINY if not a.startswith("rows=")] + [
        rows,
        "data.native=0",
        "data.test_fonts=0",
    ]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "cape.lab",
        "experiment",
        "vision",
        "--out",
        str(tmp_path / "run"),
        "--set",
        f"data.root={tmp_path / 'data'}",
    ]
    for a in args:
        cmd += ["--set", a]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    plain = [r for r in results["records"] if r["method"] == "plain"]
    assert {r["row"] for r in plain} == {"CAPE", "packed"}
    for r in plain:  # 16 test images, split 8 + 8 over the ranks: multiples of 100/16
        assert (r["acc"] * 16 / 100) == pytest.approx(round(r["acc"] * 16 / 100), abs=1e-6)
    assert (tmp_path / "run" / "report.md").is_file()


def test_paper_claims_from_records():
    from cape.lab.experiments.vision.report import paper_claims

    # accuracy by (row, size) for seeds 0 and 1 (each seed +-1 around the mean)
    means = {
        "CAPE": {24: 50, 32: 70, 56: 60, 96: 30},
        "sinpos": {24: 40, 32: 70, 56: 55, 96: 35},
        "abspos": {24: 45, 32: 72, 56: 50, 96: 20},
        "UniViT CAPE": {24: 49.5, 32: 69, 56: 59.5, 96: 30},
    }
    records = []
    for row, by_size in means.items():
        for size, m in by_size.items():
            for seed, d in ((0, -1.0), (1, 1.0)):
                records.append(
                    {
                        "row": row,
                        "seed": seed,
                        "set": "test",
                        "size": size,
                        "method": "plain",
                        "acc": m + d,
                    }
                )
                if row in ("sinpos", "CAPE"):  # TTA: +2 everywhere but sinpos at 96 (-1)
                    gain = -1.0 if (row, size) == ("sinpos", 96) else 2.0
                    records.append(
                        {
                            "row": row,
                            "seed": seed,
                            "set": "test",
                            "size": size,
                            "method": "tta",
                            "acc": m + d + gain,
                        }
                    )
    rows = [
        {"name": n, "train_size": 32, "univit_sizes": [24, 32] if "Uni" in n else [], "options": {}}
        for n in means
    ]
    results = {"config": {"rows": rows, "eval": {"sizes": [24, 32, 56, 96]}}, "records": records}
    got = {claim: (measured, holds) for claim, measured, holds in paper_claims(results)}
    # equal means: within the seeds' spread, the numbers do not decide the claim
    assert got["CAPE ≥ sinpos at 32 px"] == ("70.0 ± 1.4 vs 70.0 ± 1.4", None)
    assert got["CAPE ≥ abspos at 32 px"][1] is False  # 70 < 72, 2 points apart: beyond 1.4
    assert got["CAPE > sinpos at 24 px"][1] is True and got["CAPE > sinpos at 96 px"][1] is False
    # abspos drops 52 points, CAPE 40
    assert got["abspos loses more than CAPE from 32 to 96 px"] == (
        "abspos -52.0, CAPE -40.0 points",
        True,
    )
    # best single-resolution rows: 50, 72, 60, 35 -> UniViT -0.5, -3.0, -0.5, -5.0
    measured, holds = got[
        "UniViT CAPE within 1 point of the best single-resolution row at each size"
    ]
    assert measured == "24 px -0.5, 32 px -3.0, 56 px -0.5, 96 px -5.0" and holds is False
    assert got["TTA helps CAPE at every size"][1] is True
    assert got["TTA helps sinpos at every size"] == (
        "24 px +2.0, 32 px +2.0, 56 px +2.0, 96 px -1.0",
        False,
    )
    assert (
        paper_claims({"config": {"rows": rows[1:2], "eval": {"sizes": [24]}}, "records": records})
        == []
    )  # no CAPE row: nothing to check
    # one seed has no spread: the mean alone, no "± 0.0"
    seed0 = {"config": results["config"], "records": [r for r in records if r["seed"] == 0]}
    got = {claim: measured for claim, measured, _ in paper_claims(seed0)}
    assert got["CAPE ≥ sinpos at 32 px"] == "69.0 vs 69.0"


def test_frequency_study_claim_pairs_rows_that_differ_only_in_freq_scale():
    from cape.lab.experiments.vision.report import paper_claims

    def row(name, position, options, **extra):
        return {
            "name": name,
            "position": position,
            "options": options,
            "train_size": 32,
            "univit_sizes": [],
            "model": {},
            **extra,
        }

    rows = [
        row("CAPE", "cape2d", {"preset": "image"}),
        row("sinpos", "sinpos2d", {}),
        row("CAPE d64", "cape2d", {"preset": "image"}, model={"dim": 64}),
        row("CAPE freq 0.4", "cape2d", {"preset": "image", "freq_scale": 0.4}),
        row("sinpos freq 0.4", "sinpos2d", {"freq_scale": 0.4}),
        row("lonely freq 0.4", "cape2d", {"preset": "image", "freq_scale": 0.4}, train_size=24),
    ]
    means = {
        "CAPE": 50.0,
        "sinpos": 57.0,
        "CAPE d64": 80.0,
        "CAPE freq 0.4": 60.0,
        "sinpos freq 0.4": 55.0,
        "lonely freq 0.4": 99.0,
    }
    records = [
        {"row": n, "seed": s, "set": "test", "size": 32, "method": "plain", "acc": m + d}
        for n, m in means.items()
        for s, d in ((0, -2.0), (1, 2.0))
    ]
    results = {"config": {"rows": rows, "eval": {"sizes": [32]}}, "records": records}
    got = {claim: (measured, holds) for claim, measured, holds in paper_claims(results)}
    # each scaled row is compared with the row equal in all else (not CAPE d64, not a 24 px row)
    assert got["CAPE freq 0.4 > CAPE at 32 px"] == ("60.0 ± 2.8 vs 50.0 ± 2.8", True)
    # 2 points apart with a spread of 2.8: undecided, not "does not hold"
    assert got["sinpos freq 0.4 > sinpos at 32 px"] == ("55.0 ± 2.8 vs 57.0 ± 2.8", None)
    assert not any(c.startswith("lonely") or "CAPE d64" in c for c in got)


def test_relations_run_reports_whether_rows_use_their_positions(tmp_path, migrate_runs) -> None:
    """The main job's shape on a tiny budget: the positions-removed measurements of every row with
    positions (absolute or rotary), none for nopos, and a report that opens with its verdict."""
    out = tmp_path / "run"
    rows = (
        "rows=[{name: nopos, position: nopos}, {name: abspos, position: abspos2d}, "
        "{name: CAPE grid, position: cape2d, options: {preset: image, fit_grid: true}}, "
        "{name: rotary grid, position: rotary2d, options: {fit_grid: true}}]"
    )
    sets = [
        f"data.root={tmp_path / 'data'}",
        "data.train=32",
        "data.val=8",
        "data.test=8",
        "data.workers=1",
        "model.dim=16",
        "model.depth=1",
        "model.heads=2",
        "train.steps=2",
        "train.batch_size=8",
        "train.eval_every=2",
        "train.checkpoint_every=2",
        "train.warmup_steps=0",
        "eval.sizes=[16,48]",
        "eval.batch_size=8",
        rows,
    ]
    args = [a for item in sets for a in ("--set", item)]
    assert cli(["experiment", "vision", *args, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["data"] == {"counts": {"train": 32, "val": 8, "test": 8}, "classes": 4}
    # scripts/migrate_runs.py gives a results.json without "data" what the experiment records
    old = tmp_path / "old"
    old.mkdir()
    (old / "results.json").write_text(
        json.dumps({k: v for k, v in results.items() if k != "data"}, indent=2)
    )
    assert migrate_runs.migrate(old) == 'results.json with "data"'
    assert json.loads((old / "results.json").read_text()) == results
    assert list(json.loads((old / "results.json").read_text())) == list(results)
    removed = {
        (r["row"], r["size"]) for r in results["records"] if r["method"] == "positions removed"
    }
    assert removed == {
        (row, s) for row in ("abspos", "CAPE grid", "rotary grid") for s in (16, 32, 48)
    }
    report = (out / "report.md").read_text()
    assert report.index("## Verdict") < report.index("Top-1 accuracy (%) on test images")
    assert "**Positions needed?**" in report and "32 training images (relations)" in report
    assert "with the positions taken out at test time" in report


def test_an_image_folder_reports_its_own_counts_and_test_images(tmp_path) -> None:
    """Bring your own images: the header counts the folder's training images (not the preset's
    data.train) and the tables say they are the folder's test images."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(10):
            pixels = rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "imgs" / cls / f"{i}.png")
    sets = [
        f"data.source={tmp_path / 'imgs'}",
        "model.dim=16",
        "model.depth=1",
        "model.heads=2",
        "train.steps=2",
        "train.batch_size=4",
        "train.eval_every=2",
        "train.checkpoint_every=2",
        "train.warmup_steps=0",
        "eval.sizes=[16]",
        "eval.batch_size=4",
        "seeds=[0]",
        "rows=[{name: nopos, position: nopos}]",
    ]
    args = [a for item in sets for a in ("--set", item)]
    assert cli(["experiment", "vision", *args, "--out", str(tmp_path / "run")]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    counts = results["data"]["counts"]
    assert counts == {"train": 16, "val": 2, "test": 2}  # 80/10/10 of 10 per class, 2 classes
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"16 training images ({tmp_path / 'imgs'})" in report
    assert "on the folder's test images" in report and "train fonts" not in report


def test_positions_removed_are_measured_apart_from_the_plain_records(monkeypatch):
    """The positions-removed accuracy comes from the base's check (`measure_removed`: the
    positions taken out around `removed_records`), at every test size, after the plain
    records: Table 6's gamma = 1 record stays the plain accuracy (a model that needs its
    positions: 100% with them, 0% without)."""
    import contextlib
    from types import SimpleNamespace

    import cape.lab.experiments.base as base
    import cape.lab.experiments.vision.evaluate as ev
    from cape.lab.experiments.vision.experiment import VISION

    removed = {"now": False}

    @contextlib.contextmanager
    def without_positions(model):
        removed["now"] = True
        yield True
        removed["now"] = False

    def predict(model, x, batch_size, extent=None, device=None):
        probs = torch.zeros(len(x), 2)
        probs[:, 0 if removed["now"] else 1] = 1.0  # labels are 1: right only with positions
        return probs

    monkeypatch.setattr(base, "without_positions", without_positions)
    monkeypatch.setattr(ev, "predict", predict)
    cfg = SimpleNamespace(
        eval=SimpleNamespace(sizes=[8, 12], batch_size=4, extents=["1"], tta=False),
        data=SimpleNamespace(test_fonts=0, native=0),
    )
    data = SimpleNamespace(
        counts={"test": 4},
        tensors=lambda split, size: (torch.zeros(4, 3, size, size), torch.ones(4).long()),
    )
    row, model = SimpleNamespace(name="r", train_size=8), SimpleNamespace(takes_extent=True)
    done = {"records": ev.eval_records(cfg, row, 0, model, data, "cpu")}
    plain = {(r["method"], r["size"]): r["acc"] for r in done["records"]}
    assert plain == {("plain", 8): 100.0, ("extent 1", 8): 100.0, ("plain", 12): 100.0,
                     ("extent 1", 12): 100.0}  # fmt: skip
    study = SimpleNamespace(cfg=cfg, data=data, dist=SimpleNamespace(device="cpu"))
    VISION.measure_removed(study, row, 0, model, done)
    gone = [(r["method"], r["size"], r["acc"]) for r in done["records"][4:]]
    assert gone == [(ev.NO_POSITIONS, 8, 0.0), (ev.NO_POSITIONS, 12, 0.0)]
    assert "removed" not in done and not removed["now"]
