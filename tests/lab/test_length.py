"""The length experiment: the lookup data, configs, the models of every row, a tiny full run, the
report's verdict."""

from __future__ import annotations

import json

import pytest
import torch

from cape.lab.data.text.lookup import (
    IGNORE,
    LookupDataset,
    chance_level,
    lookup_targets,
    make_set,
    make_splits,
    position_blind_accuracy,
)
from cape.lab.experiments import EXPERIMENTS, resolve_config
from cape.lab.experiments.length.config import PRESETS, LengthConfig
from cape.lab.experiments.length.experiment import LENGTH as exp
from cape.lab.experiments.length.model import token_loss
from cape.lab.experiments.length.report import length_table, verdict

SMALL = ["model.dim=16", "model.heads=2", "model.layers=1", "model.ffn_dim=32"]


# --- data -------------------------------------------------------------------------------------


def test_targets_are_the_token_offset_places_back():
    g = torch.Generator().manual_seed(3)
    s = make_set(50, 5, 12, vocab=7, offset=3, generator=g)
    for i in range(len(s)):
        n = int(s.mask[i].sum())
        for t in range(s.tokens.shape[1]):
            want = int(s.tokens[i, t - 3]) if 3 <= t < n else IGNORE
            assert int(s.targets[i, t]) == want
    assert s.scored == sum(int(m.sum()) - 3 for m in s.mask)


def test_masks_lengths_and_padding():
    g = torch.Generator().manual_seed(0)
    s = make_set(2000, 16, 32, vocab=16, offset=3, generator=g)
    lengths = s.mask.sum(1)
    assert lengths.min() == 16 and lengths.max() == 32 and s.tokens.shape == (2000, 32)
    # the mask is a prefix of each row; padding holds token 0 and no target
    assert torch.equal(s.mask, torch.arange(32)[None] < lengths[:, None])
    assert (s.tokens[~s.mask] == 0).all() and (s.targets[~s.mask] == IGNORE).all()
    assert 0 <= int(s.tokens.min()) and int(s.tokens.max()) == 15
    # every length of the range occurs, roughly uniformly
    counts = torch.bincount(lengths, minlength=33)[16:]
    assert (counts > 2000 / 17 / 2).all()
    # targets survive a lookup computed again on a shorter window (collate trims padding)
    batch = LookupDataset(s).collate([0, 1, 2])
    width = int(lengths[:3].max())
    assert batch["tokens"].shape == (3, width)
    assert torch.equal(batch["targets"], lookup_targets(batch["tokens"], batch["mask"], 3))


def test_splits_are_deterministic_and_independent():
    a = make_splits(100, 20, 10, [32, 64], seed=5)
    b = make_splits(100, 20, 10, [32, 64], seed=5)
    c = make_splits(100, 20, 10, [32, 64], seed=6)
    d = make_splits(300, 20, 10, [64, 128], seed=5)
    assert torch.equal(a.train.tokens, b.train.tokens) and torch.equal(
        a.test[64].tokens, b.test[64].tokens
    )
    assert not torch.equal(a.train.tokens, c.train.tokens)
    # another training size or other test lengths leave the other splits as they were
    assert torch.equal(a.val.tokens, d.val.tokens) and torch.equal(
        a.test[64].tokens, d.test[64].tokens
    )
    for length, test in a.test.items():
        assert test.tokens.shape == (10, length) and test.mask.all()
        assert test.scored == 10 * (length - 3)


def test_position_blind_accuracy_matches_counting():
    g = torch.Generator().manual_seed(1)
    s = make_set(40, 5, 9, vocab=4, offset=2, generator=g)
    hits = []
    for i in range(len(s)):
        n = int(s.mask[i].sum())
        seq = s.tokens[i, :n].tolist()
        for t in range(2, n):
            others = seq[:t] + seq[t + 1 :]
            hits.append(max(others.count(v) for v in range(4)) / (n - 1))
    assert position_blind_accuracy(s, 4) == pytest.approx(sum(hits) / len(hits))
    assert chance_level(4) == pytest.approx(0.25)
    assert chance_level(4) < position_blind_accuracy(s, 4) < 1
    with pytest.raises(ValueError, match="vocab"):
        chance_level(1)


# --- configs ----------------------------------------------------------------------------------


