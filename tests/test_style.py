"""The code's habits, checked where the tests run (the README's test command and CI): `ruff
check` (lint, imports, lines of at most 100 columns) and `ruff format --check` are clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["src", "tests", "scripts"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: it comes with the `test` extra (scripts/setup.sh)")
    return subprocess.run([exe, *args, *PATHS], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_is_clean() -> None:
    result = _ruff("check", "--output-format", "concise")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_applied() -> None:
    result = _ruff("format", "--check")
    assert result.returncode == 0, "run `ruff format src tests scripts`:\n" + result.stdout


def test_long_lines_are_not_ignored() -> None:
    """The line length is enforced, not switched off (E501 is checked)."""
    result = _ruff("check", "--select", "E501", "--output-format", "concise")
    assert result.returncode == 0, result.stdout
    config = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "E501" not in config.split("[tool.ruff")[1], "pyproject must not ignore E501"
