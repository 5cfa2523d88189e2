"""Every ```python block of the README runs, and every public name has an example there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import cape
import cape.functional
import cape.lab.apps.transcribe
import cape.lab.apps.translate
import cape.lab.bench
import cape.lab.data
import cape.lab.experiments
import cape.lab.report
import cape.lab.train
import cape.lab.viz

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int) -> None:
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), {})


@pytest.mark.parametrize("name", cape.__all__)
def test_public_name_has_an_example(name: str) -> None:
    code = "\n".join(BLOCKS)
    assert re.search(rf"\b{re.escape(name)}\b", code), f"cape.{name} has no README example"


@pytest.mark.parametrize("name", cape.lab.data.__all__)
def test_data_name_has_an_example(name: str) -> None:
    assert re.search(rf"\b{re.escape(name)}\b", "\n".join(BLOCKS)), f"cape.lab.data.{name} has no example"


@pytest.mark.parametrize("name", cape.lab.train.__all__)
def test_train_name_has_an_example(name: str) -> None:
    assert re.search(rf"\b{re.escape(name)}\b", "\n".join(BLOCKS)), f"cape.lab.train.{name} has no example"


@pytest.mark.parametrize("name", cape.models.__all__)
def test_model_name_has_an_example(name: str) -> None:
    assert re.search(rf"\b{re.escape(name)}\b", "\n".join(BLOCKS)), f"cape.models.{name} has no example"


@pytest.mark.parametrize("name", cape.functional.__all__)
def test_functional_name_has_an_example(name: str) -> None:
    code = "\n".join(BLOCKS)
    assert re.search(rf"F\.{re.escape(name)}\b", code), f"cape.functional.{name} has no README example"


@pytest.mark.parametrize(
    "name",
    [f"report.{n}" for n in cape.lab.report.__all__]
    + [f"viz.{n}" for n in cape.lab.viz.__all__]
    + [f"experiments.{n}" for n in cape.lab.experiments.__all__]
    + [f"bench.{n}" for n in cape.lab.bench.__all__]
    + [f"asr_inference.{n}" for n in cape.lab.apps.transcribe.__all__]
    + [f"mt_inference.{n}" for n in cape.lab.apps.translate.__all__],
)
def test_report_viz_experiments_names_have_examples(name: str) -> None:
    short = name.split(".", 1)[1]
    assert re.search(rf"\b{re.escape(short)}\b", "\n".join(BLOCKS)), f"cape.{name} has no example"


# A results table in the README is marked `<!-- from results/<run>/report.md -->` on the line
# before it: every one of its rows must be a row of that generated report, so no figure in the
# README is typed in by hand.
_ROOT = Path(__file__).resolve().parents[1]
_SOURCED = re.findall(r"<!-- from (\S+) -->\n((?:[ \t]*\|.*\n)+)", README)  # also indented


def test_readme_has_sourced_tables() -> None:
    assert len(_SOURCED) >= 2


@pytest.mark.parametrize("index", range(len(_SOURCED)))
def test_readme_results_come_from_generated_reports(index: int) -> None:
    source, table = _SOURCED[index]
    report = (_ROOT / source).read_text(encoding="utf-8").splitlines()
    for line in table.splitlines()[2:]:  # header and rule may be shortened
        assert line.strip() in report, f"README row not in {source}: {line.strip()}"
