"""The run cache every experiment shares (`cape.lab.experiments.run_folders.cached_runs`): finished
runs are read back, a change of what is measured evaluates again, a change of what is trained is
refused with the keys named."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from cape.lab.experiments.run_folders import cached_runs, check_run_settings, run_settings


@dataclass
class _Train:
    steps: int = 10
    log_every: int = 1


@dataclass
class _Eval:
    sizes: list[int] = field(default_factory=lambda: [1, 2])
    val_limit: int = 0  # picks the checkpoint: a training setting


@dataclass
class _Row:
    name: str = "a"
    width: int = 4


@dataclass
class _Cfg:
    name: str = "x"
    seeds: list[int] = field(default_factory=lambda: [0])
    train: _Train = field(default_factory=_Train)
    eval: _Eval = field(default_factory=_Eval)
    rows: list[_Row] = field(default_factory=lambda: [_Row()])


def _run(cfg: _Cfg, out, calls: list) -> list[dict]:
    def compute(row, seed, folder):
        calls.append((row.name, seed))
        return {"value": len(calls), "sizes": list(cfg.eval.sizes)}

    return [done for _, _, done in cached_runs(cfg.rows, cfg.seeds, out, compute, cfg)]


def test_settings_are_the_run_s_own():
    cfg = _Cfg(rows=[_Row("a"), _Row("b", 8)], seeds=[0, 1])
    got = run_settings(cfg, cfg.rows[1])
    assert got == {
        "train.steps": 10,
        "train.log_every": 1,
        "eval.sizes": [1, 2],
        "eval.val_limit": 0,
        "row.name": "b",
        "row.width": 8,
    }


def test_cache_reads_back_reevaluates_or_refuses(tmp_path):
    calls: list = []
    first = _run(_Cfg(), tmp_path, calls)
    assert calls == [("a", 0)] and first == [{"value": 1, "sizes": [1, 2]}]
    saved = json.loads((tmp_path / "a" / "seed0" / "settings.json").read_text())
    assert saved["train.steps"] == 10
    # the same settings, another name, more seeds, logging changed: the finished run is read back
    again = _run(_Cfg(name="y", seeds=[0, 1], train=_Train(log_every=5)), tmp_path, calls)
    assert calls == [("a", 0), ("a", 1)] and again[0] == first[0]
    # what is measured changed: evaluated again (compute resumes its finished training)
    more = _run(_Cfg(eval=_Eval([1, 2, 3])), tmp_path, calls)
    assert calls[-1] == ("a", 0) and more[0]["sizes"] == [1, 2, 3]
    assert _run(_Cfg(eval=_Eval([1, 2, 3])), tmp_path, calls)[0] == more[0]  # now cached
    # what is trained changed: refused, naming the key and both values
    n = len(calls)
    with pytest.raises(ValueError, match=r"train.steps: 10 -> 20.*another --out"):
        _run(_Cfg(train=_Train(steps=20)), tmp_path, calls)
    with pytest.raises(ValueError, match=r"row.width: 4 -> 5"):
        _run(_Cfg(rows=[_Row("a", 5)]), tmp_path, calls)
    with pytest.raises(ValueError, match=r"eval.val_limit: 0 -> 50"):
        _run(_Cfg(eval=_Eval([1, 2, 3], val_limit=50)), tmp_path, calls)
    assert len(calls) == n


def test_interrupted_reevaluation_is_not_mistaken_for_done(tmp_path):
    calls: list = []
    _run(_Cfg(), tmp_path, calls)

    def crash(row, seed, folder):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # new eval settings, killed while evaluating
        list(cached_runs([_Row()], [0], tmp_path, crash, _Cfg(eval=_Eval([7]))))
    again = _run(_Cfg(eval=_Eval([7])), tmp_path, calls)
    assert again[0]["sizes"] == [7] and len(calls) == 2  # evaluated, not the old eval.json


def test_train_cost_table_shares_and_unrecorded_runs() -> None:
    from cape.lab.experiments.reporting import train_cost_table
    from cape.lab.report import Report

    timed = {
        "time_data": 1.0,
        "time_compute": 7.0,
        "time_log": 1.0,
        "time_checkpoint": 1.0,
        "engine_overhead": 0.3,
        "eval_acc": 91.25,
    }
    rep = Report("t")
    better = {**timed, "best_eval_acc": 93.0}  # the kept checkpoint's value is shown too
    same = {**timed, "best_eval_acc": 91.25}  # no "(best ...)" when they agree
    train_cost_table(
        rep,
        {
            "train": {
                "a/seed0": timed,
                "b/seed0": {"eval_acc": 50.0},
                "c/seed0": better,
                "d/seed0": same,
            }
        },
    )
    rows = {
        r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]]
        for r in rep.markdown().splitlines()
        if r.startswith("| ") and "seed" in r
    }
    # loader share: 1 s of 10 s; the overhead as the Trainer reported it
    assert rows["a/seed0"] == ["7", "1.0", "10.0%", "30.0%", "91.2"]
    assert rows["b/seed0"] == ["–", "–", "–", "–", "50.0"]
    assert rows["c/seed0"][-1] == "91.2 (best 93.0)" and rows["d/seed0"][-1] == "91.2"
    assert "final val acc" in rep.markdown()


def test_finished_only_reads_back_and_writes_nothing(tmp_path):
    from cape.lab.experiments.run_folders import finished_rows

    calls: list = []
    _run(_Cfg(rows=[_Row("a")], seeds=[0]), tmp_path, calls)  # a/seed0 finished
    cfg = _Cfg(rows=[_Row("a"), _Row("b")], seeds=[0, 1])
    assert finished_rows(cfg, tmp_path) == ["a"]

    def never(row, seed, folder):
        raise AssertionError("train=False must not compute")

    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    got = list(cached_runs(cfg.rows, cfg.seeds, tmp_path, never, cfg, train=False))
    assert [(r.name, s, d["value"]) for r, s, d in got] == [("a", 0, 1)]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    # what is measured changed: that eval.json is not this config's result, so not finished
    remeasure = _Cfg(eval=_Eval([9]))
    assert finished_rows(remeasure, tmp_path) == []
    assert list(cached_runs(remeasure.rows, [0], tmp_path, never, remeasure, train=False)) == []
    with pytest.raises(ValueError, match=r"train.steps: 10 -> 20"):  # trained otherwise: refused
        finished_rows(_Cfg(train=_Train(steps=20)), tmp_path)


def test_seeds_by_row_from_the_runs() -> None:
    from cape.lab.experiments.reporting import seeds_by_row

    got = seeds_by_row({"train": {"a/seed0": {}, "CAPE Δ=10/seed1": {}, "a/seed2": {}}})
    assert got == {"a": [0, 2], "CAPE Δ=10": [1]}


def test_a_run_of_chosen_rows_is_finished_in_the_whole_study(tmp_path):
    """`--rows` keeps only the chosen rows in eval lists of row names (hop_rows): what such a
    list says of a run is whether it names the run's own row."""
    folder = tmp_path / "run"
    folder.mkdir()
    chosen = {"row.name": "rotary", "eval.hop_rows": [], "train.steps": 10}
    (folder / "settings.json").write_text(json.dumps(chosen))
    whole = {**chosen, "eval.hop_rows": ["sinpos", "CAPE"]}
    assert check_run_settings(folder, whole) is False  # nothing to measure again
    named = {**chosen, "row.name": "sinpos", "eval.hop_rows": ["sinpos"]}
    (folder / "settings.json").write_text(json.dumps({**named, "eval.hop_rows": []}))
    assert check_run_settings(folder, named) is True  # sinpos is now measured at other hops


def test_a_rows_eval_options_are_measured_again_not_trained_again(tmp_path):
    """A row's `eval_options` change how its weights are evaluated (RoPE's PI at inference,
    randomized positions sampled at evaluation), not the weights: measured again; a row's own
    options still refuse the folder."""
    folder = tmp_path / "run"
    folder.mkdir()
    old = {"row.name": "r", "row.options.augmentation.kind": "randomized", "train.steps": 10}
    (folder / "settings.json").write_text(json.dumps(old))
    assert check_run_settings(folder, old) is False
    sampled = {**old, "row.eval_options.augmentation.sample_at_eval": True}
    assert check_run_settings(folder, sampled) is True
    with pytest.raises(ValueError, match=r"row.options.augmentation.kind"):
        check_run_settings(folder, {**old, "row.options.augmentation.kind": "pose"})
