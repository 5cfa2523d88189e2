"""The rows of CAPE's successors (randomized positions, random float sampling, PoSE) and of CAPE
with global scaling in the language-model and length studies: each builds its model and takes
a training step with its augmentation drawn, evaluates as its recipe says, states the recipe in
its notes; the archived runs of both studies resume untouched (their settings unchanged), so
`cape experiment lm --preset cpu-full` trains only the new rows; PoSE fine-tunes at windows of
L; the verdicts name each augmentation."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cape.lab.experiments import resolve_config
from cape.lab.experiments.length.config import PRESETS as LENGTH_PRESETS
from cape.lab.experiments.length.config import LengthConfig
from cape.lab.experiments.lm.config import LMConfig, finetune_window, position_options
from cape.lab.experiments.lm.data import LMData
from cape.lab.experiments.lm.experiment import LM
from cape.lab.experiments.lm.model import lm_loss, make_model
from cape.lab.experiments.lm.presets import PRESETS as LM_PRESETS
from cape.lab.experiments.lm.verdict import finetunes
from cape.lab.experiments.pairs import augmentation_method
from cape.lab.experiments.run_folders import check_run_settings, run_dir, run_settings
from cape.lab.experiments.train_as import seeded_evaluation
from cape.position_sampling import PoSE, RandomFloatPositions, RandomizedPositions

ROOT = Path(__file__).resolve().parents[2]
LM_NEW = {
    "rotary+randomized": ("Ruoss", RandomizedPositions),
    "rotary+RFS": ("Shimizu", RandomFloatPositions),
    "rotary PoSE-PI fine-tuned": ("Zhu", PoSE),
    "rotary PoSE-YaRN fine-tuned": ("Zhu", PoSE),
    "rotary+CAPE scaling": ("CAPE", None),
    "ALiBi+randomized": ("Ruoss", RandomizedPositions),
    "ALiBi+RFS": ("Shimizu", RandomFloatPositions),
    "ALiBi+CAPE scaling": ("CAPE", None),
}
LENGTH_NEW = (
    "rotary+randomized", "ALiBi+randomized", "rotary+RFS", "ALiBi+RFS", "rotary+PoSE-PI",
    "rotary+PoSE-YaRN", "rotary+CAPE scaling", "ALiBi+CAPE scaling",
)  # fmt: skip


@pytest.fixture(scope="module")
def full() -> LMConfig:
    return resolve_config(LMConfig, LM_PRESETS, "cpu-full", [], [])[0]


def _augmentation(model: torch.nn.Module):
    """The augmentation a CausalLM's stack draws once per forward."""
    return model.plan.augmentation


