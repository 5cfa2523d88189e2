"""The lab's tier: corpora built on the machine, training runs, reports, the command line and
the documentation. Every test here is marked `lab` and `slow`, so that `pytest -m "not slow"`
is the library's fast check (tests/library, tests/test_*.py) and the README's test command,
plain `pytest`, runs everything."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.lab)
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def rerun_trains_nothing(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[Any]]:
    """`rerun(exp, cfg, mapping, out)`: run a finished study again with its `train_run` made to
    fail; its results.json keeps the same records (nothing was trained again): -> them."""

    def rerun(exp: Any, cfg: Any, mapping: Any, out: Path) -> list[Any]:
        before = json.loads((out / "results.json").read_text())["records"]

        def boom(*a: object, **k: object) -> None:
            raise AssertionError("a finished run was trained again")

        with monkeypatch.context() as m:
            m.setattr(exp, "train_run", boom)
            exp.run(cfg, mapping, out)
        assert json.loads((out / "results.json").read_text())["records"] == before
        return before

    return rerun


@pytest.fixture
def migrate_runs() -> Any:
    """scripts/migrate_runs.py as a module: what brings folders of cape 0.1's lab to the files
    the lab reads."""
    path = _HERE.parents[1] / "scripts" / "migrate_runs.py"
    spec = importlib.util.spec_from_file_location("migrate_runs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
