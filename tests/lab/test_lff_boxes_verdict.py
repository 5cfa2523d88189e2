"""The LFF boxes verdict: the best row on unseen coordinates within the seeds' spread, the rows
that lose accuracy from seen to unseen coordinates, the position-blind row, and CAPE's pairs."""

from __future__ import annotations

from cape.lab.experiments.lff_boxes.verdict import verdict

ROWS = [
    {"name": "Embed-4D", "position": "embed-4d", "options": {}, "augment": {}},
    {"name": "Axial", "position": "rope-axial", "options": {}, "augment": {}},
    {
        "name": "Axial+CAPE",
        "position": "rope-axial",
        "options": {},
        "augment": {"max_global_shift": 0.05},
    },
    {"name": "None", "position": "nopos", "options": {}, "augment": {}},
]
# accuracy per row and set over 2 seeds
ACC = {
    "Embed-4D": {"test_seen": (46, 48), "test_unseen": (27, 29)},  # 47 -> 28: a drop
    "Axial": {"test_seen": (80, 82), "test_unseen": (78, 84)},  # 81 -> 81 ± 4.2
    "Axial+CAPE": {"test_seen": (84, 84), "test_unseen": (83, 85)},  # 84 ± 1.4: level
    "None": {"test_seen": (32, 32), "test_unseen": (32, 32)},
}


def _results() -> dict:
    records = [
        {"row": row, "seed": seed, "set": split, "question": "all", "acc": float(v)}
        for row, sets in ACC.items()
        for split, values in sets.items()
        for seed, v in enumerate(values)
    ]
    records.append({"row": "Axial", "seed": 0, "set": "test_seen", "question": "above", "acc": 1.0})
    return {"config": {"rows": ROWS}, "records": records}


def test_verdict_reads_the_numbers() -> None:
    said = verdict(_results())
    assert said[0].startswith("**Positions needed?** yes: at seen coordinates the best row")
    assert "`None` (no positions) 32.0" in said[0]
    assert said[1].startswith("**Best at unseen coordinates**: `Axial+CAPE` 84.0 ± 1.4%; level ")
    assert "within the seeds' spread: `Axial` " in said[1]
    assert said[2] == (
        "**CAPE's augmentation**: `Axial+CAPE` against `Axial` (not augmented), accuracy points "
        "(positive: better): +3.0 at seen coordinates, +3.0 at unseen coordinates (level)."
    )
    assert said[3] == (
        "**Lose accuracy on unseen coordinates** (beyond the seeds' spread): `Embed-4D` "
        "-19.0 points."
    )
    assert len(said) == 4


def test_no_twin_without_the_plain_row_and_no_drop_within_the_spread() -> None:
    results = _results()
    results["config"] = {"rows": [r for r in ROWS if r["name"] != "Axial"]}
    results["records"] = [r for r in results["records"] if r["row"] != "Axial"]
    for r in results["records"]:
        if r["row"] == "Embed-4D" and r["set"] == "test_unseen":
            r["acc"] = 47.0 + (-15 if r["seed"] else 15)  # 47 ± 21: within the spread
    said = verdict(results)
    assert said[-1].endswith("none.") and not any("augmentation" in s for s in said)
