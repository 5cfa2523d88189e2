"""Packaging: one version, the extras that `cape` names when a lab module is missing, and the
wheel, installed into an empty virtualenv that holds only torch, where the README's first
example runs (slow: installing torch there takes most of a minute)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import cape
from cape.lab import arguments, cli

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def test_version_is_the_installed_distributions() -> None:
    assert cape.__version__ == importlib.metadata.version("cape")


def _extras() -> dict[str, set[str]]:
    """pyproject's extras -> the distributions each installs, self-references expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    raw = {k: [Requirement(r) for r in v] for k, v in project["optional-dependencies"].items()}

    def expand(extra: str) -> set[str]:
        names = set()
        for req in raw[extra]:
            if canonicalize_name(req.name) == project["name"]:
                names |= set().union(*(expand(e) for e in req.extras))
            else:
                names.add(canonicalize_name(req.name))
        return names

    return {extra: expand(extra) for extra in raw}


def test_each_lab_module_is_installed_by_the_extra_the_cli_names() -> None:
    extras, dists = _extras(), importlib.metadata.packages_distributions()
    assert {"lab", "speech", "translation", "plot", "docs", "test"} <= set(extras)
    assert extras["speech"] >= extras["lab"] and "jiwer" in extras["speech"]
    for module, extra in arguments._EXTRA_OF_MODULE.items():
        if module in dists:  # tomli: installed only before Python 3.11
            assert {canonicalize_name(d) for d in dists[module]} & extras[extra], (module, extra)


@pytest.mark.parametrize("module, extra", [("PIL", "lab"), ("jiwer", "speech")])
def test_cli_names_the_extra_of_a_missing_module(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], module: str, extra: str
) -> None:
    def missing(args: object, rest: object) -> int:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    monkeypatch.setattr(cli, "_app", missing)  # main() reads it when it builds the parser
    assert cli.main(["demo"]) == 1
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    assert len(lines) == 1 and repr(module) in lines[0], lines
    assert f'pip install "cape[{extra}]"' in lines[0]


