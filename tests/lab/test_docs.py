"""The README and the documentation site (docs/, mkdocs.yml) hold what they claim.

- every ```python block of README.md and of docs/**/*.md runs;
- every public name has an example in one of those blocks;
- every results table marked `<!-- from results/<run>/report.md -->` on the line before it has
  each of its rows in that generated report, so no figure is typed in by hand;
- `mkdocs build --strict` succeeds (slow);
- `cape plot` redraws every archived report in results/ byte for byte (slow).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
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

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# A fence may be indented (inside a list item): its body is dedented by the fence's indent.
_PYTHON_BLOCK = re.compile(r"^([ \t]*)```python\n(.*?)^\1```[ \t]*$", flags=re.S | re.M)
BLOCKS = [
    (_rel(page), index, textwrap.dedent(m.group(2)))
    for page in PAGES
    for index, m in enumerate(_PYTHON_BLOCK.finditer(page.read_text(encoding="utf-8")))
]
CODE = "\n".join(code for _, _, code in BLOCKS)


# an import in a block that a library-only install (`pip install cape`) lacks
_NEEDS_LAB = re.compile(
    r"^\s*(?:from|import)\s+(?:cape\.lab|numpy|yaml|PIL|matplotlib|scipy|tqdm|safetensors)\b",
    flags=re.M,
)


def test_pages_whose_examples_need_the_lab_say_so() -> None:
    """A reader who installed the library alone runs a block that imports the lab: the page says
    once, near the block, what to install."""
    lab_pages = sorted({page for page, _, code in BLOCKS if _NEEDS_LAB.search(code)})
    assert lab_pages  # the check checks something
    silent = [
        page
        for page in lab_pages
        if 'pip install "cape[lab]"' not in (ROOT / page).read_text(encoding="utf-8")
    ]
    assert not silent, (
        f'pages with lab examples that do not say `pip install "cape[lab]"`: {silent}'
    )


def test_pages_have_examples() -> None:
    assert any(page == "README.md" for page, _, _ in BLOCKS), "README.md has no ```python example"
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize(
    ("page", "index", "code"), BLOCKS, ids=[f"{page}[{index}]" for page, index, _ in BLOCKS]
)
def test_python_block_runs(
    page: str, index: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    exec(compile(code, f"{page}[python block {index}]", "exec"), {})


def _has_example(name: str, prefix: str = "") -> bool:
    return re.search(rf"{re.escape(prefix)}\b{re.escape(name)}\b", CODE) is not None


# (module shown in the message, names): every name must appear in some executed block
_PUBLIC = [
    ("cape", cape.__all__),
    ("cape.models", cape.models.__all__),
    ("cape.lab.data", cape.lab.data.__all__),
    ("cape.lab.train", cape.lab.train.__all__),
    ("cape.lab.report", cape.lab.report.__all__),
    ("cape.lab.viz", cape.lab.viz.__all__),
    ("cape.lab.experiments", cape.lab.experiments.__all__),
    ("cape.lab.bench", cape.lab.bench.__all__),
    ("cape.lab.apps.transcribe", cape.lab.apps.transcribe.__all__),
    ("cape.lab.apps.translate", cape.lab.apps.translate.__all__),
]
_NAMES = [(module, name) for module, names in _PUBLIC for name in names]


@pytest.mark.parametrize(("module", "name"), _NAMES, ids=[f"{m}.{n}" for m, n in _NAMES])
def test_public_name_has_an_example(module: str, name: str) -> None:
    assert _has_example(name), f"{module}.{name} has no example in README.md or docs/"


@pytest.mark.parametrize("name", cape.functional.__all__)
def test_functional_name_has_an_example(name: str) -> None:
    # the examples call the maths as `F.name` (import cape.functional as F)
    assert re.search(rf"\bF\.{re.escape(name)}\b", CODE), (
        f"cape.functional.{name} has no `F.{name}` example in README.md or docs/"
    )


_SOURCED = [
    (_rel(page), source, table)
    for page in PAGES
    for source, table in re.findall(
        r"<!-- from (\S+) -->\n((?:[ \t]*\|.*\n)+)", page.read_text(encoding="utf-8")
    )
]


def test_experiment_pages_have_sourced_tables() -> None:
    pages = {page for page, _, _ in _SOURCED}
    for page in sorted((ROOT / "docs" / "experiments").glob("*.md")):
        if page.name != "index.md":
            assert _rel(page) in pages, f"{_rel(page)} has no table marked <!-- from ... -->"


@pytest.mark.parametrize(
    ("page", "source", "table"),
    _SOURCED,
    ids=[f"{page}:{source}:{i}" for i, (page, source, _) in enumerate(_SOURCED)],
)
def test_results_come_from_generated_reports(page: str, source: str, table: str) -> None:
    assert source.startswith("results/"), f"{page}: a table's source must be in results/: {source}"
    report = (ROOT / source).read_text(encoding="utf-8").splitlines()
    for line in table.splitlines()[2:]:  # header and rule may be shortened
        assert line.strip() in report, f"{page}: row not in {source}: {line.strip()}"


def _hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "scripts/mkdocs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_links_into_results_are_rewritten() -> None:
    hooks = _hooks()
    docs = ROOT / "docs"
    page = docs / "experiments" / "x.md"
    text = (
        "![plot](../../results/asr-quick/wer.png) [r](../../results/asr-quick/report.md#cost) "
        "[guide](../guides/text.md) [web](https://example.org/a.md) [log](../../CHANGELOG.md)"
    )
    assert hooks.rewrite_links(text, page, "experiments/x.md", docs) == (
        "![plot](../results/asr-quick/wer.png) [r](../results/asr-quick/report.md#cost) "
        "[guide](../guides/text.md) [web](https://example.org/a.md) [log](../changelog.md)"
    )
    # a page at the top of docs/, and a mounted report linking its own plot
    assert (
        hooks.rewrite_links("[b](../results/bench/encodings.md)", docs / "cost.md", "cost.md", docs)
        == "[b](results/bench/encodings.md)"
    )
    report = ROOT / "results" / "asr-quick" / "report.md"
    assert (
        hooks.rewrite_links("![w](wer.png)", report, "results/asr-quick/report.md", docs)
        == "![w](wer.png)"
    )


def test_docstring_argument_lines_render_as_a_list() -> None:
    """The API pages: a docstring's `name: meaning` lines, one a line, are a list (the griffe
    extension of mkdocs_hooks), not one paragraph as Markdown would join them."""
    import inspect

    import markdown

    hooks = _hooks()
    doc = inspect.cleandoc(cape.Augmentation.__doc__)
    assert "\nmax_global_shift: " in doc and "\nmax_local_shift: " in doc
    html = markdown.markdown(doc)
    assert "<li>" not in html  # as written: one paragraph
    text = hooks.argument_lists(doc)
    assert hooks.argument_lists(text) == text  # idempotent
    html = markdown.markdown(text)
    assert html.startswith("<p>CAPE's augmentation settings, validated once.</p>")
    items = [i.split("</code>")[0] for i in html.split("<li><code>")[1:]]
    assert items == ["max_global_shift", "max_local_shift", "max_global_scaling", "normalize"]
    # a continuation line stays in its item; a paragraph before the run stays one; one
    # `name:` line alone and code are left as they are
    text = hooks.argument_lists(
        "Intro.\nx: first,\n  wrapped.\ny: second.\n\nNote: one alone.\n\n"
        "```python\na: 1\nb: 2\n```\n\n    c: 3\n    d: 4"
    )
    assert text == (
        "Intro.\n\n- `x`: first,\n  wrapped.\n- `y`: second.\n\nNote: one alone.\n\n"
        "```python\na: 1\nb: 2\n```\n\n    c: 3\n    d: 4"
    )


def test_cli_reference_covers_every_command() -> None:
    pages = dict(_hooks().cli_help_pages())
    expected = [
        "cape",
        "cape experiment",
        "cape train",
        "cape eval",
        "cape plot",
        "cape transcribe",
        "cape translate",
        "cape generate",
        "cape extend",
        "cape demo",
        "cape encodings",
        "cape bench",
        "cape data",
    ]
    expected += [
        f"cape bench {w}"
        for w in (
            "encodings",
            "slowdown",
            "throughput",
            "train",
            "gpu",
            "rotary",
            "deploy",
            "decode",
        )
    ]
    expected += [f"cape data {w}" for w in ("chars", "speech", "translation", "text")]
    assert sorted(pages) == sorted(expected)
    for command, text in pages.items():
        assert text.startswith(f"usage: {command} "), f"{command}: {text[:200]}"


@pytest.mark.slow
def test_site_builds_strict(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    site = tmp_path / "site"
    assert (site / "reference" / "cli" / "index.html").read_text().count("usage: cape") >= 17
    assert (site / "results" / "vision-quick" / "accuracy_vs_resolution.png").is_file()
    assert (site / "changelog" / "index.html").is_file()
    api = (site / "reference" / "api" / "cape" / "index.html").read_text()
    assert "<li><code>max_global_shift</code>: Dmax" in api  # argument lines as a list


# Archives without results.json, so `cape plot` has nothing to redraw them from.
NOT_REDRAWN = {
    "bench": "benchmark tables written by `cape bench`, not an experiment report",
    "extend": "the report of `cape extend` (extend.json), an app's run, not an experiment's",
    # These three were copied by hand (report.md and plots) on 2026-11-23, the day before
    # `cape plot --archive` (commit d928038) began keeping results.json with every archive;
    # the runs' results.json stayed in runs/ of that session and is lost.
    "lff-boxes-cpu-full": "report and plots only, archived before `cape plot --archive`",
    "lff-generation-cpu-full": "report and plots only, archived before `cape plot --archive`",
    "vision-lff": "report and plots only, archived before `cape plot --archive`",
}
ARCHIVES = sorted(p.name for p in (ROOT / "results").iterdir() if p.is_dir())
REDRAWN = [name for name in ARCHIVES if (ROOT / "results" / name / "results.json").is_file()]


def test_archives_without_results_are_the_known_ones() -> None:
    assert sorted(set(ARCHIVES) - set(REDRAWN)) == sorted(NOT_REDRAWN)


@pytest.mark.slow
@pytest.mark.parametrize("name", REDRAWN)
def test_plot_redraws_archived_report(name: str, tmp_path: Path) -> None:
    from cape.lab.cli import main

    archive = ROOT / "results" / name
    copy = tmp_path / name
    shutil.copytree(archive, copy)
    assert main(["plot", str(copy)]) == 0
    assert (copy / "report.md").read_bytes() == (archive / "report.md").read_bytes()


# a verdict line copied from an archived report: `<!-- verdict from results/<run>/report.md -->`
# on the line before it
_VERDICT_MARK = re.compile(r"^<!-- verdict from (results/[^ ]+/report\.md) -->$")
EXPERIMENT_PAGES = sorted((ROOT / "docs" / "experiments").glob("*.md"))
# pages with no archived report to quote a verdict from (none now: every default is archived)
NO_VERDICT: set[str] = set()


def _first_verdict_line(report: Path) -> str:
    lines = report.read_text(encoding="utf-8").splitlines()
    start = lines.index("## Verdict")  # ValueError: the report has no verdict
    return next(line for line in lines[start + 1 :] if line.startswith("- "))


def _verdict_lines(page: Path) -> list[tuple[str, str]]:
    lines = page.read_text(encoding="utf-8").splitlines()
    return [
        (m.group(1), lines[i + 1])
        for i, line in enumerate(lines[:-1])
        if (m := _VERDICT_MARK.match(line))
    ]


@pytest.mark.parametrize("page", EXPERIMENT_PAGES, ids=[p.name for p in EXPERIMENT_PAGES])
def test_pages_state_the_verdict_of_their_archived_report(page: Path) -> None:
    """Each experiment page, and the index for each of them, states the verdict in one line: the
    first verdict line of the archived report it names, word for word."""
    found = _verdict_lines(page)
    if page.name not in NO_VERDICT:
        assert found, f"{_rel(page)} states no verdict (`<!-- verdict from results/... -->`)"
    if page.name == "index.md":
        pages = [p for p in EXPERIMENT_PAGES if p.name != "index.md"]
        named = {run for p in pages for run, _ in _verdict_lines(p)}
        assert {run for run, _ in found} == named, "the index states another set of verdicts"
    for report, line in found:
        first = _first_verdict_line(ROOT / report)
        assert line.startswith("- ") and line.endswith(first[2:]), (
            f"{_rel(page)}: the verdict line differs from the first of {report}:\n{first}"
        )
