"""The detection experiment: configs, the DETR of every row (where its positions go), and a tiny
full run (results, report, resume, redraw)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from cape.lab.experiments import EXPERIMENTS, resolve_config
from cape.lab.experiments.detection.config import DetectionConfig, position_options
from cape.lab.experiments.detection.data import as_images
from cape.lab.experiments.detection.experiment import DETECTION as exp
from cape.lab.experiments.detection.model import grid_positions, make_model
from cape.lab.experiments.detection.presets import PAPER_ROWS, PRESETS
from cape.models import without_positions

SMALL = [
    "data.sizes=[16,24,32]",
    "data.held_out=1",
    "model.dim=16",
    "model.heads=2",
    "model.enc_layers=1",
    "model.dec_layers=2",
    "model.ffn_dim=32",
    "model.queries=4",
    "model.fourier_dim=8",
    "model.hidden_dim=8",
]
_CAPE = "max_global_shift: 0.5, max_local_shift: auto, max_global_scaling: 1.4"
ROWS = (
    "rows=[{name: nopos, position: nopos}, {name: Sine-2D, position: sine-2d}, "
    "{name: Embed-2D, position: embed-2d}, {name: MLP, position: lff, options: {fourier: false}}, "
    "{name: Learnable-Fourier+MLP, position: lff}, "
    "{name: CAPE2d, position: cape2d, options: {" + _CAPE + ", normalize: true}}, "
    "{name: CAPE2d grid, position: cape2d, options: {" + _CAPE + ", fit_grid: true}}, "
    "{name: rotary2d+CAPE, position: rotary2d, options: {" + _CAPE + ", fit_grid: true}}]"
)


def _cfg(*extra: str, preset: str = "table2") -> DetectionConfig:
    return resolve_config(DetectionConfig, PRESETS, preset, [], [*SMALL, ROWS, *extra])[0]


def test_every_preset_resolves_and_round_trips():
    for name in PRESETS:
        cfg, mapping = resolve_config(DetectionConfig, PRESETS, name)
        again, _ = resolve_config(DetectionConfig, {"x": mapping}, "x")
        assert again == cfg
        assert set(PAPER_ROWS) <= {r.name for r in cfg.rows} and "nopos" in {
            r.name for r in cfg.rows
        }
    quick, _ = resolve_config(DetectionConfig, PRESETS, exp.default_preset)
    assert quick.data.held_out == 3 and not quick.data.normalize and len(quick.seeds) >= 2
    table1, _ = resolve_config(DetectionConfig, PRESETS, "table1")
    assert table1.data.held_out == 0 and table1.data.normalize
    full, _ = resolve_config(DetectionConfig, PRESETS, "cpu-full")
    positions = {r.position for r in full.rows}
    assert {"cape2d", "rotary2d"} <= positions and len(full.seeds) == 3
    assert EXPERIMENTS["detection"] is exp


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("data.sizes=[16,20]", ["data.sizes", "8"]),
        ("data.sizes=[32,16]", ["data.sizes", "increase"]),
        ("data.held_out=3", ["data.held_out", "3"]),
        ("data.max_side=0.9", ["data.max_side", "0.6"]),
        ("model.dim=18", ["model.dim"]),
        ("model.queries=2", ["model.queries", "max_objects"]),
        ("eval.small_side=0.5", ["eval.small_side", "eval.large_side"]),
        ("rows=[{name: a, position: sine-4d}]", ["rows[a].position", "sine-2d"]),
        ("rows=[{name: a, position: nopos, options: {x: 1}}]", ["rows[a]", "nopos"]),
        ("rows=[{name: a, position: lff, options: {colour: 1}}]", ["rows[a].options", "colour"]),
        (
            "rows=[{name: a, position: embed-2d, options: {sizes: [3, 3]}}]",
            ["rows[a].options.sizes"],
        ),
        ("seeds=[]", ["seeds"]),
    ],
)
def test_bad_config_names_the_key(override, words):
    with pytest.raises((ValueError, TypeError)) as err:
        resolve_config(DetectionConfig, PRESETS, "table2", [], [*SMALL, override])
    for w in words:
        assert w in str(err.value)


def test_grid_positions_count_cells_or_divide_by_the_grid():
    cells = grid_positions(2, 3, normalize=False, index=False)
    assert cells.shape == (1, 6, 2)
    assert cells[0].tolist() == [[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1]]  # (x, y)
    norm = grid_positions(2, 3, normalize=True, index=False)[0]
    assert torch.allclose(norm[4], torch.tensor([1.5 / 3, 1.5 / 2]))
    assert (norm > 0).all() and (norm < 1).all()
    index = grid_positions(2, 3, normalize=True, index=True)
    assert index.dtype == torch.int64 and index[0, 5].tolist() == [2, 1]


def test_position_options_follow_the_protocol():
    cfg = _cfg()
    rows = {r.name: r for r in cfg.rows}
    sine = position_options(rows["Sine-2D"], cfg.model, cfg.data)
    assert sine["freq_scale"] == 1.0  # DETR's sinusoid of cell indices
    embed = position_options(rows["Embed-2D"], cfg.model, cfg.data)
    assert embed["sizes"] == [4, 4]  # every cell index of the largest (32 px) grid
    cape = position_options(rows["CAPE2d grid"], cfg.model, cfg.data)
    assert cape["fit_grid"] == [3, 3] and cape["max_local_shift"] == pytest.approx(1 / 3)
    t1 = _cfg("data.held_out=0", "data.normalize=true")
    sine1 = position_options({r.name: r for r in t1.rows}["Sine-2D"], t1.model, t1.data)
    assert sine1["freq_scale"] == pytest.approx(2 * math.pi)  # DETR's normalize=True, 2 pi


@pytest.mark.parametrize("index", range(8))
def test_every_row_builds_runs_and_takes_its_positions_out(index):
    cfg = _cfg()
    row = cfg.rows[index]
    torch.manual_seed(0)
    model = make_model(cfg, row, 4).eval()
    images = torch.randn(2, 3, 24, 24)
    with torch.no_grad():
        out = model(images)
    assert len(out) == cfg.model.dec_layers
    logits, boxes = out[-1]
    assert logits.shape == (2, 4, 5) and boxes.shape == (2, 4, 4)
    assert ((boxes >= 0) & (boxes <= 1)).all()
    with without_positions(model) as had, torch.no_grad():
        blind = model(images)[-1][1]
    assert had == (row.position != "nopos")
    if had:  # the positions change the output, and nothing else is left to take out
        assert not torch.allclose(blind, boxes)
    # a bigger image runs too: the encodings take the larger grid
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32))[-1][1].shape == (1, 4, 4)


def test_detr_adds_positions_to_queries_and_keys_not_values():
    """With input positions off, an encoder layer's values are the content alone: a content of
    zeros gives an attention output of the value bias whatever the positions; with input
    positions on, the positions reach the values."""
    cfg = _cfg("model.input_positions=false")
    model = make_model(cfg, {r.name: r for r in cfg.rows}["Sine-2D"], 4).eval()
    layer = model.encoder[0]
    x = torch.zeros(1, 9, 16)
    pos = torch.randn(1, 9, 16)
    attn = layer.attn
    with torch.no_grad():
        out = attn.attend(x + pos, x + pos, x)
        want = attn.out_proj(attn.v_proj(x))  # every weight sums to 1 over equal values
        assert torch.allclose(out, want.expand_as(out), atol=1e-6)
        assert not torch.allclose(attn.attend(x + pos, x + pos, x + pos), out)


def test_input_positions_add_the_encoding_once_to_the_encoders_input():
    """model.input_positions: memory = encoder(stem + pos) instead of encoder(stem); with the
    layers taken away, what is left is the final norm of exactly that sum."""
    for on in (False, True):
        cfg = _cfg(f"model.input_positions={str(on).lower()}")
        model = make_model(cfg, {r.name: r for r in cfg.rows}["Sine-2D"], 4).eval()
        model.encoder = torch.nn.ModuleList()
        images = torch.randn(2, 3, 24, 24)
        with torch.no_grad():
            memory, pos = model.encode(images)
            feats = model.stem(images).flatten(2).transpose(1, 2)
            want = feats + pos if on else feats
        assert torch.allclose(memory, model.enc_norm(want), atol=1e-6)


def test_embed2d_rows_past_the_training_grid_are_never_trained():
    """Table 2: positions of the unseen sizes' extra cells have table rows no gradient reaches."""
    cfg = _cfg()
    model = make_model(cfg, {r.name: r for r in cfg.rows}["Embed-2D"], 4)
    before = model.position.table.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    for size in cfg.data.train_sizes:
        logits, boxes = model(torch.randn(2, 3, size, size))[-1]
        (logits.sum() + boxes.sum()).backward()
    opt.step()
    rows = model.position.sizes[0]  # 4 per axis; the training grids have 2 and 3 cells
    table = model.position.table.detach()
    for axis in range(2):
        seen = slice(axis * rows, axis * rows + 3)
        unseen = axis * rows + 3
        assert not torch.equal(table[seen], before[seen])
        assert torch.equal(table[unseen], before[unseen])


