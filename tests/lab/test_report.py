"""`cape.lab.report`: summaries against NumPy, markdown tables, JSON (`cape.lab.io`) and report.md
written atomically."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import cape.lab.io as lab_io
import cape.lab.report as report
import cape.lab.train.logging as train_logging
from cape.lab.data.speech import corpus as speech_corpus
from cape.lab.data.translation import corpus as translation_corpus
from cape.lab.report import Report, pivot, summarize, write_json, write_text


def _records(seed: int = 0) -> tuple[list[dict], dict[tuple[str, int], list[float]]]:
    """Shuffled records of 3 encodings x 4 sizes with 1..5 seeds each, and the values per group."""
    rng = np.random.default_rng(seed)
    records, truth = [], {}
    for enc in ("cape2d", "sinpos2d", "abspos2d"):
        for size in (16, 24, 32, 48):
            k = int(rng.integers(1, 6))
            vals = (rng.normal(60, 10, size=k)).tolist()
            truth[enc, size] = vals
            records += [{"row": enc, "size": size, "seed": s, "acc": v} for s, v in enumerate(vals)]
    return records, truth


def test_summarize_matches_numpy() -> None:
    records, truth = _records()
    out = summarize(records, ["row", "size"], "acc")
    assert [(c["row"], c["size"]) for c in out] == list(truth)  # first-appearance order
    for cell in out:
        vals = np.array(truth[cell["row"], cell["size"]])
        assert cell["n"] == len(vals) and cell["nan"] == 0
        assert cell["values"] == vals.tolist()
        assert cell["mean"] == pytest.approx(vals.mean(), rel=1e-12)
        expect = vals.std(ddof=1) if len(vals) > 1 else 0.0
        assert cell["std"] == pytest.approx(expect, rel=1e-12, abs=1e-12)


def test_summarize_order_is_first_appearance_and_single_std_is_zero() -> None:
    recs = [{"a": "y", "value": 2.0}, {"a": "x", "value": 1.0}, {"a": "y", "value": 4.0}]
    out = summarize(recs, ["a"])
    assert [c["a"] for c in out] == ["y", "x"]
    assert out[1] == {"a": "x", "mean": 1.0, "std": 0.0, "n": 1, "nan": 0, "values": [1.0]}
    assert out[0]["std"] == pytest.approx(math.sqrt(2.0))
    assert summarize([], ["a"]) == []
    # numpy / torch scalars are values too
    recs = [{"a": 1, "value": np.float32(1.5)}, {"a": 1, "value": torch.tensor(2.5)}]
    out = summarize(recs, ["a"])
    assert out[0]["mean"] == pytest.approx(2.0)


def test_summarize_nan_and_none_are_counted_not_averaged() -> None:
    recs = [{"k": 1, "value": v} for v in (1.0, float("nan"), 3.0, None)]
    recs += [
        {"k": 2, "value": float("nan")},
        {"k": 3, "value": float("nan")},
        {"k": 3, "value": 5.0},
    ]
    a, b, c = summarize(recs, ["k"])
    assert (a["mean"], a["std"], a["n"], a["nan"]) == (2.0, pytest.approx(math.sqrt(2)), 2, 2)
    assert len(a["values"]) == 4
    assert math.isnan(b["mean"]) and math.isnan(b["std"]) and (b["n"], b["nan"]) == (0, 1)
    assert (c["mean"], c["std"], c["n"], c["nan"]) == (5.0, 0.0, 1, 1)
    g = _grid(pivot([dict(x, col=0) for x in (a, b, c)], "k", "col"))
    assert [row[1] for row in g[2:]] == ["2.0 ± 1.4 (2 NaN)", "NaN", "**5.0 (1 NaN)**"]
    g = _grid(pivot([dict(x, col=0) for x in (a, b, c)], "k", "col", show_nan=False, best=None))
    assert [row[1] for row in g[2:]] == ["2.0 ± 1.4", "NaN", "5.0"]


def test_summarize_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="record 1 has no key 'size'"):
        summarize([{"row": "a", "size": 1, "value": 1}, {"row": "a", "value": 2}], ["row", "size"])
    with pytest.raises(ValueError, match="no key 'acc'"):
        summarize([{"row": "a"}], ["row"], "acc")
    with pytest.raises(ValueError, match="value 'value' must be a real number"):
        summarize([{"row": "a", "value": "71.2"}], ["row"])
    with pytest.raises(ValueError, match="by must be a sequence"):
        summarize([{"row": "a", "value": 1}], "row")
    with pytest.raises(ValueError, match="hashable"):
        summarize([{"row": [1], "value": 1}], ["row"])


def _cells(rows: dict[str, dict[int, list[float]]]) -> list[dict]:
    recs = [
        {"row": r, "size": s, "value": v}
        for r, d in rows.items()
        for s, vs in d.items()
        for v in vs
    ]
    return summarize(recs, ["row", "size"])


def _grid(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in table.splitlines()]


def test_pivot_layout_bold_and_missing() -> None:
    cells = _cells({"cape": {24: [70.0, 72.0], 32: [80.0]}, "sin": {24: [60.0, 61.0], 48: [50.0]}})
    table = pivot(cells, "row", "size", col_format="{} px")
    g = _grid(table)
    assert g[0] == ["row", "24 px", "32 px", "48 px"]
    assert table.splitlines()[1] == "|---|---|---|---|"
    assert g[2] == ["cape", "**71.0 ± 1.4**", "**80.0**", "–"]  # n == 1: mean only
    assert g[3] == ["sin", "60.5 ± 0.7", "–", "**50.0**"]
    g = _grid(pivot(cells, "row", "size", best="min", row_label="encoding"))
    assert g[0][0] == "encoding"
    assert g[2][1:] == ["71.0 ± 1.4", "**80.0**", "–"]
    assert g[3][1:] == ["**60.5 ± 0.7**", "–", "**50.0**"]
    g = _grid(
        pivot(cells, "row", "size", best=None, fmt="{mean:.2f} (n={n})", fmt_single="{mean:.0f}")
    )
    assert g[2][1:] == ["71.00 (n=2)", "80", "–"]
    assert not any("**" in c for row in g for c in row)


def test_pivot_orders_ties_and_escaping() -> None:
    cells = _cells({"a": {1: [5.0], 2: [1.0]}, "b": {1: [5.0], 2: [2.0]}, "c|d": {1: [4.0]}})
    g = _grid(pivot(cells, "row", "size", row_order=["b", "zzz"], col_order=[2, 1]))
    assert [row[0] for row in g[2:]] == ["b", "zzz", "a", "c\\|d"]  # order, then extras
    assert g[0][1:] == ["2", "1"]
    assert g[2] == ["b", "**2.0**", "**5.0**"]
    assert g[3] == ["zzz", "–", "–"]
    assert g[4] == ["a", "1.0", "**5.0**"]  # tie: both bold
    assert g[5][1:] == ["–", "4.0"]
    # a column where every value is NaN: no bold, reads NaN
    nan = summarize(
        [{"row": "a", "size": 1, "value": float("nan")}, {"row": "b", "size": 1, "value": None}],
        ["row", "size"],
    )
    assert _grid(pivot(nan, "row", "size"))[2] == ["a", "NaN"]


def test_pivot_errors() -> None:
    cells = _cells({"a": {1: [5.0]}})
    with pytest.raises(ValueError, match="summary must hold at least one cell"):
        pivot([], "row", "size")
    with pytest.raises(ValueError, match=r"best must be one of \['max', 'min', None\]"):
        pivot(cells, "row", "size", best="top")
    with pytest.raises(ValueError, match="no key 'resolution'"):
        pivot(cells, "row", "resolution")
    with pytest.raises(ValueError, match="fmt_single '{acc:.1f}' must use only the fields"):
        pivot(cells, "row", "size", fmt_single="{acc:.1f}")
    with pytest.raises(ValueError, match="col_format"):
        pivot(cells, "row", "size", col_format="{px} px")
    dup = summarize(
        [{"row": "a", "size": 1, "seed": s, "value": 1.0} for s in (0, 1)], ["row", "size", "seed"]
    )
    with pytest.raises(ValueError, match="two cells for row='a', size=1"):
        pivot(dup, "row", "size")


def test_write_json_round_trip(tmp_path: Path) -> None:
    obj = {
        "z": 1,
        "a": [1.5, float("nan"), float("inf")],
        "t": (1, 2),
        "np": np.arange(3),
        "x": np.float64(0.25),
        "tensor": torch.tensor([1.0, 2.0]),
        "path": Path("a/b"),
        "nested": {"b": None, "a": True},
    }
    path = write_json(tmp_path / "deep" / "dir" / "results.json", obj)
    text = path.read_text(encoding="utf-8")
    assert text.startswith('{\n  "z": 1,')  # indent 2, key order kept
    back = json.loads(text)
    assert list(back) == list(obj)
    assert back["a"] == [1.5, None, None]
    assert back["t"] == [1, 2] and back["np"] == [0, 1, 2] and back["x"] == 0.25
    assert back["tensor"] == [1.0, 2.0] and back["path"] == "a/b"
    assert back["nested"] == {"b": None, "a": True}
    # the JSON round trip of NaN (null) still summarises as NaN
    recs = [{"k": 1, "value": v} for v in (1.0, float("nan"))]
    write_json(tmp_path / "r.json", recs)
    again = summarize(json.loads((tmp_path / "r.json").read_text()), ["k"])
    assert (again[0]["mean"], again[0]["nan"]) == (1.0, 1)
    with pytest.raises(ValueError, match=r"obj\['a'\]\[1\] must be a JSON value.*got object"):
        write_json(tmp_path / "bad.json", {"a": [1, object()]})
    assert not (tmp_path / "bad.json").exists()


def test_write_json_is_the_one_writer(tmp_path: Path) -> None:
    """report, the engine's run records and the data modules share cape.lab.io.write_json."""
    assert report.write_json is train_logging.write_json is lab_io.write_json
    assert speech_corpus.write_json is translation_corpus.write_json is lab_io.write_json
    # the engine's run record: standard JSON (no NaN token), UTF-8, a final newline
    train_logging.write_run_record(tmp_path, {"lr": float("nan"), "name": "résumé", "t": (1, 2)})
    text = (tmp_path / "config.json").read_text(encoding="utf-8")
    assert "NaN" not in text and "résumé" in text and text.endswith("}\n")
    assert json.loads(text) == {"lr": None, "name": "résumé", "t": [1, 2]}
    env = json.loads((tmp_path / "env.json").read_text(encoding="utf-8"))
    assert env["argv"] and env["world_size"] == 1


