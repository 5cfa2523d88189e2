"""Issue 43, item 3: the experiments index and each experiment page state what the default
command answers, how long it took from a fresh clone and its verdict, copied from the archive.

`results/defaults.json` records, per experiment, the run of its default command from a fresh
clone: the command, the run it wrote (the default preset's name, archived as results/<run>), its
wall time and when. The tests check that the record names what the command runs today, that the
archive exists, and that the index and the page quote the time and the report's first verdict
line word for word.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cape.lab.experiments import EXPERIMENTS, resolve_config

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = ROOT / "results" / "defaults.json"
PAGES = {
    "asr": "asr.md",
    "translation": "translation.md",
    "vision": "vision.md",
    "lm": "lm.md",
    "length": "length.md",
    "lff-boxes": "lff-boxes.md",
    "lff-generation": "lff-generation.md",
    "detection": "detection.md",
}


def _defaults() -> dict[str, Any]:
    return json.loads(DEFAULTS.read_text(encoding="utf-8"))["runs"]


def wall(seconds: float) -> str:
    """How a page writes a wall time: "14 min 2 s" (or "48 s")."""
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def _first_verdict(report: Path) -> str:
    lines = report.read_text(encoding="utf-8").splitlines()
    start = lines.index("## Verdict")
    return next(line for line in lines[start + 1 :] if line.startswith("- "))[2:]


def test_every_experiment_has_its_default_recorded() -> None:
    assert set(_defaults()) == set(EXPERIMENTS) == set(PAGES)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_record_is_of_what_the_default_runs_today(name: str) -> None:
    exp, got = EXPERIMENTS[name], _defaults()[name]
    cfg, _ = resolve_config(exp.config_cls, exp.presets, exp.default_preset)
    assert got["command"] == f"cape experiment {name}" and got["run"] == cfg.name
    assert got["wall_s"] > 0 and got["date"] and got["commit"]
    results = json.loads((ROOT / "results" / cfg.name / "results.json").read_text())
    assert results["config"]["name"] == cfg.name and len(results["config"]["seeds"]) >= 2


@pytest.mark.parametrize("name", sorted(PAGES))
def test_index_and_page_state_the_default_its_time_and_verdict(name: str) -> None:
    got = _defaults()[name]
    verdict = _first_verdict(ROOT / "results" / got["run"] / "report.md")
    line = next(
        (
            line
            for line in (ROOT / "docs" / "experiments" / "index.md").read_text().splitlines()
            if line.startswith("- [") and f"`{got['command']}`" in line
        ),
        None,
    )
    assert line is not None, f"the index has no line for `{got['command']}`"
    assert f"`{got['run']}`" in line and wall(got["wall_s"]) in line, line
    assert line.endswith(verdict), f"the index quotes another verdict for {name}"
    page = (ROOT / "docs" / "experiments" / PAGES[name]).read_text()
    assert f"`{got['command']}`" in page and wall(got["wall_s"]) in page
    assert f"<!-- verdict from results/{got['run']}/report.md -->" in page
    assert verdict in page


def test_wall_times_read_as_pages_write_them() -> None:
    assert wall(842.4) == "14 min 2 s" and wall(48) == "48 s" and wall(60) == "1 min 0 s"


def test_every_archived_report_opens_with_its_verdict() -> None:
    """Issue 43, item 2: each report's first section is its verdict, before any table."""
    reports = sorted((ROOT / "results").glob("*/report.md"))
    assert len(reports) >= 29
    for report in reports:
        text = report.read_text(encoding="utf-8")
        assert "\n## Verdict\n" in text, f"{report.parent.name} has no verdict"
        assert text.index("\n## Verdict\n") < text.index("\n|"), report.parent.name


def test_the_archives_without_results_json_carry_the_verdict_of_their_tables() -> None:
    """The three archives without results.json: their verdict is what the shared code writes
    from their own main table (scripts/verdict_from_tables.py), not text typed by hand."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "verdict_from_tables", ROOT / "scripts" / "verdict_from_tables.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in module.SPECS:
        report = ROOT / "results" / name / "report.md"
        assert not (report.parent / "results.json").exists()
        text = report.read_text(encoding="utf-8")
        lines = module.verdict(module.study_of(name, text.splitlines()))
        assert module.with_verdict(text, lines) == text, name