def test_images_keep_their_pixels_in_range():
    pixels = torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8)
    x = as_images(pixels, 16)
    assert x.shape == (2, 3, 16, 16) and x.min() >= -1 and x.max() <= 1
    assert torch.equal(as_images(pixels, 32), pixels.permute(0, 3, 1, 2).float() / 127.5 - 1)


TINY = [
    "seeds=[0,1]",
    "data.train=48",
    "data.val=8",
    "data.test=12",
    "train.steps=3",
    "train.batch_size=8",
    "train.eval_every=3",
    "train.checkpoint_every=3",
    "train.warmup_steps=0",
    "train.log_every=1",
    "eval.batch_size=6",
    "eval.examples=2",
    "eval.score=0.0",
    *SMALL,
    "rows=[{name: nopos, position: nopos}, {name: Sine-2D, position: sine-2d}, "
    "{name: Embed-2D, position: embed-2d}, {name: Learnable-Fourier+MLP, position: lff}]",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("detection")
    cfg, mapping = resolve_config(
        DetectionConfig, PRESETS, "table2", [], [*TINY, f"data.root={root / 'data'}"]
    )
    out = root / "run"
    exp.run(cfg, mapping, out)
    return cfg, mapping, out


def test_experiment_end_to_end(tiny_run):
    cfg, _, out = tiny_run
    results = json.loads((out / "results.json").read_text())
    recs = results["records"]
    names = ("nopos", "Sine-2D", "Embed-2D", "Learnable-Fourier+MLP")
    assert {(r["row"], r["seed"], r["size"]) for r in recs} == {
        (n, s, z) for n in names for s in (0, 1) for z in (16, 24, 32)
    }
    for r in recs:
        assert r["seen"] == (r["size"] in (16, 24)) and r["method"] == "plain"
        for key in ("ap", "ap50", "ap75"):
            assert 0.0 <= r[key] <= 100.0
    assert {r["row"] for r in results["removed"]} == set(names) - {"nopos"}
    assert set(results["examples"]) == set(names)
    assert set(results["examples"]["Sine-2D"]) == {"24", "32"}  # largest trained, largest
    assert len(results["examples"]["Sine-2D"]["32"]) == 2
    assert results["params"]["Embed-2D"]["position"] == 2 * 4 * 8  # 2 axes x 4 cells x 16 / 2
    assert results["params"]["Sine-2D"]["position"] == 0
    report = (out / "report.md").read_text()
    assert "## Verdict" in report and "**Positions needed?**" in report
    assert "Table 2 analogue" in report and "| Learnable-Fourier+MLP |" in report
    for png in ("ap_vs_size.png", "examples.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rerun_resumes_without_training(tiny_run, rerun_trains_nothing):
    cfg, mapping, out = tiny_run
    rerun_trains_nothing(exp, cfg, mapping, out)


def test_load_run_and_eval_records_reproduce_the_run(tiny_run):
    cfg, _, out = tiny_run
    data = exp.make_data(cfg)
    row = cfg.rows[3]
    model = exp.load_run(cfg, row, 1, out, data)
    records = exp.eval_records(cfg, row, 1, model, data, torch.device("cpu"))
    saved = json.loads((exp.run_dir(out, row, 1) / "eval.json").read_text())["records"]
    assert records == saved
    assert "| 32 | no | plain |" in exp.format_records(records)


def test_redraw_reproduces_the_report(tiny_run):
    _, _, out = tiny_run
    text = (out / "report.md").read_text()
    (out / "report.md").unlink()
    exp.redraw(out)
    assert (out / "report.md").read_text() == text
