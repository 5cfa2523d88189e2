"""The translation experiment: config checks, batches, the loss, BLEU per bucket against an
independent computation, NLL per position, the report, `cape translate`, and a tiny
end-to-end run on a small Apertium corpus (resumed from its cached results)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from cape.lab.experiments import EXPERIMENTS, resolve_config
from cape.lab.experiments.translation import evaluate as translation_eval
from cape.lab.experiments.translation import model as translation_model
from cape.lab.experiments.translation.config import TranslationConfig
from cape.lab.experiments.translation.experiment import TRANSLATION as T
from cape.lab.experiments.translation.report import bleu_table, nll_curve_cells, nll_table

TINY_MODEL = {"dim": 32, "encoder_layers": 1, "decoder_layers": 1, "heads": 2, "ffn_dim": 64}
needs_apertium = pytest.mark.skipif(
    shutil.which("apertium") is None, reason="apertium is not installed"
)


def _cfg(*overrides: str, preset: str = "quick") -> TranslationConfig:
    exp = EXPERIMENTS["translation"]
    return resolve_config(exp.config_cls, exp.presets, preset, [], list(overrides))[0]


@pytest.mark.parametrize("preset", ["quick", "cpu-full", "paper"])
def test_presets_resolve(preset: str) -> None:
    cfg = _cfg(preset=preset)
    names = [r.name for r in cfg.rows]
    assert {"sinpos", "abspos", "relpos", "CAPE"} <= set(names)
    assert cfg.train.best_metric == "bleu" and cfg.train.best_mode == "max"
    cape = next(r for r in cfg.rows if r.name == "CAPE")
    assert cape.options["max_global_shift"] == 5.0  # appendix D.1: best for 6L-6L


def test_the_default_is_a_question_positions_decide() -> None:
    """Issue 43: the default runs content only next to sinpos and CAPE, seeded twice."""
    exp = EXPERIMENTS["translation"]
    assert exp.default_preset == "small"
    cfg = _cfg(preset="small")
    assert [r.position for r in cfg.rows] == ["nopos", "sinpos", "cape1d"]
    assert len(cfg.seeds) == 2 and cfg.rows[2].options["max_global_shift"] == 5.0


def test_a_seed_gives_the_same_initial_weights_to_rows_without_learned_positions() -> None:
    """What the README's seed-by-seed comparison of cpu-full rests on: train_run seeds, then
    builds the model, so sinpos, CAPE (any shift), nopos and rotary+CAPE start from the same
    weights for a seed; abspos and relpos add tables of their own."""
    from cape.lab.train.seeding import seed_everything

    cfg = _cfg(preset="cpu-full")
    models = {}
    for row in cfg.rows:
        seed_everything(1)
        models[row.name] = translation_model.make_model(cfg, row, 1.05, 96, 0).state_dict()
    ref = models["sinpos"]
    same = [
        n
        for n, sd in models.items()
        if sd.keys() == ref.keys() and all(torch.equal(sd[k], ref[k]) for k in ref)
    ]
    assert same == ["sinpos", "CAPE", "nopos", "CAPE Δ=10", "CAPE Δ=50", "rotary+CAPE"]
    first = next(iter(ref))
    seed_everything(2)
    other = translation_model.make_model(cfg, cfg.rows[0], 1.05, 96, 0).state_dict()
    assert not torch.equal(other[first], ref[first])  # another seed, other weights


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ('rows=[{"name": "x", "position": "wavelet"}]', "rows[x].position"),
        (
            'rows=[{"name": "x", "position": "cape1d", "options": {"alpha": -1}}]',
            "rows[x].options.alpha",
        ),
        ("train.best_metric=loss", "train.best_metric"),
        ("model.heads=5", "model.dim"),
        ("model.label_smoothing=1.5", "model.label_smoothing"),
        ("eval.beam=-1", "eval.beam"),
        ("data.vocab_size=10", "data.vocab_size"),
    ],
)
def test_bad_config_names_the_key(override: str, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace("[", r"\[").replace("]", r"\]")):
        _cfg(override)


def test_bleu_is_sacrebleu_corpus_score() -> None:
    sacrebleu = pytest.importorskip("sacrebleu")
    hyps, refs = ["el gato es negro", "un perro"], ["el gato es negro", "el perro grande"]
    assert translation_eval.bleu(hyps, refs) == pytest.approx(
        sacrebleu.corpus_bleu(hyps, [refs]).score
    )
    assert translation_eval.bleu(refs, refs) == pytest.approx(100.0)
    assert math.isnan(translation_eval.bleu([], []))


def test_loss_is_label_smoothed_cross_entropy_over_real_tokens() -> None:
    class Fixed(torch.nn.Module):
        def __init__(self, logits: torch.Tensor) -> None:
            super().__init__()
            self.logits = logits

        def forward(self, src, src_mask, tgt, tgt_mask):
            return self.logits

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g)
    tgt_out = torch.tensor([[1, 2, 3], [4, 3, 0]])  # 0 = padding
    batch = {"src": None, "src_mask": None, "tgt_in": None, "tgt_mask": None, "tgt_out": tgt_out}
    loss, extra = translation_model.loss_fn(0.1, 0)(Fixed(logits), batch)
    logp = torch.log_softmax(logits, -1).numpy()
    real = [(b, t) for b in range(2) for t in range(3) if tgt_out[b, t] != 0]
    nll = np.mean([-logp[b, t, tgt_out[b, t]] for b, t in real])
    smooth = np.mean([-logp[b, t].mean() for b, t in real])
    assert loss.item() == pytest.approx(0.9 * nll + 0.1 * smooth, rel=1e-5)
    assert extra["nll"].item() == pytest.approx(nll, rel=1e-5)


def _results(nll_rows: dict[str, list[float]]) -> dict:
    """A hand-made results dict: two seeds, BLEU records and NLL curves."""
    records, curves = [], {}
    for k, (row, values) in enumerate(nll_rows.items()):
        for seed in (0, 1):
            for split, bin_ in (("test", "all"), ("test", "short"), ("test_41+", "all")):
                records.append(
                    {
                        "row": row,
                        "seed": seed,
                        "split": split,
                        "bin": bin_,
                        "bleu": 10.0 * k + seed,
                        "src_words": 5.0,
                        "sentences": 3,
                    }
                )
            records.append(
                {
                    "row": row,
                    "seed": seed,
                    "split": "stacked",
                    "bin": "0-31",
                    "tokens": 64,
                    "nll": values[0] + seed,
                }
            )
            curves[f"{row}/seed{seed}"] = {
                "total": [v * 10 for v in values],
                "count": [10.0] * len(values),
            }
    return {
        "config": {"rows": [{"name": n} for n in nll_rows]},
        "records": records,
        "curves": curves,
    }


def test_report_tables_and_curve_are_means_over_seeds() -> None:
    res = _results({"sinpos": [1.0] * 16, "CAPE": [2.0] * 16})
    table = bleu_table(res)
    assert "| sinpos | 0.5 ± 0.7 |" in table and "**10.5 ± 0.7**" in table  # best bold
    assert "41+ words" in table
    assert "| sinpos | **1.50 ± 0.71** |" in nll_table(res)
    cells = {(c["row"], c["position"]): c["mean"] for c in nll_curve_cells(res)}
    assert cells[("CAPE", 4.0)] == pytest.approx(2.0) and cells[("sinpos", 12.0)] == pytest.approx(
        1.0
    )
    assert len(cells) == 4  # 16 positions in groups of 8, for two rows


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    if shutil.which("apertium") is None:
        pytest.skip("apertium is not installed")
    pytest.importorskip("sentencepiece")
    pytest.importorskip("sacrebleu")
    root = tmp_path_factory.mktemp("mt")
    sets = [
        f"data.root={root / 'corpus'}",
        "data.limit=3000",
        "data.vocab_size=300",
        "data.train=200",
        "data.val=8",
        "train.steps=4",
        "train.batch_size=8",
        "train.eval_every=2",
        "train.checkpoint_every=2",
        "train.warmup_steps=1",
        "eval.test=12",
        "eval.long_per_bucket=3",
        "eval.stacked=3",
        "eval.beam=2",
        'rows=[{"name": "CAPE", "position": "cape1d"}, {"name": "relpos", "position": "relpos"}]',
        *(f"model.{k}={v}" for k, v in TINY_MODEL.items()),
    ]
    exp = EXPERIMENTS["translation"]
    cfg, mapping = resolve_config(exp.config_cls, exp.presets, "quick", [], sets)
    out = root / "run"
    return cfg, mapping, out, T.run(cfg, mapping, out)


@needs_apertium
def test_tiny_experiment_writes_report_and_resumes(tiny_run) -> None:
    cfg, mapping, out, results = tiny_run
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "sacreBLEU on test" in report and "NLL (nats per token)" in report
    splits = {(r["row"], r["split"], r["bin"]) for r in results["records"]}
    assert {("CAPE", "test", b) for b in ("all", "short", "medium", "long")} <= splits
    assert any(s == "stacked" for _, s, _ in splits)
    alpha = results["data"]["alpha"]
    spec = json.loads((out / "cape" / "seed0" / "model.json").read_text())
    assert spec["model"]["alpha"] == pytest.approx(alpha)
    assert 0.5 < alpha < 2.0  # Spanish has a few more tokens than English
    summary = results["train"]["CAPE/seed0"]
    assert summary["step"] == 4.0 and 0.0 <= summary["eval_bleu"] <= 100.0
    mtime = (out / "cape" / "seed0" / "eval.json").stat().st_mtime
    again = T.run(cfg, mapping, out)  # cached: nothing trained or evaluated again
    assert (out / "cape" / "seed0" / "eval.json").stat().st_mtime == mtime
    assert again["records"] == json.loads(json.dumps(results["records"]))
    assert T.redraw(out) == out / "report.md"


@needs_apertium
def test_nll_by_position_matches_per_sequence_teacher_forcing(tiny_run) -> None:
    cfg, _, out, _ = tiny_run
    data = T.make_data(cfg)
    model = T.load_run(cfg, cfg.rows[0], 0, out, data).eval()
    exs = data.test("stacked")[:3]
    total, count = translation_eval.nll_by_position(model, data, exs, batch_size=2)
    # independently: each sequence alone, full log-softmax, position by position
    want_total, want_count = np.zeros_like(total), np.zeros_like(count)
    tok = data.tokenizer
    with torch.no_grad():
        for e in exs:
            src = torch.tensor([[tok.bos_id, *e.src_ids, tok.eos_id]])
            tgt_in = torch.tensor([[tok.bos_id, *e.tgt_ids]])
            logp = torch.log_softmax(model(src, src != -1, tgt_in, tgt_in != -1), -1)[0]
            for t, y in enumerate([*e.tgt_ids, tok.eos_id]):
                want_total[t] -= logp[t, y].item()
                want_count[t] += 1
    np.testing.assert_allclose(count, want_count)
    np.testing.assert_allclose(total, want_total, rtol=1e-4)


@needs_apertium
def test_translate_command_on_a_trained_run(tiny_run, capsys) -> None:
    from cape.lab.apps.translate import load_translation_model, translate
    from cape.lab.cli import main

    _, _, out, _ = tiny_run
    run = out / "cape" / "seed0"
    assert main(["translate", str(run), "The cat is black.", "", "A dog."]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 4 and lines[1] == ""  # one line per input, empty stays empty
    model, tok, _ = load_translation_model(run)
    assert lines[0] == translate(model, tok, ["the cat is black."], beam=4)[0]
    assert main(["translate", str(out)]) == 2  # not a run folder
    assert "model.json" in capsys.readouterr().err


@pytest.mark.slow
@needs_apertium
def test_experiment_under_torchrun_two_cpu_ranks(tmp_path) -> None:
    """`torchrun -m cape.lab experiment translation`: rank 0 builds the corpus and BPE while rank 1
    waits, each rank trains on its share of the length batches and decodes its shard of every
    test set, and only rank 0 writes the report; BLEU equals that of the gathered outputs."""
    import os
    import subprocess
    import sys

    pytest.importorskip("sentencepiece")
    sets = [
        f"data.root={tmp_path / 'corpus'}",
        "data.limit=2000",
        "data.vocab_size=300",
        "data.train=64",
        "data.val=6",
        "train.steps=2",
        "train.batch_size=8",
        "train.eval_every=2",
        "train.checkpoint_every=2",
        "train.warmup_steps=1",
        "eval.test=10",
        "eval.long_per_bucket=2",
        "eval.stacked=2",
        "eval.beam=2",
        'rows=[{"name": "CAPE", "position": "cape1d"}]',
        "seeds=[0]",
        *(f"model.{k}={v}" for k, v in TINY_MODEL.items()),
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
        "translation",
        "--out",
        str(tmp_path / "run"),
    ]
    for s in sets:
        cmd += ["--set", s]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert res.returncode == 0, res.stderr[-4000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    test = [r for r in results["records"] if r["split"] == "test" and r["bin"] == "all"]
    assert len(test) == 1 and test[0]["sentences"] == 10  # every sentence, once
    assert results["train"]["CAPE/seed0"]["step"] == 2.0


@needs_apertium
def test_finished_reports_a_study_in_progress(tiny_run, tmp_path) -> None:
    import yaml

    from cape.lab.experiments.cli import experiment_main

    cfg, mapping, out, results = tiny_run
    # one more seed and a row that never ran: only the finished runs are reported
    more = {
        **mapping,
        "seeds": [0, 1],
        "rows": mapping["rows"] + [{"name": "sinpos", "position": "sinpos"}],
    }
    (tmp_path / "more.yaml").write_text(yaml.safe_dump(more, allow_unicode=True))
    argv = ["translation", "--config", str(tmp_path / "more.yaml"), "--out", str(out)]
    assert experiment_main([*argv, "--finished"]) == 0
    assert not (out / "cape" / "seed1").exists() and not (out / "sinpos").exists()
    again = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [r["name"] for r in again["config"]["rows"]] == ["CAPE", "relpos"]
    assert again["records"] == json.loads(json.dumps(results["records"]))
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "not every seed has finished for CAPE, relpos" in report
    assert "| 0 |" in report and "| sinpos" not in report
    with pytest.raises(ValueError, match="--finished: .* no finished run"):
        experiment_main([*argv[:-1], str(tmp_path / "empty"), "--finished"])
    T.run(cfg, mapping, out)  # leave the folder as the other tests expect it


@pytest.mark.parametrize("position", ["cape", "rotary"])
def test_a_model_json_of_cape_0_1_migrates_to_the_same_model(position: str, migrate_runs) -> None:
    """0.1 named CAPE "cape" and kept alpha among the position options: scripts/migrate_runs.py
    writes the same model in cape.build's names, which the lab reads."""
    from cape.augment import Augmentation
    from cape.models import Seq2Seq

    old = dict(
        vocab_size=20,
        dim=16,
        encoder_layers=1,
        decoder_layers=1,
        heads=2,
        ffn_dim=32,
        dropout=0.0,
        position=position,
        pad_id=0,
        tie_embeddings=True,
        position_options={"max_global_shift": 5.0, "max_local_shift": 0.5, "alpha": 1.1},
    )
    model = Seq2Seq(**migrate_runs.current_translation_spec(old))
    assert model.position == ("cape1d" if position == "cape" else "rotary")
    assert model.alpha == 1.1 and model.augmentation == Augmentation(5.0, 0.5)
    mask = torch.ones(1, 4, dtype=torch.bool)
    src_pos, _ = model.eval().positions(mask)
    assert src_pos[0, :, 0].tolist() == pytest.approx([0.0, 1.1, 2.2, 3.3])
