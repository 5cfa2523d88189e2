"""The lab's tier: corpora built on the machine, training runs, reports, the command line and
the documentation. Every test here is marked `lab` and `slow`, so that `pytest -m "not slow"`
is the library's fast check (tests/library, tests/test_*.py) and the README's test command,
plain `pytest`, runs everything."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.lab)
            item.add_marker(pytest.mark.slow)