def test_presets_resolve_and_are_registered():
    entry = EXPERIMENTS["length"]
    assert entry.default_preset == "quick" and entry.config_cls is LengthConfig
    for name in PRESETS:
        cfg, mapping = resolve_config(LengthConfig, PRESETS, name)
        again, _ = resolve_config(LengthConfig, {"x": mapping}, "x")
        assert again == cfg
    full, _ = resolve_config(LengthConfig, PRESETS, "cpu-full")
    assert full.seeds == [0, 1, 2] and len(full.rows) == 23
    reused = {r.name: r for r in full.rows if r.train_as}
    assert set(reused) == {"rotary+PI", "rotary+NTK", "rotary+YaRN"}
    for row in reused.values():
        assert row.train_as == "rotary" and row.eval_options["train_length"] == full.data.max_len
    quick, _ = resolve_config(LengthConfig, PRESETS, "quick")
    assert [r.name for r in quick.rows] == [
        "nopos", "abspos", "sinpos", "CAPE", "relpos", "rotary", "rotary+CAPE", "ALiBi"
    ]  # fmt: skip
    assert len(quick.seeds) == 2  # issue 43: the default's spread is measured


ROW = "{name: r, position: rotary}"


@pytest.mark.parametrize(
    "override, words",
    [
        (
            f"rows=[{ROW}, {{name: x, position: rotary, train_as: y}}]",
            ["rows[x].train_as", "earlier"],
        ),
        (
            f"rows=[{{name: x, position: rotary, train_as: r}}, {ROW}]",
            ["rows[x].train_as", "earlier"],
        ),
        (
            f"rows=[{ROW}, {{name: a, position: rotary, train_as: r}}, "
            "{name: b, position: rotary, train_as: a}]",
            ["rows[b].train_as", "trains its own"],
        ),
        (
            f"rows=[{ROW}, {{name: x, position: alibi, train_as: r}}]",
            ["rows[x].position", "rotary"],
        ),
        (
            f"rows=[{ROW}, {{name: x, position: rotary, train_as: r, options: {{xpos: true}}}}]",
            ["rows[x].options", "eval_options"],
        ),
        (
            "rows=[{name: x, position: rotary, eval_options: {scaling: warp}}]",
            ["rows[x].eval_options", "scaling"],
        ),
        ("rows=[{name: x, position: relpos, options: {colour: 1}}]", ["rows[x].options", "colour"]),
        ("rows=[{name: x, position: nopos, options: {a: 1}}]", ["rows[x]", "no options"]),
        ("rows=[{name: x, position: cape2d}]", ["rows[x].position", "1-D"]),
        ("rows=[{name: x, position: rope}]", ["rows[x].position", "rotary"]),
        ("rows=[{name: x, position: rotary, options: 3}]", ["rows[x].options", "mapping"]),
        ("eval.lengths=[64, 32]", ["eval.lengths", "increasing"]),
        ("eval.lengths=[]", ["eval.lengths"]),
        ("eval.lengths=[3, 32]", ["eval.lengths[0]", "data.offset"]),
        ("data.min_len=3", ["data.min_len", "4"]),
        ("data.max_len=8", ["data.max_len", "16"]),
        ("data.vocab=1", ["data.vocab", "2"]),
        ("model.heads=3", ["model.dim", "model.heads"]),
        ("model.dropout=1.5", ["model.dropout"]),
        ("model.width=3", ["model.width", "dim"]),
        ("train.best_metric=loss", ["train.best_metric", "acc"]),
        ("seeds=[]", ["seeds"]),
    ],
)
def test_bad_config_names_the_key_in_one_line(override, words):
    with pytest.raises((ValueError, TypeError)) as err:
        resolve_config(LengthConfig, PRESETS, "quick", [], [override])
    message = str(err.value)
    assert "\n" not in message
    for w in words:
        assert w in message


# --- models -----------------------------------------------------------------------------------


def _batch(n=8, length=20, seed=0, vocab=16):
    g = torch.Generator().manual_seed(seed)
    return LookupDataset(make_set(n, 6, length, vocab=vocab, offset=3, generator=g)).collate(
        list(range(n))
    )


@pytest.mark.parametrize("row_index", range(len(PRESETS["cpu-full"]["rows"])))
def test_every_row_builds_trains_and_evaluates(row_index):
    cfg, _ = resolve_config(LengthConfig, PRESETS, "cpu-full", [], SMALL)
    row = cfg.rows[row_index]
    torch.manual_seed(0)
    model = exp.make_model(cfg, row).train()
    batch = _batch()
    loss, metrics = token_loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss) and 0.0 <= float(metrics["acc"]) <= 100.0
    assert model(batch).shape == (*batch["tokens"].shape, 16)
    encodings = [
        m for m in model.modules() if getattr(m, "kind", None) in ("absolute", "attention")
    ]
    params = [p for m in encodings for p in m.parameters()]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
    # the evaluation model takes the trained weights as they are (strict loading)
    evaluator = exp.make_model(cfg, row, evaluation=True)
    evaluator.load_state_dict(model.state_dict(), strict=True)
    evaluator.eval()
    assert torch.isfinite(evaluator(batch)).all()


def _swap(t, i, j):
    t = t.clone()
    t[:, [i, j]] = t[:, [j, i]]
    return t


