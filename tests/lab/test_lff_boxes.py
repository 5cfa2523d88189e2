"""The LFF boxes experiment: configs, the model of every row, augmentation, a tiny full run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import cape
from cape import Augmentation
from cape.lab.data.boxes import NONE, BoxDataset, answer_questions, generate
from cape.lab.experiments import resolve_config
from cape.lab.experiments.base import parameter_counts
from cape.lab.experiments.lff_boxes.config import PRESETS, LffBoxesConfig
from cape.lab.experiments.lff_boxes.experiment import LFF_BOXES as exp
from cape.lab.experiments.lff_boxes.model import answer_loss, augment_boxes

SMALL = [
    "model.dim=16",
    "model.depth=1",
    "model.heads=2",
    "model.ffn_dim=32",
    "model.fourier_dim=8",
    "model.hidden_dim=8",
]


def test_every_preset_resolves_and_round_trips():
    for name in PRESETS:
        cfg, mapping = resolve_config(LffBoxesConfig, PRESETS, name)
        again, _ = resolve_config(LffBoxesConfig, {"x": mapping}, "x")
        assert again == cfg
    full, _ = resolve_config(LffBoxesConfig, PRESETS, "cpu-full")
    names = {r.name for r in full.rows}
    paper = {"Embed-4D", "MLP", "Sine-4D", "Learnable-Fourier-2/2"} | {
        f"{k}-Fourier+MLP-{g}" for k in ("Fixed", "Learnable") for g in ("1/4", "2/2", "4/1")
    }
    assert paper <= names and "CAPE Sine-4D" in names and len(full.seeds) == 3
    paper_cfg, _ = resolve_config(LffBoxesConfig, PRESETS, "paper")
    assert (paper_cfg.model.depth, paper_cfg.model.heads, paper_cfg.model.dim) == (6, 8, 128)


@pytest.mark.parametrize(
    "override, words",
    [
        ("rows=[{name: a, position: embed-2d}]", ["rows[a].position", "embed-4d"]),
        ("rows=[{name: a, position: lff, options: {groups: 3}}]", ["rows[a].options.groups", "4"]),
        (
            "rows=[{name: a, position: lff, options: {fourier_dim: 3}}]",
            ["rows[a].options", "fourier_dim"],
        ),
        (
            "rows=[{name: a, position: sine-4d, options: {max_global_shift: 1.0}}]",
            ["rows[a].options.max_global_shift", "augment"],
        ),
        (
            "rows=[{name: a, position: sine-4d, augment: {max_global_scaling: 0.5}}]",
            ["rows[a].augment", "max_global_scaling"],
        ),
        ("rows=[{name: a, position: sine-4d, augment: {shift: 1}}]", ["rows[a].augment", "shift"]),
        (
            "rows=[{name: a, position: embed-4d, options: {colour: 1}}]",
            ["rows[a].options", "colour"],
        ),
        ("data.canvas=63", ["data.canvas", "even"]),
        ("data.max_size=80", ["data.max_size", "62"]),
        ("model.dim=20", ["model.dim", "8"]),
        ("model.dimx=3", ["model.dimx", "dim"]),
        ("train.best_metric=loss", ["train.best_metric", "acc"]),
        ("seeds=[]", ["seeds"]),
    ],
)
def test_bad_config_names_the_key(override, words):
    with pytest.raises((ValueError, TypeError)) as err:
        resolve_config(LffBoxesConfig, PRESETS, "quick", [], [override])
    for w in words:
        assert w in str(err.value)


def _batch(n=16, seed=0, parity=0, canvas=64):
    s = generate(n, seed=seed, parity=parity, canvas=canvas)
    return s, BoxDataset(s).collate(list(range(n)))


@pytest.mark.parametrize("row_index", range(len(PRESETS["cpu-full"]["rows"])))
def test_every_row_builds_and_trains(row_index):
    cfg, _ = resolve_config(LffBoxesConfig, PRESETS, "cpu-full", [], SMALL)
    row = cfg.rows[row_index]
    torch.manual_seed(0)
    model = exp.make_model(cfg, row).train()
    _, batch = _batch()
    loss, metrics = answer_loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss) and 0.0 <= float(metrics["acc"]) <= 100.0
    assert model(batch).shape == (16, NONE + 1)
    if model.position is None:
        assert row.position == "nopos"
        return
    grads = [p.grad for p in model.position.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    if grads:  # the encoding reaches the loss
        assert sum(float(g.abs().sum()) for g in grads) > 0
    # positions matter: moving the boxes changes the output
    model.eval()
    moved = dict(batch, positions=(batch["positions"] * 0.5 + 0.25))
    assert not torch.allclose(model(batch), model(moved))


def test_embed4d_leaves_unseen_values_untrained():
    cfg, _ = resolve_config(LffBoxesConfig, PRESETS, "quick", [], SMALL)
    row = next(r for r in cfg.rows if r.name == "Embed-4D")
    model = exp.make_model(cfg, row).train()
    assert (
        0.7 < float(model.position.table.detach().std()) < 1.0
    )  # model.embed_init_std, truncated at 2 std
    small, _ = resolve_config(
        LffBoxesConfig, PRESETS, "quick", [], [*SMALL, "model.embed_init_std=0.02"]
    )
    assert float(exp.make_model(small, row).position.table.detach().std()) < 0.02
    s, batch = _batch(n=256)
    answer_loss(model, batch)[0].backward()
    grad = model.position.table.grad.abs().sum(1).reshape(4, 64)  # [axis, coordinate value]
    used = np.zeros((4, 64), bool)
    for axis in range(4):
        used[axis, np.unique(s.boxes[..., axis][s.mask])] = True
    assert (grad[torch.from_numpy(~used)] == 0).all()  # odd values: never reached
    assert (grad[torch.from_numpy(used)] > 0).all()
    assert not used[:, 1::2].any()


def _unique_nearest_gap(s):
    """[n] bool: the smallest gap distance to the query is held by one box only (else the
    float rounding of an augmented screen may break the integer tie either way)."""
    rows = np.arange(len(s))
    t, le, b, r = (s.boxes[..., k] for k in range(4))
    qt, ql, qb, qr = (s.boxes[rows, s.query, k][:, None] for k in range(4))
    gap = (
        np.maximum(np.maximum(le - qr, ql - r), 0) ** 2
        + np.maximum(np.maximum(t - qb, qt - b), 0) ** 2
    )
    other = s.mask.copy()
    other[rows, s.query] = False
    gap = np.where(other, gap, 10**9)
    return (gap == gap.min(1, keepdims=True)).sum(1) == 1


def test_box_augmentation_is_one_shift_per_axis_and_one_scale_per_screen():
    s = generate(500, seed=4)
    pos = torch.from_numpy(s.positions()).double()
    mask = torch.from_numpy(s.mask)
    torch.manual_seed(0)
    moved = augment_boxes(pos, mask, Augmentation(max_global_shift=0.3, max_global_scaling=1.5))
    assert (moved[~mask] == 0).all() and not torch.allclose(moved, pos.float())
    # moved = scale * (pos + shift_axis), axis y for top/bottom and x for left/right
    for i in range(20):
        p, m = pos[i][mask[i]], moved[i][mask[i]].double()
        scale = (m[:, 2] - m[:, 0]) / (p[:, 2] - p[:, 0])  # box heights
        assert torch.allclose(scale, scale[0].expand_as(scale), atol=1e-5)
        assert torch.allclose((m[:, 3] - m[:, 1]) / (p[:, 3] - p[:, 1]), scale, atol=1e-5)
        shift = m / scale[0] - p
        assert torch.allclose(shift[:, [0, 2]], shift[0, 0].expand(len(p), 2), atol=1e-5)
        assert torch.allclose(shift[:, [1, 3]], shift[0, 1].expand(len(p), 2), atol=1e-5)


def test_box_augmentation_keeps_every_relation():
    s = generate(500, seed=4)
    pos = torch.from_numpy(s.positions())
    mask = torch.from_numpy(s.mask)
    rows = np.arange(len(s))
    before = answer_questions(s.boxes, s.mask, s.query, s.types)[0][rows, s.question]
    torch.manual_seed(0)
    aug = Augmentation(max_global_shift=0.3, max_global_scaling=1.5)
    moved = augment_boxes(pos, mask, aug).numpy()
    after = answer_questions(moved, s.mask, s.query, s.types)[0][rows, s.question]
    check = (s.question != 3) | _unique_nearest_gap(s)
    assert check.mean() > 0.9
    assert (after == before)[check].all()
    # the same draws per edge (4 independent axes) would break relations between edges
    naive = aug(pos, mask).numpy()
    broken = answer_questions(naive, s.mask, s.query, s.types)[0][rows, s.question]
    assert (broken != before)[check].mean() > 0.05


def test_cape_row_augments_only_in_training():
    cfg, _ = resolve_config(LffBoxesConfig, PRESETS, "quick", [], SMALL)
    row = next(r for r in cfg.rows if r.augment)
    torch.manual_seed(0)
    model = exp.make_model(cfg, row)
    _, batch = _batch()
    model.train()
    assert not torch.allclose(model(batch), model(batch))
    model.eval()
    assert torch.equal(model(batch), model(batch))


TINY = [
    "name=tiny",
    "seeds=[0,1]",
    "data.train=256",
    "data.val=64",
    "data.test=64",
    *SMALL,
    "train.steps=3",
    "train.batch_size=32",
    "train.eval_every=3",
    "train.checkpoint_every=3",
    "train.warmup_steps=0",
    "train.log_every=1",
    "eval.batch_size=50",
    "rows=[{name: Embed-4D, position: embed-4d}, {name: LF 2/2, position: lff, "
    "options: {groups: 2}}, {name: CAPE, position: sine-4d, augment: {max_global_shift: 0.05}}]",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lff-boxes") / "run"
    cfg, mapping = resolve_config(LffBoxesConfig, PRESETS, "quick", [], TINY)
    exp.run(cfg, mapping, out)
    return cfg, mapping, out


def test_experiment_end_to_end(tiny_run):
    cfg, _, out = tiny_run
    results = json.loads((out / "results.json").read_text())
    recs = results["records"]
    assert {(r["row"], r["seed"]) for r in recs} == {
        (n, s) for n in ("Embed-4D", "LF 2/2", "CAPE") for s in (0, 1)
    }
    assert {r["set"] for r in recs} == {"test_seen", "test_unseen"}
    assert {r["question"] for r in recs} == {"all", "above", "left-aligned", "contains", "nearest"}
    for r in recs:
        assert 0.0 <= r["acc"] <= 100.0
        if r["question"] == "all":
            assert r["n"] == 64
    assert (
        sum(
            r["n"]
            for r in recs
            if r["row"] == "CAPE"
            and r["seed"] == 0
            and r["set"] == "test_seen"
            and r["question"] != "all"
        )
        == 64
    )
    assert results["params"]["Embed-4D"]["position"] == 64 * 16  # 4 axes x 64 values x 16/4
    assert results["params"]["CAPE"]["position"] == 0
    assert set(results["baselines"]) == {"majority", "content_only"}
    report = (out / "report.md").read_text()
    assert "| Embed-4D |" in report and "p unseen vs Embed-4D" in report and "| ref |" in report
    assert "max_global_shift" in report
    assert (out / "seen_vs_unseen.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "config.yaml").is_file()


def test_rerun_resumes_without_training(tiny_run, rerun_trains_nothing):
    cfg, mapping, out = tiny_run
    before = rerun_trains_nothing(exp, cfg, mapping, out)
    # without its eval.json, a run reloads its last checkpoint and takes no new step
    folder = exp.run_dir(out, cfg.rows[2], 0)
    latest = (folder / "checkpoints" / "latest").read_text()
    (folder / "eval.json").unlink()
    exp.run(cfg, mapping, out)
    assert (folder / "checkpoints" / "latest").read_text() == latest
    assert json.loads((out / "results.json").read_text())["records"] == before


def test_load_run_and_eval_records_reproduce_the_run(tiny_run):
    cfg, _, out = tiny_run
    data = exp.make_data(cfg)
    row = cfg.rows[1]
    model = exp.load_run(cfg, row, 1, out, data)
    records = exp.eval_records(cfg, row, 1, model, data, torch.device("cpu"))
    saved = json.loads((exp.run_dir(out, row, 1) / "eval.json").read_text())["records"]
    assert records == saved
    text = exp.format_records(records)
    assert "| test_unseen | all |" in text and "| test_seen | nearest |" in text
    with pytest.raises(FileNotFoundError, match="train it first"):
        exp.load_run(cfg, row, 5, out, data)


def test_redraw_reproduces_the_report(tiny_run):
    _, _, out = tiny_run
    text = (out / "report.md").read_text()
    (out / "report.md").unlink()
    (out / "seen_vs_unseen.png").unlink()
    exp.redraw(out)
    assert (out / "report.md").read_text() == text and (out / "seen_vs_unseen.png").is_file()
    with pytest.raises(ValueError, match="results.json"):
        exp.redraw(out / "nothing")


@pytest.mark.parametrize("name", ["RoPE-Axial-4D", "RoPE-Mixed-4D+CAPE"])
def test_rotary_rows_read_the_boxes_relations_only(name):
    """RoPE-ViT's rotations of the 4 edges in every layer, the question token at the query
    box: moving the whole screen leaves the answer unchanged, rescaling it does not."""
    cfg, _ = resolve_config(LffBoxesConfig, PRESETS, "peers", [], SMALL)
    row = next(r for r in cfg.rows if r.name == name)
    torch.manual_seed(0)
    model = exp.make_model(cfg, row).train()
    _, batch = _batch()
    loss, _ = answer_loss(model, batch)
    loss.backward()
    rotations = [m for m in model.modules() if isinstance(m, cape.RoPE2d)]
    assert len(rotations) == cfg.model.depth and all(r.pos_dim == 4 for r in rotations)
    hd = cfg.model.dim // cfg.model.heads
    learned = cfg.model.depth * cfg.model.heads * 4 * hd // 2 if "Mixed" in name else 0
    assert parameter_counts(model)["position"] == learned  # RoPE-Mixed's frequencies per layer
    if learned:
        assert all(r.head_freqs.grad is not None for r in rotations)
    model.eval()
    out = model(batch)
    step = torch.tensor([0.1, -0.2, 0.1, -0.2])  # (top, left, bottom, right): dy, dx, dy, dx
    moved = dict(batch, positions=batch["positions"] + step)
    torch.testing.assert_close(model(moved), out, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(model(dict(batch, positions=batch["positions"] * 0.5)), out)
    query = torch.zeros_like(batch["positions"])
    query[torch.arange(16), batch["query"]] = step  # only the query box moves
    assert not torch.allclose(model(dict(batch, positions=batch["positions"] + query)), out)
