"""Carry a re-archived report's rows into the docs tables copied from it.

Every docs table marked `<!-- from results/NAME/report.md -->` copies rows of that report
(tests/lab/test_docs.py checks each row is there). After a report is regenerated, a copied row
is found in the report as it was (`git show REV:results/NAME/report.md`), by its table and row
name, and replaced by the same table's row of that name in the report as it is now. Rows whose
table or name is gone are listed, not guessed.

    python scripts/sync_docs_tables.py results/vision-quick/report.md [--rev HEAD] [--dry-run]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def tables(text: str) -> list[list[str]]:
    """The markdown tables of a report, each as its lines (header, rule, rows)."""
    out: list[list[str]] = []
    current: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line.strip())
        elif current:
            out.append(current)
            current = []
    return out


def row_name(line: str) -> str:
    return line.strip().strip("|").split("|")[0].strip()


def locate(line: str, old: list[list[str]]) -> tuple[int, str] | None:
    """(table index, row name) of `line` in the old report's tables."""
    for i, table in enumerate(old):
        if line.strip() in table[2:]:
            return i, row_name(line)
    return None


def sync(report: Path, rev: str, dry_run: bool) -> list[str]:
    rel = report.resolve().relative_to(ROOT).as_posix()
    before = subprocess.run(
        ["git", "show", f"{rev}:{rel}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    old, new = tables(before), tables(report.read_text(encoding="utf-8"))
    marker = re.compile(rf"<!-- from {re.escape(rel)} -->\n((?:[ \t]*\|.*\n)+)")
    problems = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")

        def replace(match: re.Match[str], page: Path = page) -> str:
            lines = match.group(1).splitlines()
            for j, line in enumerate(lines[2:], start=2):
                where = locate(line, old)
                if where is None:
                    continue  # already the new report's row, or never from it
                index, name = where
                rows = [r for r in (new[index] if index < len(new) else [])[2:]]
                found = [r for r in rows if row_name(r) == name]
                if len(found) != 1:
                    problems.append(f"{page.relative_to(ROOT)}: no single row {name!r}")
                    continue
                lines[j] = found[0]
            return match.group(0).replace(match.group(1), "\n".join(lines) + "\n")

        updated = marker.sub(replace, text)
        if updated != text:
            print(f"{page.relative_to(ROOT)}: tables from {rel} updated")
            if not dry_run:
                page.write_text(updated, encoding="utf-8")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", type=Path)
    p.add_argument("--rev", default="HEAD", help="the commit whose report the docs copied")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args()
    problems = [msg for r in args.reports for msg in sync(r, args.rev, args.dry_run)]
    for msg in problems:
        print("left as it was:", msg, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
