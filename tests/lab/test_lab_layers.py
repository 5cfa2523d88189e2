"""Imports inside the lab go one way: the data modules use only the library and the lab-level
utilities (io, progress, ...), never the engine, reports, benchmarks or experiments; experiments
never import a benchmark; one module wraps tqdm. Every import counts, those inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cape.lab

LAB = Path(cape.lab.__file__).parent
NOT_FOR_DATA = ("train", "report", "bench", "experiments", "viz", "apps", "cli")


def _imports(path: Path) -> set[str]:
    """Absolute names of the modules `path` imports (relative imports resolved)."""
    package = "cape.lab." + ".".join(path.relative_to(LAB).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names.add(module)
            names |= {f"{module}.{a.name}" for a in node.names}  # `from cape.lab import train`
    return names


def _under(module: str, parts: tuple[str, ...]) -> bool:
    return any(module == f"cape.lab.{p}" or module.startswith(f"cape.lab.{p}.") for p in parts)


def _offences(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    files = sorted((LAB / folder).rglob("*.py"))
    assert files, f"no modules under {LAB / folder}"
    return [
        f"{p.relative_to(LAB)} imports {m}"
        for p in files
        for m in sorted(_imports(p))
        if _under(m, forbidden)
    ]


def test_data_depends_only_on_the_library_and_lab_utilities() -> None:
    assert _offences("data", NOT_FOR_DATA) == []


def test_experiments_do_not_import_benchmarks() -> None:
    assert _offences("experiments", ("bench",)) == []


def test_only_the_progress_module_uses_tqdm() -> None:
    users = [
        str(p.relative_to(LAB))
        for p in sorted(LAB.rglob("*.py"))
        if any(m == "tqdm" or m.startswith("tqdm.") for m in _imports(p))
    ]
    assert users == ["progress.py"]


@pytest.mark.parametrize(
    ("source", "where", "found"),
    [
        ("from cape.lab.train.logging import progress", "data/x/mod.py", True),
        ("def f():\n    from ...report import write_json", "data/x/mod.py", True),
        ("from cape.lab import bench", "data/x/mod.py", True),
        ("from cape.lab.io import write_json\nfrom ..speech import corpus", "data/x/mod.py", False),
    ],
)
def test_scan_sees_lazy_relative_and_package_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, where: str, found: bool
) -> None:
    path = tmp_path / where
    path.parent.mkdir(parents=True)
    path.write_text(source, encoding="utf-8")
    monkeypatch.setattr(f"{__name__}.LAB", tmp_path)
    assert bool(_offences("data", NOT_FOR_DATA)) == found
