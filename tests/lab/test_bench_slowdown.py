"""`cape bench slowdown` (CAPE Table 9) on tiny sizes: its tables, models and updates, not its
speed."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from cape.build import build, encoding_class
from cape.encodings.fourier import LearnableFourierFeatures
from cape.encodings.learned import AbsPos1d
from cape.encodings.relative import RelPos
from cape.encodings.rotary import Rotary
from cape.encodings.sinusoidal import CAPE1d
from cape.lab.bench import slowdown
from cape.lab.bench.slowdown import SlowdownConfig, build_model, update_fn
from cape.lab.bench.table9 import table9_rows
from cape.models import TransformerDecoder, TransformerEncoder

TINY = SlowdownConfig(batch=2, dim=16, heads=2, ffn=32, layers=2, warmup=1, runs=2)
TINY_ARGS = [
    "--batch",
    "2",
    "--dim",
    "16",
    "--heads",
    "2",
    "--ffn",
    "32",
    "--layers",
    "2",
    "--runs",
    "2",
    "--warmup",
    "1",
    "--lengths",
    "4,12",
]


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_main_writes_both_tables_with_ratios_of_one_run(tmp_path: Path) -> None:
    assert slowdown.main([*TINY_ARGS, "--dtypes", "fp32,bf16", "--out", str(tmp_path)]) == 0
    for name in ("slowdown", "table9"):
        assert (tmp_path / f"{name}.md").is_file() and (tmp_path / f"{name}.csv").is_file()
    rows = _csv(tmp_path / "slowdown.csv")
    keys = [(r["model"], r["encoding"], r["dtype"], r["length"]) for r in rows]
    assert len(keys) == len(set(keys)) == 3 * len(slowdown.ENCODINGS) * 2 * 2
    assert {k[1] for k in keys} >= {"relpos-100", "relpos-1000"}
    assert rows[0]["torch"] == torch.__version__ and rows[0]["batch"] == "2"
    base = {
        (r["model"], r["dtype"], r["length"]): float(r["median_ms"])
        for r in rows
        if r["encoding"] == "nopos"
    }
    for r in rows:
        ratio, median = float(r["ratio"]), float(r["median_ms"])
        assert float(r["iqr_ms"]) >= 0
        if r["encoding"] == "nopos":
            assert ratio == 1.0
        else:
            assert ratio == median / base[(r["model"], r["dtype"], r["length"])]
        assert (r["target"] in ("ok", "MISSED")) == (r["encoding"] == "cape1d")
    table = _csv(tmp_path / "table9.csv")
    assert len(table) == 3 * (len(slowdown.ENCODINGS) - 1)  # nopos is the reference, left out
    assert {"fp32 len-4", "fp32 len-12", "bf16 len-4", "bf16 len-12"} <= set(table[0])
    md = (tmp_path / "table9.md").read_text()
    assert "| encoder | relpos-1000 |" in md and "Table 9" in md


def test_subset_always_times_nopos(tmp_path: Path) -> None:
    args = [*TINY_ARGS, "--models", "layer", "--encodings", "cape1d", "--dtypes", "fp32"]
    assert slowdown.main([*args, "--out", str(tmp_path)]) == 0
    rows = _csv(tmp_path / "slowdown.csv")
    assert [r["encoding"] for r in rows] == ["nopos", "cape1d"] * 2


def _encodings(model: torch.nn.Module, name: str) -> list[torch.nn.Module]:
    cls = encoding_class(name, key="position")
    return [m for m in model.modules() if isinstance(m, cls)]


def test_every_label_is_a_row_and_is_described_in_the_docstring_and_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert tuple(slowdown.ROWS) == slowdown.ENCODINGS + slowdown.PEERS
    with pytest.raises(SystemExit):
        slowdown.main(["--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert slowdown.describe("relpos-100") == "relpos-100 = relpos(max_distance=100)"
    assert slowdown.describe("xpos") == "xpos = rotary(xpos=True)"
    for label in slowdown.ROWS:
        assert slowdown.describe(label) in slowdown.__doc__, label
        assert slowdown.describe(label) in helptext, label


@pytest.mark.parametrize("kind", slowdown.MODELS)
@pytest.mark.parametrize("label", list(slowdown.ROWS))
def test_each_label_builds_the_cape_build_name_it_claims(kind: str, label: str) -> None:
    name, options = slowdown.row_position(label, kind, 12)
    assert name == slowdown.ROWS[label].position
    model = build_model(kind, label, TINY, max_length=12)
    assert model.plan.name == name
    layers = 1 if kind == "layer" else TINY.layers
    if model.plan.kind == "none":
        assert name == "nopos" and model.position is None and not model.plan.in_attention
        return
    found = _encodings(model, name)
    if model.plan.in_attention:  # a module in every layer's self-attention, none at the input
        # one for the whole stack when it holds no parameters (rotary, ALiBi), else one each
        shared = not any(True for _ in found[0].parameters())
        assert model.position is None and len(found) == (1 if shared else layers)
        assert all(len(_encodings(layer.self_attn, name)) == 1 for layer in model.layers)
        per_head = name in ("alibi", "fire")
        size = TINY.heads if per_head else TINY.head_dim
    else:  # added once, at the input
        assert found == [model.position]
        size = TINY.dim
    # the same module, options and all, as cape.build makes from the label's name and options
    want = repr(build(name, size, **options))
    assert all(repr(m) == want for m in found), (repr(found[0]), want)


def test_row_options_follow_the_cell() -> None:
    assert slowdown.row_position("abspos", "encoder", 37) == ("abspos", {"num_positions": 37})
    cape = {"preset": "text", "max_global_scaling": 1.1, "normalize": True}
    assert slowdown.row_position("cape1d", "encoder", 10) == ("cape1d", cape)
    causal = {**cape, "normalize": False}  # the decoder stays causal
    assert slowdown.row_position("cape1d", "decoder", 10) == ("cape1d", causal)
    assert slowdown.row_position("relpos-1000", "decoder", 10) == ("relpos", {"max_distance": 1000})
    assert slowdown.ROWS["cape1d"].options["normalize"] is True  # the row itself is untouched


@pytest.mark.parametrize("kind", slowdown.MODELS)
@pytest.mark.parametrize("context", [100, 1000])
def test_relpos_sits_in_every_layer(kind: str, context: int) -> None:
    model = build_model(kind, f"relpos-{context}", TINY)
    rel = [m for m in model.modules() if isinstance(m, RelPos)]
    assert len(rel) == (1 if kind == "layer" else TINY.layers)
    assert all(r.max_distance == context and r.head_dim == TINY.head_dim for r in rel)
    assert model.position is None


def test_an_unknown_label_is_refused_naming_the_labels() -> None:
    for bad in ("foo", "relpos", "relpos-10", "RoTaRy"):
        with pytest.raises(ValueError, match=r"relpos-100.*xpos") as err:
            build_model("layer", bad, TINY)
        assert repr(bad) in str(err.value)
    with pytest.raises(ValueError, match="relpos-1000"):
        slowdown.row_position("sine-2d", "layer", 10)


@pytest.mark.parametrize("kind", slowdown.MODELS)
def test_models_hold_their_encoding(kind: str) -> None:
    stack = TransformerDecoder if kind == "decoder" else TransformerEncoder
    for name, cls in (
        ("cape1d", CAPE1d),
        ("sinpos", CAPE1d),
        ("abspos", AbsPos1d),
        ("lff", LearnableFourierFeatures),
    ):
        model = build_model(kind, name, TINY, max_length=12)
        assert isinstance(model, stack) and isinstance(model.position, cls) and model.training
        assert model.position.training
    cape = build_model(kind, "cape1d", TINY).position
    assert cape.augmentation is not None and cape.augmentation.random
    assert cape.augmentation.normalize == (kind != "decoder")  # the decoder stays causal
    assert build_model(kind, "sinpos", TINY).position.augmentation is None
    assert build_model(kind, "abspos", TINY, max_length=12).position.num_positions == 12
    model = build_model(kind, "rotary", TINY)
    rot = [m for m in model.modules() if isinstance(m, Rotary)]
    assert len(rot) == 1  # no parameters: one module for the stack (modules() lists it once)
    assert all(layer.self_attn.rotary is rot[0] for layer in model.layers)
    assert build_model(kind, "nopos", TINY).position is None
    layers = build_model(kind, "nopos", TINY).layers
    assert len(layers) == (1 if kind == "layer" else TINY.layers)
    assert all(
        m.p == 0.0
        for m in build_model(kind, "nopos", TINY).modules()
        if isinstance(m, torch.nn.Dropout)
    )


@pytest.mark.parametrize("kind", ["layer", "decoder"])
@pytest.mark.parametrize("encoding", ["abspos", "lff", "relpos-100", "relpos-1000"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_update_trains_the_learned_encoding(kind: str, encoding: str, dtype: torch.dtype) -> None:
    model = build_model(kind, encoding, TINY, max_length=12)
    x = torch.randn(2, 12, TINY.dim)
    memory = torch.randn(2, 12, TINY.dim) if kind == "decoder" else None
    update = update_fn(model, x, memory, dtype, "cpu")
    update()
    learned = [
        p
        for m in model.modules()
        if isinstance(m, (AbsPos1d, LearnableFourierFeatures, RelPos))
        for p in m.parameters()
    ]
    assert learned and all(p.grad is not None and p.grad.abs().sum() > 0 for p in learned)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    first = [p.grad.clone() for p in learned]
    update()  # grads are reset, not accumulated
    assert all(torch.allclose(a, p.grad) for a, p in zip(first, learned, strict=True))


def test_update_fn_checks_memory() -> None:
    x = torch.randn(2, 4, TINY.dim)
    with pytest.raises(ValueError, match="memory"):
        update_fn(build_model("decoder", "nopos", TINY), x, None, torch.float32, "cpu")
    with pytest.raises(ValueError, match="memory"):
        update_fn(build_model("encoder", "nopos", TINY), x, x, torch.float32, "cpu")


def test_table9_rows_shape_and_target() -> None:
    def row(enc: str, dtype: str, length: int, ratio: float) -> dict[str, object]:
        return dict(model="encoder", encoding=enc, dtype=dtype, length=length, ratio=ratio)

    rows = [
        row("nopos", "fp32", 10, 1.0),
        row("cape1d", "fp32", 10, 1.01),
        row("relpos-100", "fp32", 10, 2.0),
        row("nopos", "fp32", 100, 1.0),
        row("cape1d", "fp32", 100, 1.05),
    ]
    table = table9_rows(rows)
    assert [(t["encoding"], t["fp32 len-10"], t["fp32 len-100"], t["target"]) for t in table] == [
        ("cape1d", 1.01, 1.05, "MISSED 1/2"),
        ("relpos-100", 2.0, "", ""),
    ]
    assert table9_rows([row("nopos", "fp32", 10, 1.0)])[0]["encoding"] == "nopos"


def test_config_and_builders_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="batch"):
        SlowdownConfig(batch=0)
    with pytest.raises(ValueError, match="heads"):
        SlowdownConfig(dim=16, heads=3)
    with pytest.raises(ValueError, match="kind"):
        build_model("vit", "nopos", TINY)
    with pytest.raises(ValueError, match="encoding"):
        build_model("layer", "foo", TINY)
    with pytest.raises(ValueError, match="nopos"):
        slowdown.run_cell("layer", 4, "fp32", ["cape1d"], TINY)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--encodings", "foo"], "--encodings"),
        (["--dtypes", "fp16"], "--dtypes"),
        (["--lengths", "0"], "--lengths"),
        (["--lengths", "ten"], "--lengths"),
        (["--models", "vit"], "--models"),
        (["--heads", "3"], "--heads"),
        (["--device", "tpu"], "--device"),
    ],
)
def test_bad_arguments_exit_naming_the_flag(
    args: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        slowdown.main(args)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("kind", slowdown.MODELS)
def test_attention_biases_sit_in_every_layer_and_are_timed_on_request(
    kind: str, tmp_path: Path
) -> None:
    import cape

    for name, cls in (("alibi", cape.ALiBi), ("fire", cape.FIRE)):
        model = build_model(kind, name, TINY)
        biases = [m for m in model.modules() if isinstance(m, cls)]
        per_layer = 1 if kind == "layer" or name == "alibi" else TINY.layers  # ALiBi: one module
        assert len(biases) == per_layer, name
        assert all(len(layer.self_attn.biases) == 1 for layer in model.layers), name
        assert all(b.heads == TINY.heads for b in biases)
        x = torch.randn(TINY.batch, 5, TINY.dim)
        memory = torch.randn(TINY.batch, 5, TINY.dim) if kind == "decoder" else None
        update_fn(model, x, memory, torch.float32, "cpu")()  # one forward + backward runs
    xpos = [m for m in build_model(kind, "xpos", TINY).modules() if isinstance(m, Rotary)]
    assert len(xpos) == 1  # no parameters: one module for the stack
    assert all(m.xpos and m.head_dim == TINY.head_dim for m in xpos)
    assert "alibi" not in slowdown.ENCODINGS  # not in the default table: on request
    args = [*TINY_ARGS, "--models", kind, "--encodings", "alibi,fire,xpos", "--dtypes", "fp32"]
    assert slowdown.main([*args, "--out", str(tmp_path)]) == 0
    rows = _csv(tmp_path / "slowdown.csv")
    assert [r["encoding"] for r in rows] == ["nopos", "alibi", "fire", "xpos"] * 2
    assert all(float(r["ratio"]) > 0 for r in rows)