@pytest.mark.parametrize("position, blind", [("nopos", True), ("rotary", False), ("sinpos", False)])
def test_only_a_model_without_positions_is_permutation_equivariant(position, blind):
    cfg, _ = resolve_config(
        LengthConfig, PRESETS, "quick", [], [*SMALL, f"rows=[{{name: x, position: {position}}}]"]
    )
    torch.manual_seed(0)
    model = exp.make_model(cfg, cfg.rows[0]).eval()
    tokens = torch.randint(16, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    with torch.no_grad():
        out = model({"tokens": tokens, "mask": mask})
        swapped = model({"tokens": _swap(tokens, 2, 9), "mask": mask})
    # bidirectional attention without positions: swapping two inputs swaps their outputs
    assert torch.allclose(swapped, _swap(out, 2, 9), atol=1e-5) == blind


def test_cape_rows_augment_only_in_training():
    cfg, _ = resolve_config(LengthConfig, PRESETS, "cpu-full", [], SMALL)
    batch = _batch()
    for name in ("CAPE", "rotary+CAPE", "ALiBi+CAPE", "FIRE+CAPE"):
        torch.manual_seed(0)
        model = exp.make_model(cfg, cfg.row(name))
        plan = model.encoder.plan
        if plan.in_attention:  # the stack draws once per sequence for every layer
            assert plan.stack_augmentation is not None and plan.stack_augmentation.random
            assert plan.augmented_by_stack  # the layers' modules read the stack's draw
        else:  # the input encoding draws once per sequence itself
            assert plan.absolute.augmentation is not None and plan.absolute.augmentation.random
        model.train()
        assert not torch.allclose(model(batch), model(batch))
        model.eval()
        assert torch.equal(model(batch), model(batch))


def test_eval_options_that_change_the_weights_fail_loudly():
    cfg, _ = resolve_config(
        LengthConfig,
        PRESETS,
        "quick",
        [],
        [
            *SMALL,
            "data.train=8",
            "eval.test=2",
            "rows=[{name: x, position: relpos, eval_options: {max_distance: 8}}]",
        ],
    )
    model = exp.make_model(cfg, cfg.rows[0])
    data = exp.make_data(cfg)
    with pytest.raises(RuntimeError, match="size mismatch"):
        exp.eval_records(cfg, cfg.rows[0], 0, model, data, torch.device("cpu"))


# --- a tiny full run ---------------------------------------------------------------------------

TINY = [
    "name=tiny",
    "seeds=[0,1]",
    "data.train=128",
    "data.val=16",
    "eval.test=8",
    "eval.lengths=[32,64]",
    "eval.batch_size=8",
    *SMALL,
    "train.steps=3",
    "train.batch_size=16",
    "train.eval_every=3",
    "train.checkpoint_every=3",
    "train.warmup_steps=0",
    "train.log_every=1",
    "rows=[{name: rotary, position: rotary}, {name: rotary+YaRN, position: rotary, "
    "train_as: rotary, eval_options: {scaling: yarn, train_length: 32}}]",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("length") / "run"
    cfg, mapping = resolve_config(LengthConfig, PRESETS, "quick", [], TINY)
    exp.run(cfg, mapping, out)
    return cfg, mapping, out


def test_experiment_end_to_end(tiny_run):
    cfg, _, out = tiny_run
    assert (out / "config.yaml").is_file()
    assert (out / "rotary" / "seed1" / "checkpoints").is_dir()
    reused = exp.run_dir(out, cfg.row("rotary+YaRN"), 0)
    assert sorted(p.name for p in reused.iterdir()) == ["eval.json", "settings.json"]
    results = json.loads((out / "results.json").read_text())
    recs = results["records"]
    assert {(r["row"], r["seed"], r["length"]) for r in recs} == {
        (n, s, m) for n in ("rotary", "rotary+YaRN") for s in (0, 1) for m in (32, 64)
    }
    acc = {(r["row"], r["seed"], r["length"]): r for r in recs}
    for r in recs:
        assert 0.0 <= r["acc"] <= 100.0 and r["n"] == 8 * (r["length"] - 3)
    # up to the training length YaRN's factor is 1: the same weights give the same answers
    for seed in (0, 1):
        assert acc["rotary+YaRN", seed, 32]["acc"] == acc["rotary", seed, 32]["acc"]
    assert results["params"]["rotary"]["position"] == 0
    # the positions-removed check at 32 tokens: the same weights without positions answer alike
    removed = {(r["row"], r["seed"]): r["value"] for r in results["removed"]}
    assert set(removed) == {(n, s) for n in ("rotary", "rotary+YaRN") for s in (0, 1)}
    assert all(removed["rotary", s] == removed["rotary+YaRN", s] for s in (0, 1))
    assert all(0.0 <= v <= 100.0 for v in removed.values())
    assert set(results["train"]) == {
        f"{n}/seed{s}" for n in ("rotary", "rotary+YaRN") for s in (0, 1)
    }
    assert results["train"]["rotary+YaRN/seed0"] == {"train_as": "rotary"}
    base = results["baselines"]
    assert base["chance"] == pytest.approx(100 / 16)
    assert base["chance"] < base["position_blind"]["32"] < 100
    report = (out / "report.md").read_text()
    assert "| row | encoding | seeds | 32 (1x) | 64 (2x) |" in report
    assert "| rotary+YaRN | rotary, weights of rotary | 2 |" in report
    assert "| chance (1/V) |" in report and "## Verdict" in report
    assert "Positions needed" in report and "Best at 64 tokens" in report
    assert "Positions taken out at test time (32 tokens): `rotary` " in report
    assert "scaling" in report and "yarn" in report
    assert (out / "accuracy_vs_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rerun_resumes_without_training(tiny_run, rerun_trains_nothing):
    cfg, mapping, out = tiny_run
    rerun_trains_nothing(exp, cfg, mapping, out)
    # without its eval.json, a train_as run is evaluated again from the trained row's weights
    folder = exp.run_dir(out, cfg.row("rotary+YaRN"), 1)
    (folder / "eval.json").unlink()
    rerun_trains_nothing(exp, cfg, mapping, out)  # the same records, nothing trained


def test_load_run_and_eval_records_reproduce_the_run(tiny_run):
    cfg, _, out = tiny_run
    data = exp.make_data(cfg)
    row = cfg.row("rotary+YaRN")
    model = exp.load_run(cfg, row, 1, out, data)
    records = exp.eval_records(cfg, row, 1, model, data, torch.device("cpu"))
    saved = json.loads((exp.run_dir(out, row, 1) / "eval.json").read_text())["records"]
    assert records == saved
    assert "| 64 |" in exp.format_records(records)
    with pytest.raises(FileNotFoundError, match="train it first"):
        exp.load_run(cfg, row, 5, out, data)


def test_redraw_reproduces_the_report(tiny_run):
    _, _, out = tiny_run
    text = (out / "report.md").read_text()
    (out / "report.md").unlink()
    (out / "accuracy_vs_length.png").unlink()
    exp.redraw(out)
    assert (out / "report.md").read_text() == text and (out / "accuracy_vs_length.png").is_file()


# --- the verdict, on numbers made up for it ------------------------------------------------------


def _results(accuracy):
    """results for rows -> [per length: per seed accuracy], lengths 32/64/128, 3 seeds."""
    rows = [
        {
            "name": n,
            "position": "nopos" if n == "nopos" else "rotary",
            "options": {},
            "eval_options": {},
            "train_as": None,
        }
        for n in accuracy
    ]
    lengths = [32, 64, 128]
    return {
        "config": {"data": {"max_len": 32}, "eval": {"lengths": lengths}, "rows": rows},
        "records": [
            {"row": n, "seed": s, "length": m, "acc": acc[i][s]}
            for n, acc in accuracy.items()
            for i, m in enumerate(lengths)
            for s in range(3)
        ],
        "train": {f"{n}/seed{s}": {} for n in accuracy for s in range(3)},
        "baselines": {"chance": 6.25, "position_blind": {"32": 17.0, "64": 12.0, "128": 9.0}},
    }


def test_verdict_is_written_from_the_numbers():
    results = _results(
        {
            "nopos": [[15, 16, 17], [11, 12, 13], [8, 9, 10]],
            "steady": [[99, 99.5, 100], [97, 98, 99], [95, 96, 97]],
            "fragile": [[98, 99, 100], [92, 93, 94], [40, 50, 60]],
            "weak": [[20, 21, 22], [20, 21, 22], [20, 21, 22]],
        }
    )
    said, table = verdict(results)
    needed, keeps = said[0], said[-1]
    best = next(line for line in said if line.startswith("**Best at 128 tokens"))
    assert "Positions needed: yes" in needed and "(steady)" in needed
    assert "at 64 tokens (2x): steady, fragile;" in keeps
    assert "at 128 tokens (4x): steady." in keeps
    assert "| weak |" not in table and "| nopos |" not in table  # never learned the task
    assert best.startswith("**Best at 128 tokens**: `steady` 96.0 ± 1.0%; no other row")
    text = length_table(results)
    assert "| steady | rotary | 3 | **99.5 ± 0.5** |" in text
    assert "| position-blind bound | – | – | 17.0 | 12.0 | 9.0 |" in text
    # no row beats content only: positions are not needed
    flat = _results({"nopos": [[15, 16, 17]] * 3, "weak": [[16, 17, 18]] * 3})
    assert "Positions needed: no" in verdict(flat)[0][0]
