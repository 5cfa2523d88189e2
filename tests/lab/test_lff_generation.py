"""The LFF image-generation study (`cape.lab.experiments.lff_generation`): sequences, causality,
bits per dim, every row's model, config errors, confidence intervals, a tiny end-to-end run."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
import torch

from cape.lab.experiments import resolve_config
from cape.lab.experiments.lff_generation.config import PRESETS, GenerationConfig
from cape.lab.experiments.lff_generation.model import (
    POSITIONS,
    START,
    PixelPositions,
    PixelTransformer,
    bits_per_dim,
    flatten_images,
    shift_right,
    unflatten_images,
)
from cape.lab.experiments.lff_generation.report import confidence_cells, t_quantile_975
from cape.models import without_positions
from cape.positions import grid_indices, grid_positions

ALL_ROWS = PRESETS["cpu-full"]["rows"]


def test_flatten_is_raster_order_rgb_interleaved_and_round_trips():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (5, 4, 3, 3), generator=g, dtype=torch.uint8)  # H=4, W=3
    seqs = flatten_images(images)
    assert seqs.shape == (5, 4 * 3 * 3) and seqs.dtype == torch.uint8
    for n in range(5):
        for y in range(4):
            for x in range(3):
                for c in range(3):
                    assert seqs[n, (y * 3 + x) * 3 + c] == images[n, y, x, c]
    assert torch.equal(unflatten_images(seqs, 4, 3), images)
    with pytest.raises(ValueError, match="seqs"):
        unflatten_images(seqs, 3, 3)
    with pytest.raises(ValueError, match="images"):
        flatten_images(images[..., :2])


def test_shift_right_starts_with_the_start_token():
    seqs = torch.tensor([[7, 8, 9], [0, 255, 1]], dtype=torch.uint8)
    inputs = shift_right(seqs)
    assert inputs.dtype == torch.long
    assert inputs.tolist() == [[START, 7, 8], [START, 0, 255]]


def _tiny_model(row: dict, size: int = 4, **kw) -> PixelTransformer:
    torch.manual_seed(0)
    opts = dict(dim=16, channel_dim=4, depth=2, heads=2, ffn_dim=32)
    opts.update(kw)
    return PixelTransformer(
        size, size, row["position"], position_options=row.get("options"), **opts
    )


@pytest.mark.parametrize("row", ALL_ROWS, ids=[r["name"] for r in ALL_ROWS])
def test_no_logit_sees_its_own_or_a_later_value(row):
    model = _tiny_model(row).eval()
    g = torch.Generator().manual_seed(1)
    seqs = torch.randint(0, 256, (2, model.length), generator=g)
    for j in (0, 17, model.length - 2):
        other = seqs.clone()
        other[:, j] = (other[:, j] + 101) % 256  # the value logits[:, j] predict
        with torch.no_grad():
            a, b = model(seqs), model(other)
        torch.testing.assert_close(a[:, : j + 1], b[:, : j + 1], rtol=0, atol=1e-5)
        assert not torch.allclose(a[:, j + 1], b[:, j + 1])  # the next token does see it


def test_causality_holds_with_cape_augmentation_in_training():
    model = _tiny_model({"position": "cape2d", "options": {"preset": "image"}}).train()
    seqs = torch.randint(0, 256, (3, model.length), generator=torch.Generator().manual_seed(2))
    other = seqs.clone()
    other[:, 20] = 255 - other[:, 20]
    torch.manual_seed(5)
    a = model(seqs)
    torch.manual_seed(5)  # the same augmentation draws
    b = model(other)
    torch.testing.assert_close(a[:, :21], b[:, :21], rtol=0, atol=1e-5)
    torch.manual_seed(6)
    assert not torch.allclose(model(seqs)[:, :21], a[:, :21])  # the draws do move the positions


def test_bits_per_dim_uniform_is_8_and_matches_numpy():
    targets = torch.randint(0, 256, (3, 10))
    assert bits_per_dim(torch.zeros(3, 10, 256), targets).item() == pytest.approx(8.0, abs=1e-5)
    logits = torch.randn(3, 10, 256, generator=torch.Generator().manual_seed(0)) * 3
    z = logits.double().numpy()
    logp = z - z.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, targets.numpy()[..., None], -1)
    expected = -picked.mean() / np.log(2.0)
    assert bits_per_dim(logits, targets).item() == pytest.approx(expected, rel=1e-5)


def test_evaluate_bpd_weights_every_intensity_equally():
    from cape.lab.experiments.lff_generation.evaluate import evaluate_bpd

    class Fixed(torch.nn.Module):
        """Puts probability p on intensity 0 and spreads the rest: bits depend on the value."""

        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def forward(self, seqs):
            logits = torch.zeros(*seqs.shape, 256)
            logits[..., 0] = 4.0
            return logits

    seqs = torch.randint(0, 3, (7, 5))
    p0 = math.exp(4) / (math.exp(4) + 255)
    p_other = 1 / (math.exp(4) + 255)
    bits = [-math.log2(p0 if v == 0 else p_other) for v in seqs.flatten().tolist()]
    for batch in (1, 3, 7):  # uneven last batches must not change the mean
        assert evaluate_bpd(Fixed(), seqs, batch) == pytest.approx(sum(bits) / len(bits), rel=1e-5)


@pytest.mark.parametrize("row", ALL_ROWS, ids=[r["name"] for r in ALL_ROWS])
def test_every_row_trains_forward_backward(row):
    model = _tiny_model(row, size=5).train()
    seqs = torch.randint(0, 256, (2, model.length))
    logits = model(seqs)
    assert logits.shape == (2, 5 * 5 * 3, 256)
    bits_per_dim(logits, seqs).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    for name, p in model.position.named_parameters():
        assert p.grad.abs().sum() > 0, f"position parameter {name} gets no gradient"
    pixel = 16 - 4
    learned = {"embed-1d": 25 * pixel, "embed-2d": (5 + 5) * pixel // 2}
    if row["position"] in ("sine-1d", "sine-2d", "cape2d"):
        assert model.position_parameters() == 3 * 4  # the channel embedding only
    elif row["position"] in learned:
        assert model.position_parameters() == learned[row["position"]] + 3 * 4


def test_forward_rejects_wrong_sequences():
    model = _tiny_model({"position": "sine-2d"})
    with pytest.raises(ValueError, match="48"):
        model(torch.zeros(2, 47, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        model(torch.zeros(2, 48))


def test_every_preset_resolves_and_round_trips():
    for name in PRESETS:
        cfg, mapping = resolve_config(GenerationConfig, PRESETS, name)
        assert cfg.rows and mapping["name"] == cfg.name
        again, _ = resolve_config(GenerationConfig, {"x": mapping}, "x")
        assert again == cfg
    full, _ = resolve_config(GenerationConfig, PRESETS, "cpu-full")
    assert len(full.rows) == 8 and len(full.seeds) == 3


@pytest.mark.parametrize(
    "override, words",
    [
        ("model.channel_dim=64", ["model.channel_dim", "below"]),
        ("model.heads=5", ["model.heads", "divisible"]),
        ("rows=[{name: a, position: sine-3d}]", ["rows[a].position", "sine-2d", "lff"]),
        ("rows=[{name: a, position: lff, options: {gamma: -1}}]", ["rows[a].options", "gamma"]),
        ("rows=[{name: a, position: lff, options: {colour: 1}}]", ["rows[a].options", "colour"]),
        ("train.eval_every=0", ["train.eval_every"]),
        ("train.best_metric=loss", ["train.best_metric", "bpd"]),
        ("data.size=1", ["data.size"]),
        ("data.val=0", ["data.val"]),
        ("eval.batch_size=0", ["eval.batch_size"]),
        ("model.dimx=3", ["model.dimx", "channel_dim"]),
    ],
)
def test_bad_config_names_the_key(override, words):
    with pytest.raises((ValueError, TypeError)) as err:
        resolve_config(GenerationConfig, PRESETS, "quick", [], [override])
    for w in words:
        assert w in str(err.value)


def _t_cdf(t: float, df: int, steps: int = 20000) -> float:
    """Student's t CDF by Simpson's rule on the density over [0, t] (t > 0)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    f = [c * (1 + (t * i / steps) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
    area = (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2])) * (t / steps) / 3
    return 0.5 + area


