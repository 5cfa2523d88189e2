"""`cape extend`: the context-extension workflow end to end on a tiny corpus (a trained base,
fine-tunes through cape, save_pretrained, reloads checked, perplexity from 1x to 16x L)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from cape.lab.cli import main

pytest.importorskip("transformers")

WORDS = "in the beginning god created the heaven and the earth and the earth was without form"


def _corpus(folder: Path) -> Path:
    folder.mkdir(parents=True)
    rng = random.Random(0)
    words = WORDS.split()
    for i in range(60):
        (folder / f"d{i:02d}.txt").write_text(" ".join(rng.choice(words) for _ in range(120)))
    return folder


@pytest.mark.slow
def test_extend_runs_every_method_and_reloads_each_model(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["extend", "--out", str(out), "--corpus", str(_corpus(tmp_path / "txt")),
            "--data-root", str(tmp_path / "data"), "--context", "8", "--base-steps", "5",
            "--steps", "3", "--eval-tokens", "600"]  # fmt: skip
    assert main(args) == 0
    results = json.loads((out / "extend.json").read_text())
    records = {r["method"]: r for r in results["records"]}
    assert set(records) == {"none", "pi", "yarn", "cape"}
    for method in ("none", "pi", "yarn"):  # transformers expresses them: a stock load
        assert records[method]["loader"] == "stock transformers"
    assert records["cape"]["loader"] == "cape.integrations.hf.from_pretrained"
    for r in records.values():
        assert r["reload_max_abs_diff"] <= 1e-4  # the reloaded model computes what was saved
        assert set(r["perplexity"]) == {"1", "2", "4", "8", "16"}
        assert all(1.0 <= p < 1e4 for p in r["perplexity"].values())
    config = json.loads((out / "pi" / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "linear"
    assert (out / "report.md").is_file() and (out / "perplexity_vs_length.png").is_file()


@pytest.mark.parametrize(
    ("flag", "value", "match"),
    [
        ("--methods", "pi,foo", "--methods must be"),
        ("--steps", "0", "--steps must be >= 1"),
        ("--base", "nowhere", "--base must be a save_pretrained folder"),
        ("--eval-tokens", "10", "--eval-tokens must cover"),
    ],  # fmt: skip
)
def test_bad_flags_are_one_line_and_exit_2(
    flag: str, value: str, match: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["extend", "--out", str(tmp_path / "o"), flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0]