@pytest.mark.parametrize("name", sorted(LM_NEW))
def test_each_new_lm_row_trains_a_step_with_its_augmentation_drawn(full, name: str) -> None:
    row = full.row(name)
    paper, cls = LM_NEW[name]
    assert row.notes and paper in row.notes  # the recipe, stated
    torch.manual_seed(0)
    model = make_model(full, row, 64).train()
    aug = _augmentation(model)
    assert aug is not None and aug.random and not aug.normalize
    if cls is not None:
        assert isinstance(aug, cls)
    else:  # CAPE with the speech recipe's scaling
        assert aug.max_global_scaling == 2.0 and aug.max_local_shift == 0.5
    batch = torch.randint(0, 64, (2, 65), generator=torch.Generator().manual_seed(1))
    loss, _ = lm_loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    tokens = batch[:, :-1]
    a = model(tokens, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(a, model(tokens, generator=torch.Generator().manual_seed(3)))
    # the evaluation model takes the trained weights as they are; it draws nothing, but for
    # randomized positions, sampled at evaluation as the authors' models are
    evaluator = make_model(full, row, 64, evaluation=True)
    evaluator.load_state_dict(model.state_dict(), strict=True)
    evaluator.eval()
    model.eval()
    with torch.no_grad():
        if name.endswith("+randomized"):
            with seeded_evaluation(0, "cpu"):
                a = evaluator(tokens)
            with seeded_evaluation(0, "cpu"):
                assert torch.equal(evaluator(tokens), a)  # the run's seed fixes the draws
            assert not torch.equal(a, model(tokens))  # which the plain positions are not
            assert not torch.equal(evaluator(tokens), evaluator(tokens))
        else:
            assert torch.equal(evaluator(tokens), evaluator(tokens))
        if name == "rotary+RFS" or name.endswith("+randomized"):
            return
        assert torch.equal(evaluator(tokens), model(tokens))  # no eval_options: as trained


def test_random_float_rows_evaluate_with_the_papers_interpolation_beyond_l(full) -> None:
    # (2i - 1) / (2 max(L, n)) x L: rotary's PI without a factor, 1 up to L, n / L beyond
    row = full.row("rotary+RFS")
    assert position_options(row, full, evaluation=True)["scaling"] == "pi"
    assert "factor" not in position_options(row, full, evaluation=True)
    torch.manual_seed(0)
    trained = make_model(full, row, 64).eval()
    evaluator = make_model(full, row, 64, evaluation=True).eval()
    evaluator.load_state_dict(trained.state_dict())
    g = torch.Generator().manual_seed(4)
    short, long = torch.randint(0, 64, (1, 256), generator=g), torch.randint(0, 64, (1, 300))
    with torch.no_grad():
        torch.testing.assert_close(evaluator(short), trained(short), rtol=0, atol=1e-5)
        assert not torch.allclose(evaluator(long), trained(long), atol=1e-3)


def test_pose_rows_are_fine_tunes_at_windows_of_l_toward_the_16x_window(full) -> None:
    for label, scaling in (("PI", "pi"), ("YaRN", "yarn")):
        row = full.row(f"rotary PoSE-{label} fine-tuned")
        assert row.finetune_from == "rotary" and finetune_window(row, full) == 1
        options = position_options(row, full)
        assert options["scaling"] == scaling and options["factor"] == 16.0
        assert options["augmentation"] == {"kind": "pose", "target_length": 16 * 256}
    assert finetune_window(full.row("rotary PI fine-tuned"), full) == full.finetune.factor == 4
    randomized = position_options(full.row("rotary+randomized"), full)["augmentation"]
    assert randomized["max_length"] == full.lengths[-1]  # N = the longest evaluation length


@pytest.mark.parametrize(
    ("study", "cls", "presets"),
    [("lm-cpu-full", LMConfig, LM_PRESETS), ("length-cpu-full", LengthConfig, LENGTH_PRESETS)],
)
def test_archived_runs_resume_untouched_and_only_new_rows_train(study, cls, presets) -> None:
    cfg, _ = resolve_config(cls, presets, "cpu-full", [], [])
    out = ROOT / "results" / study
    new = set(LM_NEW if cls is LMConfig else LENGTH_NEW)
    for row in cfg.rows:
        for seed in cfg.seeds:
            folder = run_dir(out, row, seed)
            if row.name in new and not folder.exists():
                continue  # not trained yet: the study trains it, and only it
            # the archived settings are the preset's: the run is read back, not trained
            assert not check_run_settings(folder, run_settings(cfg, row)), folder
            assert (folder / "eval.json").is_file()


@pytest.mark.parametrize("name", LENGTH_NEW)
def test_each_new_length_row_states_its_recipe(name: str) -> None:
    cfg, _ = resolve_config(LengthConfig, LENGTH_PRESETS, "cpu-full", [], [])
    row = cfg.row(name)
    assert row.notes and any(p in row.notes for p in ("Ruoss", "Shimizu", "Zhu", "CAPE"))
    # (the length tests build, train and evaluate every cpu-full row, these included)


def test_verdicts_name_each_augmentation_and_a_pose_fine_tune_s_window() -> None:
    rows = [{"name": n, "position": "rotary", "options": o} for n, o in (
        ("a", {"augmentation": {"kind": "randomized", "max_length": 8}}),
        ("b", {"augmentation": {"kind": "pose", "target_length": 8}}),
        ("c", {"augmentation": {"kind": "random-float", "train_length": 8}}),
        ("d", {"preset": "text"}),
        ("e", {"max_global_scaling": 2.0}),
    )]  # fmt: skip
    methods = [augmentation_method(r) for r in rows]
    assert (
        methods
        == ["Randomized positions", "PoSE", "Random float sampling"] + ["CAPE's augmentation"] * 2
    )
    pose = {"scaling": "pi", "factor": 16.0, "augmentation": {"kind": "pose"}}
    cfg = {
        "finetune": {"factor": 4, "steps": 100},
        "eval": {"factors": [1, 16]},
        "rows": [
            {"name": "rotary", "eval_options": {}, "options": {}},
            {"name": "PI", "train_as": "rotary", "eval_options": {"scaling": "pi"}, "options": {}},
            {"name": "P", "finetune_from": "rotary", "finetune_factor": 1, "options": pose,
             "eval_options": {}},
        ],
    }  # fmt: skip
    cell = {"mean": 10.0, "std": 0.1, "n": 3}
    cells = {(r, f): dict(cell) for r in ("rotary", "PI", "P") for f in (1, 16)}
    (line,) = finetunes({"config": cfg}, cells)
    assert "100 steps at 1x L, with PoSE from `rotary`'s weights" in line
    assert "at 16x, where both scale by 16" in line


def test_a_tiny_study_fine_tunes_pose_at_windows_of_l(tmp_path, monkeypatch) -> None:
    """A tiny run of rotary, its PoSE fine-tune and the random float row: the fine-tune draws
    windows of L (its finetune_factor 1), the others theirs; results carry the notes."""
    from test_lm_experiment import _corpus, _tiny  # the LM tests' tiny corpus and settings

    lengths: list[int] = []
    windows = LMData.windows

    def record(self, length, *args, **kwargs):
        lengths.append(length)
        return windows(self, length, *args, **kwargs)

    monkeypatch.setattr(LMData, "windows", record)
    _corpus(tmp_path / "txt")
    rows = (
        "[{name: rotary, position: rotary}, "
        "{name: pose, position: rotary, finetune_from: rotary, finetune_factor: 1, "
        "options: {scaling: yarn, factor: 4.0, augmentation: {kind: pose, target_length: 32}},"
        " notes: Zhu et al.}, "
        "{name: rfs, position: rotary, options: {augmentation: {kind: random-float, "
        "train_length: 8}}, eval_options: {scaling: pi}}]"
    )
    cfg, mapping = resolve_config(LMConfig, LM_PRESETS, "quick", [], _tiny(tmp_path, rows))
    LM.run(cfg, mapping, tmp_path / "run")
    assert set(lengths) == {8}  # rotary, rfs and the PoSE fine-tune at L (not 4 L)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["train"]["pose/seed0"]["step"] == cfg.finetune.steps
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Row recipes" in report and "- `pose`: Zhu et al." in report
    # rfs's evaluation rule (PI at evaluation) is part of its method: rotary is its twin
    assert "**Random float sampling on rotary:" in report and "`rfs` against `rotary`" in report


def test_a_successor_row_is_the_twin_of_its_bare_row_whatever_its_notes(full) -> None:
    from dataclasses import asdict

    from cape.lab.experiments.pairs import AUGMENTATION_KEYS, twins

    rows = [asdict(r) for r in full.rows]
    pairs = dict(twins(rows, AUGMENTATION_KEYS))
    assert pairs["rotary+randomized"] == pairs["rotary+CAPE scaling"] == "rotary"
    assert pairs["ALiBi+randomized"] == pairs["ALiBi+RFS"] == "ALiBi"


def test_the_verdict_says_which_way_of_moving_positions_keeps_the_perplexity() -> None:
    """Synthetic per-seed perplexities: which moved rows keep their 1x perplexity to 16x (the
    ratio per seed, then the mean, against 1.10) and how each CAPE row stands against each
    successor at 16x (level within the seeds' spread or 1%, else lower perplexity is better)."""
    from cape.lab.experiments.lm.verdict import ppl_cells, successors

    rot = {"position": "rotary", "eval_options": {}}
    aug = {"kind": "randomized", "max_length": 64}
    rows = [
        {"name": "rotary", "options": {}, **rot},
        {"name": "xPos", "options": {"xpos": True}, **rot},
        {"name": "R+CAPE", "options": {"preset": "text"}, **rot},
        {"name": "R+rand", "options": {"augmentation": aug}, **rot},
        {"name": "R+rfs", "options": {"augmentation": {"kind": "random-float"}}, **rot},
        {"name": "PoSE", "options": {"augmentation": {"kind": "pose"}}, "finetune_from": "rotary",
         **rot},
    ]  # fmt: skip
    # 1x and 16x perplexity of seeds 0, 1, 2
    ppl = {
        "rotary": ([3.0, 3.0, 3.0], [24.0, 21.0, 27.0]),
        "xPos": ([3.0, 3.1, 2.9], [3.1, 3.2, 3.0]),  # keeps, unmoved
        "R+CAPE": ([3.0, 3.0, 3.0], [12.0, 15.0, 18.0]),  # mean 15, std 3
        "R+rand": ([3.3, 3.3, 3.3], [12.0, 13.0, 14.0]),  # level with R+CAPE (15 - 13 < 3)
        "R+rfs": ([3.0, 3.0, 3.0], [40.0, 41.0, 42.0]),  # R+CAPE is better
        "PoSE": ([3.6, 3.6, 3.6], [3.8, 3.9, 4.1]),  # keeps: ratios 1.06, 1.08, 1.14 -> 1.09
    }
    records = [
        {"row": n, "seed": s, "factor": f, "ppl": v[i][s]}
        for n, v in ppl.items()
        for s in range(3)
        for i, f in enumerate((1, 16))
    ]
    results = {"config": {"rows": rows, "eval": {"factors": [1, 16]}}, "records": records}
    keep, cape = successors(results, ppl_cells(results))
    assert "`PoSE` (1.09x; +20.0% at 1x)" in keep
    head, rest = keep.split("; not ")
    assert "PoSE" in head and "R+CAPE" not in head and "xPos" not in head.split("`rotary`): ")[1]
    assert "`R+CAPE` (5.00x; +0.0% (level) at 1x)" in rest
    assert "`R+rand` (3.94x; +10.0% at 1x)" in rest and "`R+rfs` (13.67x" in rest
    assert "Without moving positions, these keep it (perplexity at 16x): `xPos` 3.10" in rest
    assert "`rotary` 2" not in rest  # rotary does not keep: 8.0x
    assert cape.startswith("**CAPE's augmentation against its successors on `rotary`, at 16x:**")
    assert "`R+CAPE` (15.00 ± 3.00) is level with `R+rand` (13.00 ± 1.00)" in cape
    assert "better than `R+rfs` (41.00 ± 1.00)" in cape and "worse than `PoSE` (3.93" in cape
    # a base moved by CAPE's augmentation alone has no such sentences
    alone = {**results, "config": {**results["config"], "rows": rows[:3]}}
    assert successors(alone, ppl_cells(alone)) == []


def test_length_study_draws_each_length_from_the_seed_whatever_came_before(monkeypatch) -> None:
    """Randomized positions sampled at evaluation: a test length's draws are the same whether
    or not shorter lengths were evaluated first (each length starts from the run's seed), as in
    the LM study. The scorer is replaced by one that reads the global generator, as the
    augmentation's draws do."""
    from test_length import SMALL

    from cape.lab.experiments.length import evaluate

    def draw(model, test, batch_size, device):
        return torch.rand(()).item(), 1

    monkeypatch.setattr(evaluate, "accuracy", draw)
    cfg = resolve_config(LengthConfig, LENGTH_PRESETS, "quick", [], SMALL)[0]
    got = {}
    for lengths in ((32, 64), (64,)):
        data = SimpleNamespace(test=dict.fromkeys(lengths))  # length -> its test set
        records = evaluate.eval_records(cfg, cfg.rows[0], 3, torch.nn.Identity(), data, "cpu")
        got[lengths] = {r["length"]: r["acc"] for r in records}
    assert got[32, 64][64] == got[(64,)][64]
    assert got[32, 64][32] == got[(64,)][64]  # every length from the same seed
