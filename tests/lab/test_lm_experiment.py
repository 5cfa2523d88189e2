"""The language-model experiment: configs and presets, the non-overlapping windows protocol, a
tiny full run on a folder of .txt files (train, evaluate, report, resume, rows that reuse a
trained run, a fine-tune), the report's verdict."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cape.lab.experiments import EXPERIMENTS, resolve_config
from cape.lab.experiments.lm.config import LMConfig
from cape.lab.experiments.lm.evaluate import position_buckets, window_loss
from cape.lab.experiments.lm.experiment import LM as exp
from cape.lab.experiments.lm.presets import PRESETS
from cape.lab.experiments.lm.verdict import verdict
from cape.models import CausalLM

WORDS = "in the beginning god created the heaven and the earth and the earth was without form"


def _corpus(folder, docs=60, words=80):
    folder.mkdir(parents=True)
    rng = random.Random(0)
    w = WORDS.split()
    for i in range(docs):
        (folder / f"d{i:02d}.txt").write_text(" ".join(rng.choice(w) for _ in range(words)))
    return folder


def _tiny(tmp, rows):
    return [
        f"data.corpus={tmp / 'txt'}",
        f"data.root={tmp / 'data'}",
        "data.context=8",
        "data.val_tokens=64",
        "data.train_windows=200",
        "model.dim=16",
        "model.heads=2",
        "model.layers=1",
        "model.ffn_dim=32",
        "train.steps=4",
        "train.batch_size=4",
        "train.lr=0.01",
        "train.warmup_steps=0",
        "train.eval_every=2",
        "train.checkpoint_every=2",
        "finetune.steps=2",
        "finetune.batch_size=2",
        "finetune.warmup_steps=0",
        "eval.factors=[1,2,4]",
        "eval.buckets=4",
        "eval.max_tokens=0",
        "seeds=[0]",
        f"rows={rows}",
    ]


ROWS = (
    "[{name: rotary, position: rotary}, "
    "{name: rotary YaRN@inference, position: rotary, train_as: rotary, "
    "eval_options: {scaling: yarn}}, "
    "{name: rotary PI fine-tuned, position: rotary, finetune_from: rotary, "
    "options: {scaling: pi}}, "
    "{name: rotary+CAPE, position: rotary, options: {preset: text}}]"
)


# --- configs ----------------------------------------------------------------------------------


def test_presets_resolve_and_are_registered():
    assert EXPERIMENTS["lm"] is exp
    quick, _ = resolve_config(LMConfig, PRESETS, "quick")
    assert quick.data.context == 128 and quick.data.corpus == "kjv"
    assert [r.name for r in quick.rows] == ["nopos", "rotary", "ALiBi", "rotary+CAPE"]
    assert quick.lengths == [128, 256, 512, 1024, 2048, 4096]  # 1x-32x L
    full, mapping = resolve_config(LMConfig, PRESETS, "cpu-full")
    again, _ = resolve_config(LMConfig, {"x": mapping}, "x")
    assert again == full and full.data.context == 256 and full.seeds == [0, 1, 2]
    names = [r.name for r in full.rows]
    for name in ("nopos", "sinpos", "CAPE", "relpos", "rotary", "xPos", "ALiBi", "FIRE"):
        assert name in names
    for name in ("rotary+CAPE", "ALiBi+CAPE", "FIRE+CAPE"):
        assert name in names
    inference = [r for r in full.rows if r.train_as]
    assert {r.eval_options["scaling"] for r in inference} == {"pi", "ntk", "yarn"}
    assert all(r.train_as == "rotary" and not r.options for r in inference)
    tuned = [r for r in full.rows if r.finetune_from]
    assert {r.options["scaling"] for r in tuned} == {"pi", "yarn"}
    assert full.row("CAPE").options == {"preset": "text", "normalize": False}


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("eval.factors=[2,4]", ["eval.factors", "from 1"]),
        ("eval.max_tokens=100", ["eval.max_tokens", "4096"]),
        ("eval.split=train", ["eval.split"]),
        ("data.tokenizer=chars", ["data.tokenizer"]),
        ("model.heads=3", ["model.dim / model.heads"]),
        (
            "rows=[{name: a, position: rotary, finetune_from: b}]",
            ["rows[a].finetune_from", "earlier"],
        ),
        (
            "rows=[{name: r, position: rotary}, {name: a, position: alibi, finetune_from: r}]",
            ["rows[a].finetune_from", "position"],
        ),
        (
            "rows=[{name: r, position: rotary}, "
            "{name: a, position: rotary, train_as: r, finetune_from: r}]",
            ["rows[a]", "not both"],
        ),
        ("rows=[{name: a, position: rotary, options: {scaling: bogus}}]", ["rows[a].options"]),
        ("rows=[{name: a, position: cape1d, options: {normalize: true}}]", ["rows[a].options"]),
        ("rows=[{name: a, position: nosuch}]", ["rows[a].position", "cape.build"]),
    ],
)
def test_bad_config_names_the_key_in_one_line(override, words):
    with pytest.raises(ValueError) as e:
        resolve_config(LMConfig, PRESETS, "quick", [], [override])
    text = str(e.value)
    assert "\n" not in text
    for word in words:
        assert word in text, text


# --- the windows protocol ---------------------------------------------------------------------


def test_windows_are_the_non_overlapping_protocol():
    torch.manual_seed(0)
    model = CausalLM(20, dim=16, layers=1, heads=2, ffn_dim=32, dropout=0.0).eval()
    tokens = np.random.default_rng(0).integers(0, 20, size=48).astype(np.uint8)
    length = 10
    got = window_loss(model, tokens, length, batch_tokens=20, device=torch.device("cpu"))
    # every token after the first predicted exactly once, each window with its own context only
    total, count, full = 0.0, 0, 0
    t = torch.from_numpy(tokens.astype(np.int64))
    for start in range(0, len(t) - 1, length):
        x, y = t[start : start + length], t[start + 1 : start + length + 1]
        x = x[: len(y)]
        with torch.no_grad():
            total += float(F.cross_entropy(model(x[None])[0], y, reduction="sum"))
        count += len(y)
        full += len(y) == length
    assert got.count == count == len(tokens) - 1
    assert got.windows == math.ceil((len(tokens) - 1) / length) and got.full == full == 4
    assert got.total == pytest.approx(total, rel=1e-5)
    assert got.loss == pytest.approx(total / count, rel=1e-5)


def test_position_buckets_cover_the_window():
    assert position_buckets(10, 4) == [(0, 1), (1, 2), (2, 5), (5, 10)]
    assert position_buckets(3, 8) == [(0, 1), (1, 2), (2, 3)]


# --- a tiny study -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm")
    _corpus(tmp / "txt")
    cfg, mapping = resolve_config(LMConfig, PRESETS, "quick", [], _tiny(tmp, ROWS))
    exp.run(cfg, mapping, tmp / "run")
    return cfg, mapping, tmp / "run"


def test_experiment_trains_evaluates_and_reports(tiny_run):
    cfg, _, out = tiny_run
    assert (out / "config.yaml").is_file()
    assert (out / "rotary" / "seed0" / "checkpoints").is_dir()
    results = json.loads((out / "results.json").read_text())
    recs = results["records"]
    names = [r.name for r in cfg.rows]
    assert {(r["row"], r["length"]) for r in recs} == {(n, m) for n in names for m in (8, 16, 32)}
    test_tokens = results["corpus"]["splits"]["test"]["tokens"]
    for r in recs:
        assert r["tokens"] == test_tokens - 1  # the whole split, every token predicted once
        assert r["ppl"] == pytest.approx(math.exp(r["loss"]))
        assert r["bpb"] == pytest.approx(
            r["loss"] * test_tokens / results["corpus"]["splits"]["test"]["bytes"] / math.log(2)
        )
    by_pos = [b for b in results["by_position"] if b["row"] == "rotary"]
    assert [(b["start"], b["end"]) for b in by_pos] == [(0, 1), (1, 3), (3, 10), (10, 32)]
    assert all(math.isfinite(b["loss"]) for b in by_pos)
    report = (out / "report.md").read_text()
    assert "| row | encoding | seeds | 8 (1x) | 16 (2x) | 32 (4x) |" in report
    assert "## Corpus" in report and "## Verdict" in report and "within 10%" in report
    assert "CAPE's augmentation on rotary" in report
    assert "What the fine-tune buys `rotary PI fine-tuned`" in report
    for png in ("perplexity_vs_length.png", "loss_by_position.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inference_rows_reuse_the_trained_run(tiny_run):
    cfg, _, out = tiny_run
    reused = exp.run_dir(out, cfg.row("rotary YaRN@inference"), 0)
    assert sorted(p.name for p in reused.iterdir()) == ["eval.json", "settings.json"]
    results = json.loads((out / "results.json").read_text())
    assert results["train"]["rotary YaRN@inference/seed0"] == {"train_as": "rotary"}
    loss = {(r["row"], r["length"]): r["loss"] for r in results["records"]}
    # up to L, YaRN's factor is 1: rotary's weights give rotary's losses
    assert loss["rotary YaRN@inference", 8] == pytest.approx(loss["rotary", 8], abs=1e-6)
    assert loss["rotary YaRN@inference", 32] != pytest.approx(loss["rotary", 32], abs=1e-6)


def test_finetune_trains_from_the_source_weights(tiny_run):
    cfg, _, out = tiny_run
    results = json.loads((out / "results.json").read_text())
    assert results["train"]["rotary PI fine-tuned/seed0"]["step"] == cfg.finetune.steps
    data = exp.make_data(cfg)
    tuned = exp.load_run(cfg, cfg.row("rotary PI fine-tuned"), 0, out, data)
    source = exp.load_run(cfg, cfg.row("rotary"), 0, out, data)
    assert tuned.position_options["factor"] == 4.0
    assert tuned.position_options["train_length"] == cfg.data.context
    # 2 steps at a small learning rate: close to the source's weights, not a fresh model
    diff = max(
        float((a - b).abs().max())
        for a, b in zip(tuned.state_dict().values(), source.state_dict().values(), strict=True)
    )
    assert 0 < diff < 0.01


def test_rerun_resumes_without_training(tiny_run, rerun_trains_nothing):
    cfg, mapping, out = tiny_run
    rerun_trains_nothing(exp, cfg, mapping, out)
    # without its eval.json, an inference-only row is evaluated again from rotary's weights
    (exp.run_dir(out, cfg.row("rotary YaRN@inference"), 0) / "eval.json").unlink()
    rerun_trains_nothing(exp, cfg, mapping, out)  # the same records, nothing trained


def test_plot_redraws_the_report(tiny_run):
    _, _, out = tiny_run
    before = (out / "report.md").read_bytes()
    exp.redraw(out)
    assert (out / "report.md").read_bytes() == before


# --- the verdict ------------------------------------------------------------------------------


def _results(ppl):
    rows = [
        {"name": n, "position": p, "options": o, "eval_options": e, "train_as": t}
        for n, p, o, e, t in (
            ("rotary", "rotary", {}, {}, None),
            ("rotary+CAPE", "rotary", {"preset": "text"}, {}, None),
            ("rotary PI@inference", "rotary", {}, {"scaling": "pi"}, "rotary"),
        )
    ]
    rows.append({**rows[0], "name": "rotary PI fine-tuned", "options": {"scaling": "pi"}})
    rows[-1]["finetune_from"] = "rotary"
    records = [
        {"row": row, "seed": 0, "factor": f, "ppl": v}
        for row, values in ppl.items()
        for f, v in zip((1, 8, 16), values, strict=True)
    ]
    config = {"rows": rows, "eval": {"factors": [1, 8, 16]}, "finetune": {"steps": 5, "factor": 4}}
    return {"config": config, "records": records}


def test_verdict_is_written_from_the_numbers():
    said, table = verdict(
        _results(
            {
                "rotary": (10.0, 30.0, 60.0),
                "rotary+CAPE": (10.2, 10.5, 12.0),
                "rotary PI@inference": (10.0, 14.0, 20.0),
                "rotary PI fine-tuned": (10.3, 10.6, 16.0),
            }
        )
    )
    text = "\n".join(said)
    assert "at 8x: rotary+CAPE, rotary PI fine-tuned; at 16x: none" in text
    assert "CAPE's augmentation on rotary: helps at 16x" in text
    assert "+2.0% at 1x, -65.0% at 8x, -80.0% at 16x" in text
    assert "against `rotary PI@inference` (no fine-tune): at the other lengths" in text
    assert "(factor 4 against length / L) +3.0% at 1x, -24.3% at 8x" in text
    assert "Best at 16x: rotary+CAPE" in text
    assert "| rotary | 3.00 | 6.00 |" in table
