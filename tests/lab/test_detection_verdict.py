"""The detection report's verdict and the paper's claims, on results made by hand whose answers
are known."""

from __future__ import annotations

import itertools

from cape.lab.experiments.detection.coco import METRICS
from cape.lab.experiments.detection.verdict import keep_line, paper_claims, set_cells, verdict

SIZES = [48, 56, 64, 72, 80]  # the last two never seen in training


def _results(ap: dict[str, tuple[list[float], list[float]]], held: int = 2, removed=None):
    """results with, per row, (AP at each seen size, AP at each unseen size) for seeds 0-2 (seed
    k adds k/10, a spread of 0.1); every COCO metric equal to AP."""
    rows = [{"name": n, "position": "nopos" if n == "nopos" else "sine-2d"} for n in ap]
    records = []
    for name, (seen, unseen) in ap.items():
        values = zip(SIZES, seen + unseen, strict=True)
        for seed, (size, value) in itertools.product(range(3), values):
            rec = {"row": name, "seed": seed, "size": size,
                   "seen": size in SIZES[: len(SIZES) - held], "method": "plain"}  # fmt: skip
            rec.update(dict.fromkeys(METRICS, value + seed / 10))
            records.append(rec)
    config = {"rows": rows, "data": {"sizes": SIZES, "held_out": held}}
    out = {"config": config, "records": records, "train": {}}
    if removed:
        out["removed"] = [{"row": r, "seed": s, "value": v} for r, v in removed.items()
                          for s in range(3)]  # fmt: skip
    return out


PAPER = {
    "nopos": ([1.0, 1.0, 1.0], [1.0, 1.0]),
    "Sine-2D": ([30.0, 30.0, 30.0], [20.0, 10.0]),
    "Embed-2D": ([31.0, 31.0, 31.0], [5.0, 1.0]),
    "MLP": ([29.0, 29.0, 29.0], [25.0, 20.0]),
    "Learnable-Fourier+MLP": ([32.0, 32.0, 32.0], [28.0, 26.0]),
    "CAPE2d grid": ([20.0, 20.0, 20.0], [20.0, 19.95]),  # not a paper row: keeps its AP
}


def test_set_cells_average_each_runs_sizes_first():
    cells = set_cells(_results(PAPER))
    assert cells[("Sine-2D", "unseen")]["mean"] == 15.1  # (20 + 10) / 2, + the mean seed 0.1
    assert cells[("Sine-2D", "seen")]["n"] == 3
    assert round(cells[("Embed-2D", "unseen")]["std"], 6) == 0.1


def test_the_papers_claims_hold_on_the_papers_numbers():
    claims = {c: (m, h) for c, m, h in paper_claims(_results(PAPER))}
    best = claims["Learnable-Fourier+MLP has the best AP of the paper's rows at the unseen sizes"]
    assert best[1] is True and "`MLP`" in best[0]
    assert claims["Embed-2D has the lowest AP of the paper's rows at the unseen sizes"][1] is True
    gap = claims["Embed-2D's gap to the other paper rows is wider at unseen sizes"]
    # others unseen (15 + 22.5 + 27) / 3 = 21.5 against Embed-2D's 3: +18.5; seen 30.33 - 31
    assert gap[1] is True and gap[0].startswith("+18.5 unseen vs -0.7 seen")
    every = claims["Learnable-Fourier+MLP is first at every COCO metric at the unseen sizes"]
    assert every[1] is True


def _claims(ap) -> dict[str, bool | None]:
    return {c: h for c, _, h in paper_claims(_results(ap))}


def test_claims_fail_or_stay_undecided_as_the_numbers_say():
    best = "Learnable-Fourier+MLP has the best AP of the paper's rows at the unseen sizes"
    lowest = "Embed-2D has the lowest AP of the paper's rows at the unseen sizes"
    gap = "Embed-2D's gap to the other paper rows is wider at unseen sizes"
    level = {**PAPER, "Learnable-Fourier+MLP": ([32.0] * 3, [25.05, 20.0])}  # 22.6 vs MLP 22.6
    assert _claims(level)[best] is None
    behind = {**PAPER, "Learnable-Fourier+MLP": ([32.0] * 3, [20.0, 20.0])}
    assert _claims(behind)[best] is False
    higher = {**PAPER, "Embed-2D": ([31.0] * 3, [30.0, 30.0])}
    assert _claims(higher)[lowest] is False and _claims(higher)[gap] is False


def test_table1_protocol_claims_over_all_sizes_and_no_gap_claim():
    claims = paper_claims(_results({k: (v[0] + v[1], []) for k, v in PAPER.items()}, held=0))
    names = [c for c, _, _ in claims]
    assert all("over all sizes" in c for c in names) and len(names) == 3


def test_verdict_says_positions_needed_and_who_keeps_ap():
    results = _results(PAPER, removed={"Sine-2D": 1.0, "Learnable-Fourier+MLP": 2.0})
    lines = verdict(results)
    assert lines[0].startswith("**Positions needed?** yes: at 64 px the best row")
    assert "`Learnable-Fourier+MLP` 32.1 AP" not in lines[0]  # AP has no unit to repeat
    assert "worse without them: `Sine-2D`, `Learnable-Fourier+MLP`" in lines[0]
    keep = keep_line(results)
    assert keep == lines[1]
    # from 64 px to the mean of 72 and 80: every paper row drops by more than the spread
    assert "lose it beyond the seeds' spread: `Sine-2D`, `Embed-2D`, `MLP`, `Learn" in keep
    assert keep.endswith("keep it: `CAPE2d grid`.") and "`nopos`" not in keep
    assert any(line.startswith("**Best at 80 px**: `Learnable-Fourier+MLP`") for line in lines)
    assert any(line.startswith("**The paper's claims**: 4 of 4 hold") for line in lines)
