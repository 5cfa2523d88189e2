"""Write the shared verdict into the three archived reports that have no results.json.

vision-lff, lff-boxes-cpu-full and lff-generation-cpu-full were archived before results.json
existed, so `cape plot` cannot redraw them. Their main tables still hold each row's mean ± std
over the seeds the report names. This reads that table, builds the shared verdict's `Study`
from it (each cell: mean, std, n = the number of seeds), and writes the verdict lines
(`cape.lab.experiments.verdict.verdict`) as a "## Verdict" section before the report's first
table. Running it again replaces the section.

    PYTHONPATH=src python scripts/verdict_from_tables.py results/lff-boxes-cpu-full/report.md
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from cape.lab.experiments.verdict import Study, verdict

NOTE = (
    "*This archive has no results.json: the verdict is written by the shared code from the "
    "table below (`scripts/verdict_from_tables.py`).*"
)

# per archive: the main table's header start, column -> study column, and the Study's settings
SPECS: dict[str, dict[str, Any]] = {
    "lff-boxes-cpu-full": {
        "header": "| row | encoding params | seen % | unseen % |",
        "columns": {"seen %": "test_seen", "unseen %": "test_unseen"},
        "seeds": 3,
        "study": dict(
            train="test_seen",
            unseen=["test_unseen"],
            metric="answer accuracy",
            label=lambda s: {"test_seen": "seen", "test_unseen": "unseen"}[s] + " coordinates",
            pairs=[("CAPE's augmentation", [("CAPE Sine-4D", "Sine-4D")], " (not augmented)")],
            pair_unit="accuracy points (positive: better)",
        ),
    },
    "lff-generation-cpu-full": {
        "header": "| row | pixel encoding | bits/dim (mean ± std) |",
        "columns": {"bits/dim (mean ± std)": "final"},
        "seeds": 3,
        "study": dict(
            train="final",
            unseen=["final"],
            label=lambda _: "the end of training",
            metric="held-out bits per dim",
            unit=" bpd",
            higher=False,
            digits=4,
        ),
    },
    "vision-lff": {
        "header": "| row | 24 px | 32 px | 56 px | 96 px |",
        "columns": {"24 px": 24, "32 px": 32, "56 px": 56, "96 px": 96},
        "seeds": 1,
        "study": dict(
            train=32, unseen=[24, 56, 96], label=lambda s: f"{s} px", metric="top-1 accuracy"
        ),
    },
}
NOPOS = {"No position", "nopos"}  # rows without positions, by their report names


def cell(text: str, seeds: int) -> dict[str, Any] | None:
    """ "**82.4 ± 7.0**" -> {"mean": 82.4, "std": 7.0, "n": seeds}; "40.6" -> std 0."""
    parts = [p.strip() for p in text.replace("**", "").split("±")]
    try:
        mean, std = float(parts[0]), float(parts[1]) if len(parts) > 1 else 0.0
    except ValueError:
        return None
    return {"mean": mean, "std": std, "n": seeds}


def main_table(lines: list[str], header: str) -> list[list[str]]:
    """The rows (cells split) of the first table whose header line starts with `header`."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    out = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        out.append([c.strip() for c in line.strip().strip("|").split("|")])
    return out


def study_of(name: str, lines: list[str]) -> Study:
    spec = SPECS[name]
    head, _, *body = main_table(lines, spec["header"])
    rows, cells = [], {}
    for values in body:
        row = values[0]
        rows.append({"name": row, "position": "nopos" if row in NOPOS else row})
        for title, column in spec["columns"].items():
            got = cell(values[head.index(title)], spec["seeds"])
            if got is not None:
                cells[(row, column)] = got
    columns = list(spec["columns"].values())
    return Study(rows=rows, cells=cells, columns=columns, **spec["study"])


def with_verdict(text: str, lines: list[str]) -> str:
    """`text` with its "## Verdict" section (replaced if there) before the first table."""
    text = text.replace(f"{NOTE}\n\n", "")
    text = re.sub(r"## Verdict\n.*?(?=\n\*|\n\|)", "", text, flags=re.S).replace("\n\n\n", "\n\n")
    section = "## Verdict\n\n" + "\n".join(f"- {line}" for line in lines) + f"\n\n{NOTE}\n\n"
    at = min(text.index("\n*") + 1, text.index("\n|") + 1)
    return text[:at] + section + text[at:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", type=Path, nargs="+")
    for path in p.parse_args().report:
        name = path.parent.name
        text = path.read_text(encoding="utf-8")
        lines = verdict(study_of(name, text.splitlines()))
        path.write_text(with_verdict(text, lines), encoding="utf-8")
        print(f"{path}: {len(lines)} verdict lines")


if __name__ == "__main__":
    main()