def test_report_markdown_and_write(tmp_path: Path) -> None:
    cells = _cells({"cape": {24: [70.0, 72.0]}})
    rep = Report("Vision experiment `smoke`")
    rep.paragraph("ViT d=64.").heading("Results")
    rep.table(pivot(cells, "row", "size"), caption="Top-1 accuracy (%).")
    rep.image("accuracy.png", "Accuracy vs resolution.")
    rep.code("x = 1\n```inner```\n", lang="python")
    md = rep.markdown()
    assert md.startswith("# Vision experiment `smoke`\n\nViT d=64.\n\n## Results\n\n")
    assert "*Top-1 accuracy (%).*\n\n| row | 24 |\n|---|---|\n| cape | **71.0 ± 1.4** |" in md
    assert "![Accuracy vs resolution.](accuracy.png)\n\n*Accuracy vs resolution.*" in md
    assert "````python\nx = 1\n```inner```\n````" in md
    assert md.endswith("````\n")
    path = rep.write(tmp_path / "sub" / "report.md")
    assert path == tmp_path / "sub" / "report.md"
    assert path.read_text(encoding="utf-8") == md
    assert [p.name for p in path.parent.iterdir()] == ["report.md"]


def test_report_errors() -> None:
    with pytest.raises(ValueError, match="title must be a non-empty str"):
        Report("  ")
    rep = Report("t")
    with pytest.raises(ValueError, match="path must be a non-empty path relative to the report"):
        rep.image("/abs/plot.png", "c")
    with pytest.raises(ValueError, match="markdown must be a markdown table"):
        rep.table("not a table")
    with pytest.raises(ValueError, match="level must be an int in 2..6"):
        rep.heading("h", level=1)
    with pytest.raises(ValueError, match="text must be a str"):
        write_text("x.md", b"bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize("writer", ["json", "text", "report"])
def test_failed_write_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    path = tmp_path / "out.txt"
    path.write_text("old complete content\n", encoding="utf-8")

    def half_then_fail(tmp: str, text: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text[: len(text) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(lab_io, "_write_str", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        if writer == "json":
            write_json(path, {"new": list(range(100))})
        elif writer == "text":
            write_text(path, "new content " * 100)
        else:
            Report("new").paragraph("x" * 100).write(path)
    assert path.read_text(encoding="utf-8") == "old complete content\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary file left


def test_mean_std_shows_a_spread_only_with_two_or_more_values() -> None:
    cells = {
        c["row"]: c
        for c in summarize(
            [{"row": "a", "v": 1.0}, {"row": "a", "v": 4.0}, {"row": "b", "v": 2.5}], ["row"], "v"
        )
    }
    spread = float(np.std([1.0, 4.0], ddof=1))  # independent: sample std of the two values
    assert report.mean_std(cells["a"]) == f"2.5 ± {spread:.1f}" == "2.5 ± 2.1"
    assert report.mean_std(cells["a"], 3) == f"2.500 ± {spread:.3f}"
    assert report.mean_std(cells["b"]) == "2.5" and report.mean_std(cells["b"], 0) == "2"
