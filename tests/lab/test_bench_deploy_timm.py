"""`cape bench deploy`'s timm cases: timm's ViT with cape installed exports at another image size
than the traced one, and without timm the rows say so and the bench still passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from cape.lab.bench import deploy_cases
from cape.lab.bench.deploy import main, run_case

TIMM_CASES = [name for name in deploy_cases.CASES if name.startswith("timm ")]


def test_the_timm_cases_are_the_integrations() -> None:
    assert TIMM_CASES == ["timm stock", "timm cape2d", "timm rotary2d", "timm rope-mixed"]


@pytest.mark.parametrize("name", ["timm cape2d", "timm rotary2d"])
def test_a_timm_case_exports_for_another_image_size(name: str) -> None:
    pytest.importorskip("timm", reason="timm is in the test extra")
    case = deploy_cases.make_case(name)
    assert case.other[0].shape[-2:] != case.args[0].shape[-2:]  # the check can fail
    cell = run_case(name, ["export"])["export"]
    assert float(cell) < 1e-5, cell


def test_without_timm_the_rows_are_not_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing() -> deploy_cases.Case:
        raise ModuleNotFoundError("No module named 'timm'", name="timm")

    monkeypatch.setitem(deploy_cases.CASES, "timm cape2d", missing)
    assert main(["--cases", "timm cape2d", "--checks", "export,onnx", "--out", str(tmp_path)]) == 0
    row = next(r for r in (tmp_path / "deploy.md").read_text().splitlines() if "timm cape2d" in r)
    assert row.count("not run: timm is not installed") == 2
