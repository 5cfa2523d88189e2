"""The translation verdict: best rows on the longest bucket within the seeds' spread, the share
of test BLEU kept there, the lowest NLL far out, and the augmentation / extension pairs."""

from __future__ import annotations

from cape.lab.experiments.translation.verdict import verdict
from cape.lab.experiments.verdict import Study, positions_line

ROWS = [
    {"name": "rotary", "position": "rotary", "options": {"augmentation": None}},
    {
        "name": "rotary+YaRN",
        "position": "rotary",
        "options": {},
        "train_as": "rotary",
        "eval_options": {"scaling": "yarn"},
    },
    {"name": "rotary+CAPE", "position": "rotary", "options": {"max_global_shift": 5.0}},
    {"name": "ALiBi", "position": "alibi", "options": {}},
]
# BLEU per (row, split) over two seeds
BLEU = {
    "rotary": {"test": (30, 32), "test_41+": (6, 8)},
    "rotary+YaRN": {"test": (30, 30), "test_41+": (9, 9)},
    "rotary+CAPE": {"test": (31, 31), "test_41+": (3, 3)},
    "ALiBi": {"test": (20, 20), "test_41+": (8, 8)},
}
NLL = {
    "rotary": (6.0, 6.2),
    "rotary+YaRN": (5.0, 5.0),
    "rotary+CAPE": (5.0, 5.2),
    "ALiBi": (7, 7),
}


def _results() -> dict:
    records = []
    for row, splits in BLEU.items():
        for split, values in splits.items():
            for seed, v in enumerate(values):
                records.append(
                    {"row": row, "seed": seed, "split": split, "bin": "all", "bleu": float(v)}
                )
        for seed, v in enumerate(NLL[row]):
            records.append(
                {"row": row, "seed": seed, "split": "stacked", "bin": "0-31", "nll": 1.0}
            )
            records.append(
                {"row": row, "seed": seed, "split": "stacked", "bin": "256-328", "nll": v}
            )
    return {"config": {"rows": ROWS}, "records": records, "train_length": 57}


def _line(said: list[str], prefix: str) -> str:
    return next(line for line in said if line.startswith(prefix))


def test_verdict_reads_the_numbers() -> None:
    said = verdict(_results())
    # no nopos row: the question is not measured
    assert said[0] == "**Positions needed?** Not measured: no row without positions."
    # 41+: YaRN 9.0 ± 0; rotary 7.0 ± 1.41 is not level (|9 - 7| = 2 > 1.41); ALiBi 8 ± 0
    assert _line(said, "**Best at 41+ words**") == (
        "**Best at 41+ words**: `rotary+YaRN` 9.0 ± 0.0 BLEU; no other row within the seeds' "
        "spread."
    )
    # kept: YaRN 9/30 = 30%, ALiBi 8/20 = 40%, rotary 7/31 = 23%, rotary+CAPE 3/31 = 10%
    assert _line(said, "**Share of the test BLEU") == (
        "**Share of the test BLEU kept at 41+ words** (means over seeds; rows with a test BLEU "
        "of at least half the best's, 15.5): `ALiBi` 40%, `rotary+YaRN` 30%, `rotary` 23%, "
        "`rotary+CAPE` 10%."
    )
    # far out: YaRN 5.00 lowest, rotary+CAPE 5.10 ± 0.14 level with it, rotary 6.1 not
    assert said[-1] == (
        "**Stacked sentences, output positions 256-328** (far past the training targets' 57 "
        "tokens): `rotary+YaRN` has the lowest NLL (5.00 nats per token), level with "
        "`rotary+CAPE`."
    )
    aug = _line(said, "**CAPE's augmentation**: `rotary+CAPE` against `rotary`")
    assert "-4.0 at 41+ words" in aug and "+0.0 at test (level)" in aug
    assert "+2.0 at 41+ words" in _line(said, "**Extended at inference**: `rotary+YaRN` against")
    assert len(said) == 6  # positions, the one bucket measured, 2 pairs, share, stacked


def test_rows_that_do_not_translate_are_not_ranked_by_their_share() -> None:
    results = _results()
    for r in results["records"]:
        if r["row"] == "ALiBi" and r["split"] == "test":
            r["bleu"] = 2.0  # 8 / 2 = 400% would top the ranking
    said = _line(verdict(results), "**Share of the test BLEU")
    assert "`ALiBi`" not in said.split(";")[1] and said.endswith("below that floor: `ALiBi`.")


def test_a_level_row_is_named_with_the_best() -> None:
    results = _results()
    for r in results["records"]:
        if r["row"] == "ALiBi" and r["split"] == "test_41+":
            r["bleu"] = 9.0 + (0.5 if r["seed"] else -0.5)  # 9.0 ± 0.71: level with YaRN's 9.0
    line = _line(verdict(results), "**Best at 41+ words**")
    assert "level with it within the seeds' spread: `ALiBi` 9.0 ± 0.7 BLEU" in line


def test_rows_reusing_weights_do_not_repeat_the_positions_removed_check() -> None:
    cell = {"n": 2, "std": 0.1}
    study = Study(
        rows=[*ROWS, {"name": "nopos", "position": "nopos"}], train="test", columns=["test"],
        unseen=[], higher=False, metric="loss", unit="",
        cells={(n, "test"): {**cell, "mean": m} for n, m in
               (("rotary", 1.0), ("rotary+YaRN", 1.0), ("ALiBi", 2.0), ("nopos", 3.0))},
        removed={n: {**cell, "mean": 5.0} for n in ("rotary", "rotary+YaRN", "ALiBi")},
    )  # fmt: skip
    line = positions_line(study)
    # rotary+YaRN evaluates rotary's weights: without positions it is rotary, said once
    assert "`rotary` 1.0 → 5.0, `ALiBi` 2.0 → 5.0; worse without them" in line
    assert "rotary+YaRN" not in line
