"""mkdocs hooks of the documentation site (mkdocs.yml `hooks:`).

- The archived results (results/<run>/: reports, plots, benchmark tables) live outside docs/ so
  that `cape plot --archive` writes them where the tests read them; they are mounted into the
  site at results/, and links that leave docs/ for them (or for CHANGELOG.md) are rewritten to
  their place in the site, so a page reads the same on GitHub and on the site.
- CHANGELOG.md becomes the page changelog.md.
- The page holding `CLI_MARKER` gets, in its place, the `--help` of `cape` and of every
  subcommand, captured from the parser (`cape.lab.cli.main`), never retyped.
- `ArgumentLists`, a griffe extension (mkdocs.yml, mkdocstrings' `extensions`), turns the runs
  of `name: meaning` lines of the docstrings (their arguments and fields, one a line) into
  markdown lists (`argument_lists`): rendered as text they would run into one paragraph.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import re
from pathlib import Path

from griffe import Extension
from mkdocs.structure.files import File, Files, InclusionLevel

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
MOUNTED_SUFFIXES = (".md", ".png", ".csv")  # reports, plots, benchmark tables; not run records
CHANGELOG = ROOT / "CHANGELOG.md"
CLI_MARKER = "<!-- generated: cape --help of every command -->"
HELP_COLUMNS = "100"  # argparse wraps to $COLUMNS: fix it so the page does not depend on a terminal

# `name: meaning`: a name (an identifier, dotted or indexed, maybe in backticks, maybe with a
# parenthesised note: "positions (optional)") then ": " and text
_ARGUMENT = re.compile(r"^(`?)([A-Za-z_][\w.]*(?:\[[^\]\s]*\])?)\1((?: \([^)]*\))?): (\S.*)$")
_FENCE = re.compile(r"^\s*(```|~~~)")

_LINK = re.compile(r"(\]\()(<?)([^)\s>]+)(>?(?:\s+\"[^\"]*\")?\))")


def _paragraph_as_list(lines: list[str]) -> list[str]:
    """One paragraph (no blank line inside): when two or more of its lines are `name: meaning`
    lines, those lines and the ones after (continuations, kept in their item) become a list,
    after the lines before the first (their own paragraph); else the paragraph unchanged."""
    starts = [i for i, line in enumerate(lines) if _ARGUMENT.match(line)]
    if len(starts) < 2:
        return lines
    out = lines[: starts[0]]
    if out:
        out.append("")  # a list after a paragraph needs a blank line (Python-Markdown)
    for line in lines[starts[0] :]:
        m = _ARGUMENT.match(line)
        if m:
            out.append(f"- `{m.group(2)}`{m.group(3)}: {m.group(4)}")
        else:
            out.append("  " + line.strip())
    return out


def argument_lists(text: str) -> str:
    """Docstring markdown with each run of `name: meaning` lines as a list ("- `name`: ..."):
    a paragraph holding two or more such lines (at the start of the line, not indented) gets
    them as items, a line after an item that is not one continuing it. Code (fenced, indented
    or a >>> session) is left as it is. Idempotent: a list item is not a `name:` line."""
    out: list[str] = []
    paragraph: list[str] = []
    fenced = False

    def flush() -> None:
        code = paragraph and (paragraph[0].startswith(("    ", "\t")) or ">>>" in paragraph[0])
        out.extend(paragraph if code else _paragraph_as_list(paragraph))
        paragraph.clear()

    for line in text.split("\n"):
        if _FENCE.match(line) or fenced:
            if not fenced:
                flush()
            if _FENCE.match(line):
                fenced = not fenced
            out.append(line)
        elif line.strip():
            paragraph.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out)


class ArgumentLists(Extension):
    """griffe extension: every docstring through `argument_lists` before it is rendered."""

    def on_object(self, *, obj, **kwargs) -> None:  # noqa: ANN001 (griffe's Object)
        if obj.docstring is not None:
            obj.docstring.value = argument_lists(obj.docstring.value)


def on_files(files: Files, config) -> Files:
    for path in sorted(RESULTS.rglob("*")):
        if path.is_file() and path.suffix in MOUNTED_SUFFIXES:
            uri = path.relative_to(ROOT).as_posix()  # results/<run>/...
            files.append(
                File.generated(
                    config, uri, abs_src_path=str(path), inclusion=InclusionLevel.NOT_IN_NAV
                )
            )
    files.append(File.generated(config, "changelog.md", abs_src_path=str(CHANGELOG)))
    return files


def _site_uri(target: Path) -> str | None:
    """Where a repository file outside docs/ is in the site, or None if it is not mounted."""
    if target == CHANGELOG:
        return "changelog.md"
    if target.is_relative_to(RESULTS):
        return target.relative_to(ROOT).as_posix()
    return None


def rewrite_links(markdown: str, source: Path, src_uri: str, docs_dir: Path) -> str:
    """Rewrite relative links of the page at `source` (its real file) that leave docs_dir for a
    mounted file into links to that file's place in the site, relative to the page's `src_uri`."""
    page_dir = posixpath.dirname(src_uri)

    def fix(m: re.Match) -> str:
        target = m.group(3)
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):  # URL, anchor or site-absolute
            return m.group(0)
        path, _, anchor = target.partition("#")
        real = Path(os.path.normpath(source.parent / path))
        if real.is_relative_to(docs_dir):
            return m.group(0)
        uri = _site_uri(real)
        if uri is None:
            return m.group(0)  # mkdocs --strict names it
        new = posixpath.relpath(uri, page_dir or ".") + (f"#{anchor}" if anchor else "")
        return f"{m.group(1)}{m.group(2)}{new}{m.group(4)}"

    return _LINK.sub(fix, markdown)


def _capture(argv: list[str]) -> tuple[int, str]:
    """Run `cape ARGV` in this process: (exit code, stdout + stderr)."""
    from cape.lab.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as stop:  # argparse's --help exits 0, a usage error 2
            code = stop.code if isinstance(stop.code, int) else 1
    return code, out.getvalue()


def _subcommands(top_help: str) -> list[str]:
    """The subcommand names listed under COMMAND in `cape --help`."""
    section = top_help.split("COMMAND\n", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^    (\S+)", section, flags=re.M)


def _first_choices(name: str) -> list[str]:
    """The choices of the first argument of subcommand `name` (`cape bench WHAT`), or []."""
    import argparse

    from cape.lab.cli import _parser

    (sub,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for action in sub.choices[name]._actions:
        if not action.option_strings and action.choices:
            return list(action.choices)
    return []


def cli_help_pages() -> list[tuple[str, str]]:
    """(command, its --help text) for `cape` and every subcommand; a subcommand that takes a
    choice first (`cape bench WHAT`) is followed by one entry per choice."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        code, top = _capture(["--help"])
        if code != 0:
            raise RuntimeError(f"`cape --help` exited {code}:\n{top}")
        pages = [("cape", top)]
        for name in _subcommands(top):
            for argv in ([name], *([name, what] for what in _first_choices(name))):
                code, text = _capture([*argv, "--help"])
                if code != 0:
                    raise RuntimeError(f"`cape {' '.join(argv)} --help` exited {code}:\n{text}")
                pages.append((" ".join(["cape", *argv]), text))
        return pages
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved


def cli_reference() -> str:
    parts = []
    for command, text in cli_help_pages():
        parts.append(f"### `{command}`\n\n```text\n{text.rstrip()}\n```\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    source = Path(page.file.abs_src_path)
    return rewrite_links(markdown, source, page.file.src_uri, Path(config["docs_dir"]).resolve())