def test_cli_calls_a_module_no_extra_installs_unexpected(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing module of cape itself is a bug, not an extra to install: one line that says
    so (exit 1), and its traceback with --debug."""

    def missing(args: object, rest: object) -> int:
        raise ModuleNotFoundError("No module named 'cape.lab.gone'", name="cape.lab.gone")

    monkeypatch.setattr(cli, "_app", missing)
    assert cli.main(["demo"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unexpected ModuleNotFoundError" in err[0], err
    assert "pip install" not in err[0] and "--debug" in err[0]
    assert cli.main(["--debug", "demo"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "cape.lab.gone" in err


# --- the wheel in an empty virtualenv (slow: installing torch takes most of a minute) ---------


def _run(args: list[str | Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # torch 2.13 warns at import that it cannot initialise NumPy when numpy is absent (as in
    # a library-only install): torch's two lines, not cape's, so they are filtered out here
    env["PYTHONWARNINGS"] = "ignore:Failed to initialize NumPy:UserWarning"
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def wheel_env() -> Iterator[dict]:
    """The wheel built from a copy of the sources, and a fresh virtualenv holding torch (the
    same CPU build as here) and that wheel. Its own temporary folder: pytest's numbered ones
    are deleted by other pytest sessions running at the same time."""
    tmp = Path(tempfile.mkdtemp(prefix="cape-wheel-"))
    stage, venv_python, seconds = tmp / "stage", tmp / "venv/bin/python", {}
    shutil.copytree(SRC, stage / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, stage / name)

    def step(name: str, *args: str | Path) -> None:
        start = time.perf_counter()
        run = _run(list(args), tmp)
        seconds[name] = round(time.perf_counter() - start, 1)
        assert run.returncode == 0, f"{name}: {run.stderr[-3000:]}"

    try:
        build = "pip wheel -q --no-deps --no-build-isolation".split()
        step("wheel", sys.executable, "-m", *build, "-w", tmp / "dist", stage)
        (wheel,) = (tmp / "dist").glob("cape-*.whl")
        step("venv", sys.executable, "-m", "venv", tmp / "venv")
        # the exact torch installed here (2.13.0+cpu): a plain torch requirement pulls CUDA
        step("torch", venv_python, "-m", "pip", "install", "-q", f"torch=={version('torch')}")
        step("cape", venv_python, "-m", "pip", "install", "-q", wheel)
        print(f"\nthe wheel's virtualenv, seconds per step: {seconds}")
        yield {"tmp": tmp, "wheel": wheel, "python": venv_python, "seconds": seconds}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def wheel_metadata() -> Iterator[str]:
    """The METADATA of a wheel built (as `wheel_env` builds it, without the virtualenv: a few
    seconds) from a copy of the sources."""
    tmp = Path(tempfile.mkdtemp(prefix="cape-metadata-"))
    try:
        stage = tmp / "stage"
        shutil.copytree(
            SRC, stage / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy2(ROOT / name, stage / name)
        build = "pip wheel -q --no-deps --no-build-isolation".split()
        run = _run([sys.executable, "-m", *build, "-w", tmp / "dist", stage], tmp)
        assert run.returncode == 0, run.stderr[-3000:]
        (wheel,) = (tmp / "dist").glob("cape-*.whl")
        with zipfile.ZipFile(wheel) as whl:
            (metadata,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
            yield whl.read(metadata).decode()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_wheel_metadata_names_licence_urls_and_classifiers(wheel_metadata: str) -> None:
    """What `pip show -v cape` and an index page show: the licence (a PEP 639 expression:
    setuptools refuses a "License ::" classifier next to it) and its classifiers; no project
    URLs until the project has public ones (a placeholder address would mislead)."""
    text = wheel_metadata
    assert re.search(r"^License-Expression: MIT$", text, re.M)
    assert re.search(r"^License-File: LICENSE$", text, re.M)
    urls = re.findall(r"^Project-URL: (.*)$", text, re.M)
    assert not [u for u in urls if "example.com" in u]
    classifiers = set(re.findall(r"^Classifier: (.*)$", text, re.M))
    requires = re.search(r"^Requires-Python: >=3\.(\d+)$", text, re.M)
    assert requires is not None
    python = {
        c for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert f"Programming Language :: Python :: 3.{requires.group(1)}" in python  # the oldest
    assert f"Programming Language :: Python :: 3.{sys.version_info.minor}" in python  # this one
    assert {
        "Programming Language :: Python :: 3",
        "Operating System :: OS Independent",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Typing :: Typed",
    } <= classifiers
    assert not any(c.startswith("License ::") for c in classifiers)


@pytest.mark.slow
def test_wheel_ships_py_typed_license_and_needs_torch_only(wheel_env: dict) -> None:
    with zipfile.ZipFile(wheel_env["wheel"]) as whl:
        names = whl.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        text = whl.read(metadata).decode()
        licenses = [n for n in names if re.search(r"\.dist-info/licenses/LICENSE$", n)]
        assert licenses and whl.read(licenses[0]) == (ROOT / "LICENSE").read_bytes()
    assert "cape/py.typed" in names and "cape/lab/cli.py" in names
    assert "License-Expression: MIT" in text
    requires = re.findall(r"^Requires-Dist: (.*)$", text, re.M)
    assert [r for r in requires if "extra ==" not in r] == ["torch>=2.1"]
    assert set(re.findall(r"^Provides-Extra: (.*)$", text, re.M)) == set(_extras())


def _closure(site: Path, root: str) -> set[str]:
    """The distribution and everything it requires (markers evaluated for this Python)."""
    dists = {
        canonicalize_name(d.metadata["Name"]): d
        for d in importlib.metadata.distributions(path=[str(site)])
    }
    found, todo, env = set(), [canonicalize_name(root)], default_environment()
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for req in map(Requirement, dists[name].requires or []):
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                todo.append(canonicalize_name(req.name))
    return found


@pytest.mark.slow
def test_wheel_venv_holds_torch_and_cape_only(wheel_env: dict) -> None:
    run = _run([wheel_env["python"], "-m", "pip", "list", "--format=json"], wheel_env["tmp"])
    installed = {canonicalize_name(p["name"]) for p in json.loads(run.stdout)}
    (site,) = (wheel_env["tmp"] / "venv/lib").glob("python3*/site-packages")
    torch_deps = _closure(site, "torch")
    assert installed == torch_deps | {"cape", "pip", "setuptools"}
    lab = _extras()["lab"] | _extras()["speech"] | _extras()["translation"] | _extras()["plot"]
    assert installed & lab <= torch_deps  # filelock is one of torch's own requirements
    assert not any(n.startswith("nvidia") for n in installed)


@pytest.mark.slow
def test_readme_first_example_runs_with_torch_alone(wheel_env: dict) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    example = wheel_env["tmp"] / "example.py"
    example.write_text(blocks[0])
    run = _run([wheel_env["python"], example], wheel_env["tmp"])
    assert run.returncode == 0 and run.stderr == "", run.stderr[-3000:]


@pytest.mark.slow
def test_wheel_version_and_cli_without_the_lab(wheel_env: dict) -> None:
    python, tmp = wheel_env["python"], wheel_env["tmp"]
    code = "import cape, importlib.metadata as m; print(cape.__version__, m.version('cape'))"
    run = _run([python, "-c", code], tmp)
    assert run.stdout.split() == [cape.__version__, cape.__version__], run.stderr
    cape_cmd = python.parent / "cape"
    zero = "--train 0 --val 0 --test 0 --native 0".split()  # renders nothing if it ever runs
    run = _run([cape_cmd, "data", "chars", "--root", tmp / "chars", *zero], tmp)
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stdout + run.stderr
    assert 'pip install "cape[lab]"' in lines[0]
    run = _run([cape_cmd, "encodings"], tmp)  # the library's own listing needs no extra
    assert run.returncode == 0 and "cape1d" in run.stdout, run.stderr
