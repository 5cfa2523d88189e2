"""What the language-model study sets from L (RoPE's train_length and factor, FIRE's threshold),
how its report names each row's options, and how its verdict states what a fine-tune buys."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from cape.encodings.fire import FIRE
from cape.encodings.rotary import Rotary
from cape.lab.experiments import resolve_config
from cape.lab.experiments.lm.config import LMConfig, derived_options, position_options
from cape.lab.experiments.lm.model import make_model
from cape.lab.experiments.lm.presets import PRESETS
from cape.lab.experiments.lm.report import ppl_table
from cape.lab.experiments.lm.verdict import finetunes


@pytest.fixture(scope="module")
def full():
    cfg, _ = resolve_config(LMConfig, PRESETS, "cpu-full", [], [])
    return cfg


def test_fire_threshold_is_a_quarter_of_the_training_context(full):
    # the authors' threshold 512 over their 2048-token training length, at L = 256
    assert full.data.context == 256
    for name in ("FIRE", "FIRE+CAPE"):
        model = make_model(full, full.row(name), 256)
        fires = [m for m in model.modules() if isinstance(m, FIRE)]
        assert len(fires) == full.model.layers
        assert all(f.threshold0 == 64.0 and float(f.threshold.detach()) == 64.0 for f in fires)
    # the other rows get nothing of it, and a threshold given by the row is kept
    assert "threshold" not in position_options(full.row("ALiBi"), full)
    assert derived_options("fire", {"threshold": 10.0}, context=256) == {"threshold": 10.0}
    assert derived_options("fire", {}, context=128) == {"threshold": 32.0}


def test_xpos_scale_base_is_half_the_training_context(full):
    # the xPos paper's scale base 512 over its 1024-token training, at L = 256
    model = make_model(full, full.row("xPos"), 256)
    rotaries = [m for m in model.modules() if isinstance(m, Rotary)]
    assert rotaries and all(r.xpos and r.xpos_scale_base == 128.0 for r in rotaries)
    assert "xpos_scale_base" not in position_options(full.row("rotary"), full)
    assert derived_options("rotary", {"xpos": True}, context=64) == {
        "xpos": True,
        "xpos_scale_base": 32.0,
    }


def test_rope_scaling_reads_L_and_the_finetune_factor(full):
    at_inference = position_options(full.row("rotary YaRN@inference"), full, evaluation=True)
    assert at_inference == {"scaling": "yarn", "train_length": 256}  # factor: length / L
    assert position_options(full.row("rotary YaRN@inference"), full) == {}  # rotary's training
    tuned = position_options(full.row("rotary PI fine-tuned"), full)
    assert tuned == {"scaling": "pi", "train_length": 256, "factor": 4.0}
    assert position_options(full.row("rotary PI fine-tuned"), full, evaluation=True) == tuned


def _results(rows, factors=(1, 2, 4, 8)):
    return {
        "config": {
            "rows": rows,
            "data": {"context": 256},
            "finetune": {"factor": 4, "steps": 100},
            "eval": {"factors": list(factors)},
        }
    }


def test_report_names_the_options_each_row_runs_with(full):
    mapping = asdict(full)
    table = ppl_table({"config": mapping, "records": [], "train": {}})
    line = {row.split(" | ")[0][2:]: row for row in table.splitlines()[2:]}
    assert "fire (threshold=64.0)" in line["FIRE"]
    assert "rotary (xpos=True, xpos_scale_base=128.0)" in line["xPos"]
    assert "train_length=256 at evaluation" in line["rotary PI@inference"]
    assert "factor=length/L at each length" in line["rotary PI@inference"]
    assert "scaling=pi, train_length=256, factor=4.0" in line["rotary PI fine-tuned"]
    assert "factor=length/L" not in line["rotary PI fine-tuned"]


def _cell(value):
    return {"mean": value, "std": 0.0, "n": 3, "values": [value] * 3}


ROWS = [
    {"name": "rotary", "position": "rotary", "options": {}, "eval_options": {}},
    {
        "name": "rotary PI@inference",
        "position": "rotary",
        "options": {},
        "eval_options": {"scaling": "pi"},
        "train_as": "rotary",
    },
    {
        "name": "rotary PI fine-tuned",
        "position": "rotary",
        "options": {"scaling": "pi"},
        "eval_options": {},
        "finetune_from": "rotary",
    },
]


def test_finetune_effect_is_stated_at_the_length_both_scale_alike():
    tuned = {1: 9.0, 2: 9.5, 4: 10.0, 8: 14.0}
    twin = {1: 8.0, 2: 10.0, 4: 12.5, 8: 20.0}
    cells = {("rotary PI fine-tuned", f): _cell(v) for f, v in tuned.items()}
    cells |= {("rotary PI@inference", f): _cell(v) for f, v in twin.items()}
    (text,) = finetunes(_results(ROWS), cells)
    same = "against `rotary PI@inference` (no fine-tune): -20.0% at 4x, where both scale by 4"
    assert same in text
    # elsewhere the factors differ (4 against length / L), and the sentence says so
    assert "at the other lengths (factor 4 against length / L) +12.5% at 1x, -5.0% at 2x" in text
    assert "-30.0% at 8x" in text


def test_finetune_without_an_inference_twin_compares_with_the_plain_weights():
    rows = [r for r in ROWS if r["name"] != "rotary PI@inference"]
    cells = {("rotary PI fine-tuned", 4): _cell(10.0), ("rotary", 4): _cell(40.0)}
    cells |= {("rotary PI fine-tuned", 1): _cell(9.0), ("rotary", 1): _cell(8.0)}
    (text,) = finetunes(_results(rows), cells)
    assert "against `rotary` (no fine-tune): -75.0% at 4x, the length it was fine-tuned at" in text
    assert "scale by" not in text and text.endswith("+12.5% at 1x.")
