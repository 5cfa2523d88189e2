"""Twin rows (a row and the same row without CAPE's augmentation or fit_grid) and the sentence
comparing them, read off configs as the presets write them."""

from __future__ import annotations

from cape.lab.experiments import EXPERIMENTS, resolve_config
from cape.lab.experiments.pairs import (
    AUGMENTATION_KEYS,
    decided,
    level,
    pair_sentences,
    twins,
    verdict_pairs,
)
from cape.lab.experiments.verdict import claims_line


def _rows(name: str, preset: str) -> list[dict]:
    exp = EXPERIMENTS[name]
    return resolve_config(exp.config_cls, exp.presets, preset)[1]["rows"]


def test_twins_of_the_presets() -> None:
    vision = _rows("vision", "peers")
    assert twins(vision, AUGMENTATION_KEYS) == [
        ("rotary+CAPE grid", "rotary grid"),
        ("RoPE-Axial+CAPE", "RoPE-Axial"),
        ("RoPE-Mixed+CAPE", "RoPE-Mixed"),
    ]
    assert twins(vision, ("fit_grid",)) == [("CAPE grid", "CAPE")]
    assert twins(vision, ("draw",)) == [("rotary+CAPE grid per layer", "rotary+CAPE grid")]
    asr = _rows("asr", "digits-k3-peers")
    assert twins(asr, ("draw",)) == [("rotary+CAPE per layer", "rotary+CAPE")]
    assert twins(asr, AUGMENTATION_KEYS) == [("rotary+CAPE", "rotary"), ("ALiBi+CAPE", "ALiBi")]
    # translation's plain rotary turns the model's default augmentation off (None): a twin
    translation = _rows("translation", "quick-peers")
    assert twins(translation, AUGMENTATION_KEYS) == [
        ("rotary+CAPE", "rotary"),
        ("ALiBi+CAPE", "ALiBi"),
    ]
    # CAPE names augment by default: "CAPE λ=2" is no augmented twin of "CAPE"
    assert twins(_rows("asr", "digits-k3"), AUGMENTATION_KEYS) == []


def test_a_twin_must_match_in_everything_else() -> None:
    rows = [
        {"name": "a", "position": "rotary", "options": {"max_local_shift": 0.5}},
        {"name": "b", "position": "rotary", "options": {"base": 100.0}},
        {"name": "c", "position": "alibi", "options": {}},
        {"name": "d", "position": "rotary", "options": {}, "train_size": 24},
        {"name": "e", "position": "rotary", "options": {"normalize": False, "base": 9.0}},
    ]
    assert twins(rows, AUGMENTATION_KEYS) == []  # e: augmentation off, but another base
    rows[4]["options"] = {"normalize": False}  # off: e is a's twin, and not augmented itself
    assert twins(rows, AUGMENTATION_KEYS) == [("a", "e")]
    rows.pop()
    rows.append({"name": "f", "position": "rotary", "options": None})
    assert twins(rows, AUGMENTATION_KEYS) == [("a", "f")]


def test_an_augmentations_evaluation_rule_is_part_of_its_method() -> None:
    # RFS read with PI at evaluation, randomized positions sampled at evaluation: still the
    # twin of the bare row; for any other key the evaluation options make another model
    aug = {"augmentation": {"kind": "randomized", "max_length": 64}}
    rows = [
        {"name": "r", "position": "rotary", "options": {}, "eval_options": {}},
        {"name": "a", "position": "rotary", "options": aug, "eval_options": {"scaling": "pi"}},
        {
            "name": "g",
            "position": "rotary",
            "options": {"fit_grid": [4, 4]},
            "eval_options": {"x": 1},
        },
    ]
    assert twins(rows, AUGMENTATION_KEYS) == [("a", "r")]
    assert twins(rows, ("fit_grid",)) == []
    rows[2]["eval_options"] = {}
    assert twins(rows, ("fit_grid",)) == [("g", "r")]


def test_sentences_say_the_difference_and_when_it_is_within_the_spread() -> None:
    cells = {
        ("x", 1): {"mean": 90.0, "std": 1.0},
        ("y", 1): {"mean": 80.0, "std": 2.0},
        ("x", 2): {"mean": 50.0, "std": 4.0},
        ("y", 2): {"mean": 52.0, "std": 1.0},
    }
    assert level(cells["x", 2], cells["y", 2]) and not level(cells["x", 1], cells["y", 1])
    (said,) = pair_sentences(
        "T", [("x", "y")], lambda r, c: cells.get((r, c)), [1, 2, 3], lambda c: f"c{c}",
        twin_note=" (n)",
    )  # fmt: skip
    assert said == "**T**: `x` against `y` (n), points: +10.0 at c1, -2.0 at c2 (level)."
    assert pair_sentences("T", [("x", "z")], lambda r, c: cells.get((r, c)), [1], str) == []


def test_verdict_pairs_compare_augmentation_and_extensions_on_the_same_weights() -> None:
    rows = _rows("asr", "digits-k3-peers")
    cells = {
        (name, "all"): {"mean": mean, "std": 0.5}
        for name, mean in (
            ("rotary", 10.0), ("rotary+CAPE", 7.0), ("rotary+PI", 30.0), ("rotary+NTK", 10.2),
            ("rotary+YaRN", 12.0), ("ALiBi", 5.0), ("ALiBi+CAPE", 4.8),
            ("rotary+CAPE per layer", 9.0),
        )
    }  # fmt: skip
    said = verdict_pairs(rows, lambda r, c: cells.get((r, c)), ["all"], str, "WER points")
    assert said == [
        "**CAPE's augmentation**: `rotary+CAPE` against `rotary` (not augmented), WER points: "
        "-3.0 at all.",
        "**CAPE's augmentation**: `ALiBi+CAPE` against `ALiBi` (not augmented), WER points: "
        "-0.2 at all (level).",
        "**Extended at inference**: `rotary+PI` against `rotary` (the same weights), WER points: "
        "+20.0 at all.",
        "**Extended at inference**: `rotary+NTK` against `rotary` (the same weights), WER "
        "points: +0.2 at all (level).",
        "**Extended at inference**: `rotary+YaRN` against `rotary` (the same weights), WER "
        "points: +2.0 at all.",
        "**Augmentation drawn in every layer**: `rotary+CAPE per layer` against `rotary+CAPE` "
        "(one draw shared by the layers), WER points: +2.0 at all.",
    ]


def test_a_claim_within_the_spread_is_undecided() -> None:
    a, b = {"mean": 55.0, "std": 2.8}, {"mean": 57.0, "std": 2.8}
    assert decided(a, b, False) is None and decided(a, b, True) is None
    far = {"mean": 61.0, "std": 2.8}  # 4 points apart, beyond the larger spread
    assert decided(far, b, True) is True and decided(b, far, False) is False
    line = claims_line(
        [("A > B", "61 vs 57", True), ("C > D", "50 vs 60", False), ("E >= F", "55 vs 57", None)]
    )
    assert line == [
        "**The paper's claims**: 1 of 3 hold; not: C > D (50 vs 60); "
        "undecided (within the seeds' spread): E >= F (55 vs 57)."
    ]
    assert claims_line([]) == []
    assert claims_line([("A", "1 vs 1", None)]) == [
        "**The paper's claims**: 0 of 1 hold; undecided (within the seeds' spread): A (1 vs 1)."
    ]