def test_t_quantiles_against_closed_forms_and_the_density():
    assert t_quantile_975(1) == pytest.approx(math.tan(math.pi * 0.475), abs=1e-3)
    p = 0.975  # df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    assert t_quantile_975(2) == pytest.approx(
        (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))), abs=1e-3
    )
    for df in (3, 7, 30, 31, 60, 200):
        assert _t_cdf(t_quantile_975(df), df) == pytest.approx(0.975, abs=1e-4)
    with pytest.raises(ValueError, match="df"):
        t_quantile_975(0)


def test_confidence_cells_are_t_intervals():
    recs = [{"row": "a", "bpd": v} for v in (3.0, 3.4, 3.1)] + [{"row": "b", "bpd": 2.0}]
    a, b = confidence_cells(recs, ["row"], "bpd")
    half = 4.303 * statistics.stdev([3.0, 3.4, 3.1]) / math.sqrt(3)
    assert a["ci"] == pytest.approx(half) and a["lo"] == pytest.approx(
        statistics.mean([3.0, 3.4, 3.1]) - half
    )
    assert (b["ci"], b["lo"], b["hi"]) == (0.0, 2.0, 2.0)


def test_plot_curves_band_is_drawn_between_the_named_keys(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.collections import PolyCollection

    from cape.lab.viz import plot_curves
    from cape.lab.viz.plots import _curves_figure

    cells = [
        {"row": "a", "step": s, "mean": m, "n": 3, "std": 0.1, "lo": m - 0.2, "hi": m + 0.3}
        for s, m in ((10, 5.0), (20, 4.0))
    ]
    fig = _curves_figure(cells, x="step", series="row", y_label="y", x_label="x", band=("lo", "hi"))
    polys = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    assert len(polys) == 1
    ys = polys[0].get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(3.8) and ys.max() == pytest.approx(5.3)
    import matplotlib.pyplot as plt

    plt.close(fig)
    with pytest.raises(ValueError, match="'hi'"):
        plot_curves(
            [{k: v for k, v in c.items() if k != "hi"} for c in cells],
            tmp_path / "p.png",
            x="step",
            series="row",
            y_label="y",
            x_label="x",
            band=("lo", "hi"),
        )
    with pytest.raises(ValueError, match="band"):
        plot_curves(
            cells, tmp_path / "p.png", x="step", series="row", y_label="y", x_label="x", band="lo"
        )


TINY = [
    "name=tiny",
    "seeds=[0,1]",
    "data.size=4",
    "data.train=24",
    "data.val=8",
    "data.workers=1",
    "model.dim=16",
    "model.channel_dim=4",
    "model.depth=1",
    "model.heads=2",
    "model.ffn_dim=32",
    "train.steps=4",
    "train.batch_size=8",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.warmup_steps=0",
    "train.log_every=1",
    "eval.batch_size=3",
    "rows=[{name: Sine-2D, position: sine-2d}, {name: LFF+MLP, position: lff}, "
    "{name: LF, position: lff, options: {mlp: false}}]",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from cape.lab.experiments.lff_generation.experiment import LFF_GENERATION

    out = tmp_path_factory.mktemp("lffgen")
    overrides = [*TINY, f"data.root={out / 'data'}"]
    cfg, mapping = resolve_config(GenerationConfig, PRESETS, "quick", [], overrides)
    LFF_GENERATION.run(cfg, mapping, out / "run")
    return out / "run", cfg, mapping


def test_end_to_end_writes_curves_table_and_plots(tiny_run):
    run, cfg, _ = tiny_run
    results = json.loads((run / "results.json").read_text())
    assert results["experiment"] == "lff-generation"
    recs, curves = results["records"], results["curves"]
    assert {(r["row"], r["seed"]) for r in recs} == {
        (n, s) for n in ("Sine-2D", "LFF+MLP", "LF") for s in (0, 1)
    }
    for r in recs:
        steps = [c for c in curves if c["row"] == r["row"] and c["seed"] == r["seed"]]
        assert [c["step"] for c in steps] == [2, 4]
        # the final model's bpd is the curve's last point (the same held-out images)
        assert r["bpd"] == pytest.approx(steps[-1]["bpd"], rel=1e-4)
        assert 0 < r["bpd"] < 12 and r["images"] == 8
    report = (run / "report.md").read_text()
    for name in ("| Sine-2D |", "| LFF+MLP |", "| LF |", "95% CI", "step 4"):
        assert name in report
    for png in ("bpd_vs_steps.png", "bpd_vs_steps_lff.png"):
        assert (run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rerun_resumes_without_training(tiny_run, monkeypatch):
    from cape.lab.experiments.lff_generation.experiment import LFF_GENERATION as gen

    run, cfg, mapping = tiny_run
    before = json.loads((run / "results.json").read_text())

    def boom(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(gen, "train_run", boom)
    gen.run(cfg, mapping, run)
    assert json.loads((run / "results.json").read_text())["records"] == before["records"]
    monkeypatch.undo()
    # without its eval.json a run resumes from its last checkpoint: no step is trained again
    folder = gen.run_dir(run, cfg.rows[1], 0)
    metrics = (folder / "metrics.jsonl").read_text()
    (folder / "eval.json").unlink()
    after = gen.run(cfg, mapping, run)
    assert (folder / "metrics.jsonl").read_text() == metrics
    assert after["records"] == before["records"] and after["curves"] == before["curves"]


def test_redraw_rebuilds_the_report(tiny_run):
    from cape.lab.experiments.lff_generation.experiment import LFF_GENERATION

    run, _, _ = tiny_run
    text = (run / "report.md").read_text()
    (run / "report.md").unlink()
    (run / "bpd_vs_steps.png").unlink()
    LFF_GENERATION.redraw(run)
    assert (run / "report.md").read_text() == text and (run / "bpd_vs_steps.png").is_file()


def _read_by_hand(kind: str, height: int, width: int, batch: int) -> torch.Tensor:
    """The positions each row of the archived runs fed its pixel encoding, computed apart from
    the model: the pixel index (1-D rows), integer (column, row) bins (embed-2d), (column, row)
    in pixel units as floats (sine-2d, lff), CAPE's grid in [-1, 1] (cape2d)."""
    if kind in ("embed-1d", "sine-1d"):
        pos = torch.arange(height * width, dtype=torch.float32)[:, None]
    elif kind == "embed-2d":
        pos = grid_indices(height, width)
    elif kind in ("sine-2d", "lff"):
        pos = grid_indices(height, width).to(torch.float32)
    else:
        pos = grid_positions(height, width, extent=1.0)
    assert pos.shape == (height * width, 2 if kind not in ("embed-1d", "sine-1d") else 1)
    return pos[None].expand(batch, -1, -1)


PIXEL_ROWS = [(kind, {}) for kind in POSITIONS if kind != "nopos"] + [
    ("lff", {"mlp": False}),
    ("lff", {"fourier": False}),
    ("cape2d", {"preset": "image"}),
]


@pytest.mark.parametrize(("kind", "options"), PIXEL_ROWS)
def test_pixel_encoding_reads_the_archived_positions(kind, options):
    height, width, batch = 3, 5, 2
    torch.manual_seed(0)
    pos = PixelPositions(kind, 40, 8, height, width, options).eval()
    assert pos.kind == kind and pos.pixel.kind == "absolute"
    want = pos.pixel(positions=_read_by_hand(kind, height, width, batch))
    got = pos.pixel_encoding(batch)
    assert got.shape == (batch, height * width, 32)
    assert torch.equal(got, want)  # bit for bit: the archived rows reproduce
    if kind == "cape2d" and options:  # training: the grid call's emax = 1/N per axis
        pos.train()
        torch.manual_seed(1)
        a = pos.pixel_encoding(batch)
        torch.manual_seed(1)
        b = pos.pixel(pos.index.new_zeros(batch, height * width, 32), grid=(height, width))
        assert torch.equal(a, b) and not torch.equal(a, want)


def test_nopos_pixels_carry_the_channel_alone():
    """nopos, and any row with its pixel encoding taken out (`without_positions`): zeros in the
    pixel part, the channel embedding kept (which of R, G, B a token is)."""
    blind = PixelPositions("nopos", 40, 8, 3, 5)
    out = blind(2)
    assert out.shape == (2, 45, 40) and not out[..., :32].any()
    assert torch.equal(out[0, :3, 32:], blind.channel.weight)
    net = PixelTransformer(3, 5, "sine-2d", dim=40, channel_dim=8, depth=1, heads=2, ffn_dim=32)
    net.eval()
    seqs = torch.randint(0, 256, (2, 45))
    with torch.no_grad(), without_positions(net) as had:
        assert had and not net.position(2)[..., :32].any()
        net(seqs)
    assert net.position(2)[..., :32].any()  # and back


def test_pixel_positions_ask_the_plan_and_refuse_in_attention_names():
    for name in ("rotary", "relpos", "alibi", "fire"):
        with pytest.raises(ValueError, match="inside attention.*embed-1d"):
            PixelPositions(name, 40, 8, 3, 3)
    with pytest.raises(ValueError, match="sine-2d"):  # an unknown name lists cape.build's
        PixelPositions("sine-3d", 40, 8, 3, 3)
    with pytest.raises(ValueError, match="4-D"):
        PixelPositions("embed-4d", 40, 8, 3, 3, {"sizes": (3, 3, 3, 3)})
    # another absolute name reads what it declares: a 1-D sinusoid, the pixel index
    pos = PixelPositions("sinpos", 40, 8, 3, 4)
    want = pos.pixel(positions=_read_by_hand("sine-1d", 3, 4, 2))
    assert torch.equal(pos.pixel_encoding(2), want)
