"""The contract suite over the command line of the language-model surfaces: `cape generate`,
`cape data text` and `cape train lm` called in this process with generated arguments.

Each call draws a command line from valid values and, now and then, one refused value (every
flag's wrong types and ranges, overflowing ints, NaN and inf, text that is not UTF-8 on argv
and stdin) or one damaged input (run folders with a model.json that does not match the
checkpoint, truncated or missing checkpoints; corpora with symlink loops, dangling symlinks,
folders named x.txt, pipes, files and names that are not UTF-8). The outcome is classified:

- "valid": exit 0 with what the command prints (the prompt continued; the corpus's counts and
  each skipped file counted; the run folder);
- "error": the exit code the refused value calls for (2 a mistake, 1 a damaged file), one line
  on stderr `cape CMD: error: ...` naming the flag or file;
- a failure: "unexpected" (a bug's line), "lines" (no line or several, a traceback),
  "unnamed", "wrong-code", "accepted-invalid" (exit 0 with a refused value), "wrong-output".

Lab tier (slow): a tiny lm run and corpus are made once; a fixed seed per command draws the
same command lines on every run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from cape.lab.cli import main
from cape.lab.experiments import resolve_config
from cape.lab.experiments.lm.config import LMConfig
from cape.lab.experiments.lm.experiment import LM
from cape.lab.experiments.lm.presets import PRESETS

EXAMPLES = {"generate": 150, "data text": 60, "train lm": 30}
WORDS = "in the beginning god created the heaven and the earth and the earth was without form"
NOT_UTF8 = os.fsdecode(b"caf\xe9")  # what a Latin-1 shell passes: surrogates in Python
SETS = [
    "data.context=8", "data.val_tokens=64", "data.train_windows=20", "model.dim=16",
    "model.heads=2", "model.layers=1", "model.ffn_dim=32", "train.batch_size=2",
    "train.lr=0.01", "train.warmup_steps=0", "train.eval_every=2", "train.checkpoint_every=2",
    "eval.factors=[1]", "eval.buckets=2", "eval.max_tokens=0", "seeds=[0]",
    "rows=[{name: rotary, position: rotary}, {name: abspos, position: abspos, "
    "options: {num_positions: 8}}]",
]  # fmt: skip


@dataclass
class Case:
    """One command line: argv, stdin bytes, the refused value drawn (None: all valid) with the
    exit code it calls for and the words one of which the error line must hold."""

    argv: list[str]
    stdin: bytes = b""
    bad: str | None = None
    code: int = 2
    names: list[str] = field(default_factory=list)
    check: object = None  # (stdout) -> problem or None, for a valid call


class Draw:
    def __init__(self, data: st.DataObject, p_bad: float) -> None:
        self.data, self.p_bad = data, p_bad
        self.rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
        self.bad: tuple[str, int, list[str]] | None = None

    def choice(self, seq: list | tuple) -> object:
        return self.data.draw(st.sampled_from(list(seq)))

    def value(self, flag: str, valid: list, invalid: list, code: int = 2) -> object:
        """A valid value, or (with chance p_bad, at most one per case) a refused one."""
        if invalid and self.bad is None and self.rng.random() < self.p_bad:
            value = self.choice(invalid)
            self.bad = (f"{flag} {value!r}", code, [flag])
            return value
        return self.choice(valid)


def _run(case: Case) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    stdin = io.TextIOWrapper(io.BytesIO(case.stdin), encoding="utf-8")
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        mock.patch.object(sys, "stdin", stdin),
    ):
        try:
            code = main(case.argv)
        except SystemExit as stop:  # argparse's usage errors
            code = stop.code if isinstance(stop.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def classify(case: Case, prog: str) -> tuple[str, str]:
    code, out, err = _run(case)
    lines = err.splitlines()
    if code == 0:
        if case.bad is not None:
            return "accepted-invalid", f"exit 0 with {case.bad}"
        problem = case.check(out, err) if callable(case.check) else None
        return ("wrong-output", problem) if problem else ("valid", "")
    if len(lines) != 1 or "Traceback" in err:
        return "lines", f"exit {code}, {len(lines)} lines: {err[-600:]!r}"
    line = lines[0]
    if "unexpected" in line or not line.startswith(f"{prog}: error: "):
        return "unexpected", line
    if case.bad is None:
        return "wrong-code", f"exit {code} with valid arguments: {line}"
    if code != case.code:
        return "wrong-code", f"exit {code} for {case.bad} (wants {case.code}): {line}"
    if not any(n in line for n in case.names):
        return "unnamed", f"{line} (names none of {case.names})"
    return "error", ""


def contract(prog: str, examples: int, draw_case, p_bad: float) -> Counter:
    counts: Counter = Counter()
    failures: list[str] = []

    @seed(zlib.crc32(prog.encode()))  # the same command lines on every run
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        d = Draw(data, p_bad)
        case = draw_case(d)
        if d.bad is not None:
            case.bad, case.code, names = d.bad
            case.names = [*names, *case.names]
        outcome, detail = classify(case, prog)
        counts[outcome] += 1
        counts[f"{'bad' if case.bad else 'ok'}"] += 1
        if outcome not in ("valid", "error") and len(failures) < 8:
            failures.append(f"[{outcome}] {detail}\n    argv: {case.argv}")

    prop()
    print(f"\n{prog}: {examples} generated command lines: {dict(sorted(counts.items()))}")
    assert not failures, "\n".join(failures)
    assert counts["valid"] and counts["error"]
    return counts


# --- fixtures: a tiny trained run and its damaged copies, corpora and their damage -----------


def _corpus(folder: Path, n: int = 40) -> Path:
    rng = random.Random(0)
    folder.mkdir(parents=True)
    for i in range(n):
        words = " ".join(rng.choice(WORDS.split()) for _ in range(60))
        (folder / f"d{i:02d}.txt").write_text(words + f" {i}\n")
    return folder


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("contract")
    corpus = _corpus(tmp / "txt")
    sets = [f"data.corpus={corpus}", f"data.root={tmp / 'data'}", *SETS, "train.steps=2"]
    cfg, mapping = resolve_config(LMConfig, PRESETS, "quick", [], sets)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        LM.run(cfg, mapping, tmp / "run")
    return {"tmp": tmp, "corpus": corpus, "run": LM.run_dir(tmp / "run", cfg.rows[0], 0),
            "abspos": LM.run_dir(tmp / "run", cfg.rows[1], 0)}  # fmt: skip


def _damaged_runs(lab: dict[str, Path]) -> dict[str, tuple[Path, int, str]]:
    """name -> (run folder, exit code, a word of the error line) of damaged copies."""
    tmp, good = lab["tmp"], lab["run"]
    out: dict[str, tuple[Path, int, str]] = {}

    def copy(name: str, edit, code: int, word: str) -> None:
        folder = tmp / "damaged" / name
        if not folder.exists():
            shutil.copytree(good, folder)
            edit(folder)
        out[name] = (folder, code, word)

    def spec(change):
        def edit(folder: Path) -> None:
            data = json.loads((folder / "model.json").read_text())
            change(data)
            (folder / "model.json").write_text(json.dumps(data))

        return edit

    def truncate(folder: Path) -> None:
        for weights in (folder / "checkpoints").rglob("*.safetensors"):
            weights.write_bytes(weights.read_bytes()[:40])

    copy("other dim", spec(lambda s: s["model"].update(dim=32)), 1, "model.json")
    copy("unknown key", spec(lambda s: s["model"].update(depth=3)), 2, "model.json")
    copy("bad value", spec(lambda s: s["model"].update(heads=0)), 2, "model.json")
    copy("bad tokenizer", spec(lambda s: s.update(tokenizer="words")), 2, "model.json")
    copy("not json", lambda f: (f / "model.json").write_text("{oops"), 2, "model.json")
    copy("latin-1 json", lambda f: (f / "model.json").write_bytes(b'{"\xe9": 1}'), 2, "model.json")
    copy("truncated", truncate, 1, "damaged")
    copy("no checkpoints", lambda f: shutil.rmtree(f / "checkpoints"), 2, "checkpoint")
    copy("empty", lambda f: [shutil.rmtree(f), f.mkdir()], 2, "model.json")
    out["missing"] = (tmp / "damaged" / "missing", 2, "does not exist")
    return out


def _damaged_corpora(tmp: Path) -> dict[str, tuple[Path, int | None, str]]:
    """name -> (folder, exit code or None when it builds, a word of its line or of stdout)."""
    root = tmp / "corpora"
    out: dict[str, tuple[Path, int | None, str]] = {}

    def make(name: str, edit, code: int | None, word: str) -> None:
        folder = root / name
        if not folder.exists():
            _corpus(folder, 12)
            edit(folder)
        out[name] = (folder, code, word)

    make("loop", lambda f: [os.symlink("b.txt", f / "a.txt"), os.symlink("a.txt", f / "b.txt")],
         None, "skipped 2 files")  # fmt: skip
    make("dangling", lambda f: os.symlink("nowhere", f / "x.txt"), None, "skipped 1 files")
    make("folder.txt", lambda f: (f / "x.txt").mkdir(), None, "skipped 1 files")
    make("pipe", lambda f: os.mkfifo(f / "p.txt"), None, "skipped 1 files")
    make("dir link", lambda f: os.symlink(".", f / "again"), None, "skipped 1 files")
    make("latin-1 text", lambda f: (f / "l.txt").write_bytes(b"caf\xe9\n"), 2, "l.txt")
    make("latin-1 name", lambda f: (f / f"{NOT_UTF8}.txt").write_text("x\n"), 2, "not UTF-8")
    make("no txt", lambda f: [p.rename(p.with_suffix(".md")) for p in f.glob("*.txt")], 2,
         "no .txt")  # fmt: skip
    make("all blank", lambda f: [p.write_text(" \n") for p in f.glob("*.txt")], 2, "empty")
    out["missing"] = (root / "missing", 2, "neither a folder")
    return out


# --- the command lines ----------------------------------------------------------------------


def _generate_case(d: Draw, lab: dict[str, Path], damaged: dict) -> Case:
    run = lab["abspos"] if d.rng.random() < 0.2 else lab["run"]
    names: list[str] = []
    if d.bad is None and d.rng.random() < 0.2:  # a damaged run folder
        name = d.choice(sorted(damaged))
        run, code, word = damaged[name]
        d.bad = (f"run {name}", code, [word, str(run)])
    argv = ["generate", str(run)]
    prompt = d.value("--prompt", ["in the", "", "é ☕ god", "-"], [f"in {NOT_UTF8}"])
    stdin = b""
    if prompt == "-":
        stdin = d.value("standard input", [b"the earth\n", b""], [b"caf\xe9\n", b"\xff"])
        names.append("--prompt")
    argv += ["--prompt", str(prompt)]
    max_new = d.value("--max-new", ["1", "3", "5"], ["0", "-2", str(2**70), str(2**24 + 1), "x"])
    argv += ["--max-new", str(max_new)]
    temperature = d.value("--temperature", ["0", "0.8", "1e-320", "1e300"],
                          ["-1", "nan", "inf", "1e400", "hot"])  # fmt: skip
    argv += ["--temperature", str(temperature)]
    if d.rng.random() < 0.5:
        argv += ["--top-k", str(d.value("--top-k", ["1", "5", "257"], ["0", "258", str(2**70)]))]
    if d.rng.random() < 0.4:
        seed_ = d.value("--seed", ["0", str(2**64 - 1), "-5"], [str(2**64), str(-(2**63) - 1)])
        argv += ["--seed", str(seed_)]
    if d.rng.random() < 0.3:
        ckpt = d.value("--checkpoint", ["best", "latest"], ["nope", "../x", "", "."])
        argv += ["--checkpoint", str(ckpt)]
        names.append("checkpoint")  # pick_checkpoint's own word for the flag
    if d.rng.random() < 0.3:
        argv += ["--device", str(d.value("--device", ["cpu"], ["meta", "xpu", "gpu", "cuda:7"]))]
    if d.rng.random() < 0.3:
        argv.append("--ignore-eod")
    text = stdin.decode("utf-8", "replace").removesuffix("\n") if prompt == "-" else prompt

    def check(out: str, err: str) -> str | None:
        if not out.startswith(str(text)):
            return f"stdout {out[:40]!r} does not start with the prompt {text!r}"
        return None if "tokens generated" in err else f"no rate line: {err!r}"

    return Case(argv, stdin, names=names, check=check)


def _data_text_case(d: Draw, lab: dict[str, Path], corpora: dict) -> Case:
    tmp = lab["tmp"]
    folder, word, code = lab["corpus"], "", None
    if d.rng.random() < 0.4:  # half of these build, listing what they skip
        name = d.choice(sorted(corpora))
        folder, code, word = corpora[name]
        if code is not None and d.bad is None:
            d.bad = (f"corpus {name}", code, [word, str(folder)])
    out = d.value("--out", [str(tmp / "text"), str(tmp / "text ☕")],
                  [str(lab["corpus"] / "d00.txt"), "/dev/null", str(tmp / NOT_UTF8)])  # fmt: skip
    argv = ["data", "text", "--corpus", str(folder), "--out", str(out)]
    tokenizer = d.value("--tokenizer", ["bytes"] * 5 + ["bpe"], ["wordpiece", ""])
    argv += ["--tokenizer", str(tokenizer)]
    if tokenizer == "bpe" or d.rng.random() < 0.3:
        valid = ["300", "310"] if tokenizer == "bpe" else ["257"]
        bad = ["50", str(2**70), str(2**31), "x"] if tokenizer == "bpe" else ["1000", "x"]
        argv += ["--vocab", str(d.value("--vocab", valid, bad))]
    if d.rng.random() < 0.5:
        split = d.value(
            "--split",
            ["0.8,0.1,0.1", "1,0,0", "0.9,0.05,0.05"],
            ["nan,0,0", "inf,0,0", "0.5,0.5", "a,b,c", "-0.1,0.6,0.5", "1e400,0,0"],
        )
        argv += ["--split", str(split)]

    def check(out_: str, err: str) -> str | None:
        if "vocabulary of" not in out_:
            return f"no summary: {out_!r}"
        return None if word in out_ else f"{word!r} not said: {out_!r}"

    return Case(argv, check=check)


def _train_case(d: Draw, lab: dict[str, Path], corpora: dict) -> Case:
    tmp = lab["tmp"]
    corpus = lab["corpus"]
    refused = sorted(n for n, (_, code, _) in corpora.items() if code is not None)
    if d.bad is None and d.rng.random() < 0.2:  # a corpus that builds has too few documents
        name = d.choice(refused)
        corpus, code, word = corpora[name]
        d.bad = (f"data.corpus {name}", code, [word, str(corpus)])
    sets = [f"data.corpus={corpus}", f"data.root={tmp / 'data'}", *SETS]
    steps = d.value("train.steps", ["1", "2"], ["0", "-1", "1.5", "x"])
    sets.append(f"train.steps={steps}")
    key, bad = d.choice([
        ("data.context", ["1", "0", str(2**70)]), ("model.dim", ["0", "15", "x"]),
        ("model.dropout", ["nan", "1.0", "-0.1"]), ("seeds", ["[-1]", f"[{2**64}]", "[]"]),
        ("data.vocab", [str(2**70)]), ("eval.factors", ["[2]", "[]", "[1, 1]"]),
        ("train.lr", ["-1", "nan"]), ("data.tokenizer", ["words"]),
    ])  # fmt: skip
    value = d.value(key, [None], bad)
    if value is not None:
        sets.append(f"{key}={value}")
    row = d.value("--row", ["rotary"], ["nobody", ""])
    argv = ["train", "lm", "--preset", "quick", *[a for s in sets for a in ("--set", s)]]
    argv += ["--row", str(row)]
    if d.rng.random() < 0.4:
        argv += ["--seed", str(d.value("--seed", ["0", "3"], ["-1", str(2**63), "x"]))]
    out = d.value("--out", [str(tmp / "train")], [str(corpus / "d00.txt"), str(tmp / NOT_UTF8)])
    argv += ["--out", str(out)]

    def check(out_: str, err: str) -> str | None:
        return None if "run: " in out_ else f"no run folder printed: {out_[-200:]!r}"

    return Case(argv, check=check)


def test_generate_contract(lab) -> None:
    damaged = _damaged_runs(lab)
    contract("cape generate", EXAMPLES["generate"],
             lambda d: _generate_case(d, lab, damaged), p_bad=0.06)  # fmt: skip


def test_data_text_contract(lab) -> None:
    corpora = _damaged_corpora(lab["tmp"])
    contract("cape data text", EXAMPLES["data text"],
             lambda d: _data_text_case(d, lab, corpora), p_bad=0.06)  # fmt: skip


def test_train_lm_contract(lab) -> None:
    corpora = _damaged_corpora(lab["tmp"])
    contract("cape train", EXAMPLES["train lm"],
             lambda d: _train_case(d, lab, corpora), p_bad=0.12)  # fmt: skip
