"""`cape`'s errors: every mistake exits 2 and every failure at run time 1, each with one line on
stderr naming what is wrong; a traceback only with --debug or CAPE_DEBUG=1. Nothing here trains:
the runs are missing, the configs malformed, the paths wrong, so each command stops at once."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cape.lab import cli
from cape.lab.errors import Preempted, RunError, UsageError

CAPE = str(Path(sys.executable).parent / "cape")  # the console script of this environment
TRAIN = ["train", "vision", "--row", "CAPE"]
EVAL = ["eval", "vision", "--row", "CAPE"]
EXPERIMENT = ["experiment", "vision"]
# a regression would train: its data and runs go to the test folder, not the working one
TRAIN_LM = ["train", "lm", "--row", "rotary", "--out", "{tmp}/runs", "--set", "data.root={tmp}/d"]


def _riff(tag: int, data: bytes) -> bytes:
    """A WAV file whose 'fmt ' chunk declares the sample format `tag` (1 = PCM)."""
    fmt = struct.pack("<HHIIHH", tag, 1, 16000, 32000, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    """Named inputs, each wrong in one way (and a few right ones to get past the others)."""
    files = {
        "bad_yaml": ("bad.yaml", "model:\n  dim: 3\n    depth: 4\n"),  # depth: mis-indented
        "bad_toml": ("bad.toml", "[model]\ndim = \n"),
        "unknown_key": ("unknown.yaml", "model:\n  dimx: 3\n"),
        "json": ("config.json", "{}"),
        "file": ("a_file", "not a folder\n"),
        "tsv_no_tab": ("no_tab.tsv", "a\thello\n# a comment\nb hello\n"),
        "tsv_dup": ("dup.tsv", "a\thello\na.wav\tagain\n"),
        "tsv_abs": ("abs.tsv", "/etc/a\thello\n"),
        "tsv_empty_name": ("empty_name.tsv", "\thello\n"),
    }
    out = {}
    for key, (name, text) in files.items():
        (tmp_path / name).write_text(text)
        out[key] = str(tmp_path / name)
    (tmp_path / "latin1.tsv").write_bytes("a\tse\xf1or\n".encode("latin-1"))
    out["tsv_latin1"] = str(tmp_path / "latin1.tsv")
    wavs = tmp_path / "wavs"
    wavs.mkdir()
    (wavs / "a.wav").write_bytes(_riff(1, b"\0" * 3200))  # 0.1 s of silence, PCM 16-bit
    (wavs / "b.wav").write_bytes(_riff(1, b"\0" * 3200))
    bad = {
        "text_wav": b"hello, I am not audio\n",
        "empty_wav": b"",
        "no_samples_wav": _riff(1, b""),
        "mp3_tagged_wav": _riff(0x55, b"\0" * 100),  # a sample format WAV readers do not know
        "truncated_wav": _riff(1, b"\0" * 100)[:30],
    }
    for key, data in bad.items():
        (tmp_path / f"{key}.wav").write_bytes(data)
        out[key] = str(tmp_path / f"{key}.wav")
    out.update(
        wavs=str(wavs),
        good_wav=str(wavs / "a.wav"),
        missing=str(tmp_path / "missing"),
        empty_dir=str(tmp_path / "empty_dir"),
        tmp=str(tmp_path),
    )
    (tmp_path / "empty_dir").mkdir()
    return out


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """(exit code, stderr lines) of `cape ARGV` in this process (argparse's errors exit)."""
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err.splitlines()


def check_one_line(code: int, err: list[str], want: int, prog: str, *fragments: str) -> None:
    assert code == want, err
    assert len(err) == 1, err  # one line, no traceback
    assert err[0].startswith(f"{prog}: error: "), err[0]
    for fragment in fragments:
        assert fragment in err[0], (fragment, err[0])


MISTAKES = [
    # config files and --set, in each command that reads a config
    *[
        case
        for cmd in (TRAIN, EVAL, EXPERIMENT)
        for case in [
            ([*cmd, "--config", "{bad_yaml}"], "bad.yaml", "invalid YAML at line 3, column 10"),
            ([*cmd, "--config", "{bad_toml}"], "bad.toml", "invalid TOML", "line 2, column 7"),
            ([*cmd, "--config", "{unknown_key}"], "'model.dimx'", "allowed under model"),
            ([*cmd, "--config", "{json}"], "config.json", ".yaml, .yml or .toml"),
            ([*cmd, "--config", "{missing}"], "missing", "does not exist"),
            ([*cmd, "--set", "model.dimx=3"], "'model.dimx'", "allowed under model: ["),
            ([*cmd, "--set", "train.steps=abc"], "train.steps must be an integer, got 'abc'"),
            ([*cmd, "--set", "train.steps=[1"], "--set train.steps: '[1'", "line 1, column 3"),
            ([*cmd, "--set", "train.precision=fp8"], "train.precision must be one of"),
            ([*cmd, "--preset", "huge"], "preset must be one of", "'quick'"),
        ]
    ],
    ([*TRAIN[:2], "--row", "nobody"], "--row must be one of", "'CAPE'"),
    # `cape train lm`: seeds past what torch and numpy take, a vocabulary past SentencePiece's,
    # an --out that the run's JSON records could not hold (all before any data or training)
    ([*TRAIN_LM, "--seed", str(2**70)], "--seed must be an int in [0, 2**63 - 1]", "1180591"),
    ([*TRAIN_LM, "--seed", "-1"], "--seed must be an int in [0, 2**63 - 1], got -1"),
    ([*TRAIN_LM, "--set", "seeds=[-1]"], "seeds[0] must be an int in [0, 2**63 - 1], got -1"),
    ([*TRAIN_LM, "--set", f"seeds=[0, {2**64}]"], "seeds[1] must be an int in [0, 2**63 - 1]"),
    ([*TRAIN_LM, "--set", "seeds=[true]"], "seeds[0] must be"),
    ([*TRAIN_LM, "--set", f"data.vocab={2**70}"], "data.vocab must be at most 2147483647"),
    ([*TRAIN_LM, "--out", "{tmp}/\udcff"], "--out b'", "\\xff' is not a UTF-8 path"),
    ([*EXPERIMENT, "--rows", "CAPE,nobody"], "--rows must name rows", "'nobody'"),
    # a file where a folder is needed, a folder where a file is needed
    ([*TRAIN, "--out", "{file}"], "--out", "a_file' is a file, not a folder"),
    ([*TRAIN, "--out", "{file}/run"], "--out", "a_file' is a file, not a folder"),
    ([*EXPERIMENT, "--out", "{file}"], "--out", "is a file, not a folder"),
    (["plot", "{file}"], "a_file' is a file, not a folder; give an experiment folder"),
    (["plot", "{empty_dir}", "--archive", "{file}"], "--archive", "is a file, not a folder"),
    (["demo", "--out", "{file}"], "--out", "is a file, not a folder"),
    (["data", "chars", "--root", "{file}"], "--root", "is a file, not a folder"),
    (["data", "speech", "--root", "{file}"], "--root", "is a file, not a folder"),
    (["data", "translation", "--root", "{file}"], "--root", "is a file, not a folder"),
    (
        [
            "transcribe",
            "{missing}",
            "{wavs}",
            "--transcripts",
            "{tsv_dup}",
            "--out",
            "{file}/x.json",
        ],
        "--out",
        "a_file' is a file, not a folder",
    ),
    (
        ["transcribe", "{missing}", "{wavs}", "--transcripts", "{tsv_dup}", "--out", "{wavs}"],
        "--out",
        "is a folder; give a file path",
    ),
    # runs, folders and corpora that do not exist
    ([*EVAL, "--out", "{missing}"], "no run", "missing/cape/seed0", "cape train vision"),
    (["transcribe", "{missing}", "{good_wav}"], "missing", "a run folder or a checkpoint folder"),
    (["translate", "{missing}", "hello"], "missing", "has no model.json"),
    (["plot", "{missing}"], "missing' does not exist; give an experiment folder"),
    (["plot", "{empty_dir}"], "empty_dir' has no results.json"),
    (["data", "speech", "--verify", "--root", "{missing}"], "missing", "no corpus there"),
    # audio (checked before the model is loaded)
    *[
        (["transcribe", "{missing}", f"{{{key}}}"], f"{key}.wav", what)
        for key, what in [
            ("text_wav", "is not a readable WAV file"),
            ("empty_wav", "is an empty file (0 bytes)"),
            ("no_samples_wav", "holds no audio samples"),
            ("mp3_tagged_wav", "is not a readable WAV file"),
            ("truncated_wav", "is not a readable WAV file"),
        ]
    ],
    (["transcribe", "{missing}", "{missing}.wav"], "no such audio file", "missing.wav"),
    (["transcribe", "{missing}", "{empty_dir}"], "empty_dir holds no .wav file"),
    # transcript lists (also before the model)
    *[
        (["transcribe", "{missing}", "{wavs}", "--transcripts", f"{{{key}}}"], *what)
        for key, what in [
            ("tsv_no_tab", ("no_tab.tsv, line 3", "found no tab")),
            ("tsv_dup", ("dup.tsv, line 2", "duplicate name 'a' (first on line 1)")),
            ("tsv_abs", ("abs.tsv, line 1", "relative to the audio folder")),
            ("tsv_empty_name", ("empty_name.tsv, line 1", "empty name")),
            ("tsv_latin1", ("latin1.tsv", "is not UTF-8 text")),
            ("missing", ("no such transcripts file", "missing")),
            ("wavs", ("wavs is a folder", "give a TSV file")),
        ]
    ],
    # values that argparse does not check
    (["transcribe", "{missing}", "{good_wav}", "--beam", "-1"], "--beam must be >= 0"),
    (["translate", "{missing}", "--beam", "-1"], "--beam must be >= 0"),
    (["data", "chars", "--sizes", "a,b", "--root", "{tmp}"], "--sizes must be comma-separated"),
    (["encodings", "extra"], "unexpected arguments ['extra']"),
]


@pytest.mark.parametrize("case", MISTAKES, ids=lambda c: " ".join(c[0]))
def test_each_mistake_exits_2_with_one_line(case, paths, capsys) -> None:
    argv, *fragments = case
    if "wav" in " ".join(argv):
        pytest.importorskip("soundfile")
    argv = [a.format(**paths) for a in argv]
    prog = " ".join(["cape", argv[0], *(argv[1:2] if argv[0] in ("data", "bench") else [])])
    check_one_line(*run(argv, capsys), 2, prog, *fragments)


ARGUMENT_MISTAKES = [
    ["experiment", "vision", "--bogus"],
    ["train", "vision", "--row", "CAPE", "--seed", "x"],
    ["eval", "vision"],
    ["eval", "nothing", "--row", "CAPE"],
    ["plot"],
    ["transcribe", "model-only"],
    ["translate", "run", "--beam", "wide"],
    ["demo", "--bogus"],
    ["data", "chars", "--train", "many"],
    ["data", "speech", "--bogus"],
    ["data", "translation", "--bogus"],
    ["data", "nothing"],
    ["bench", "encodings", "--runs", "x"],
    ["bench", "slowdown", "--bogus"],
    ["bench", "throughput"],
    ["bench", "train", "--bogus"],
    ["bench", "gpu", "--bogus"],
    ["bench", "nothing"],
    ["nothing"],
    [],
]


@pytest.mark.parametrize("argv", ARGUMENT_MISTAKES, ids=" ".join)
def test_argument_mistakes_exit_2_with_one_line_and_the_usage(argv, capsys) -> None:
    code, err = run(argv, capsys)
    assert code == 2 and len(err) == 1, err
    assert ": error: " in err[0] and "(usage: cape" in err[0], err[0]


@pytest.fixture
def read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder nobody may write into; as root (who may), `os.access` is told so."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        real = os.access
        monkeypatch.setattr(
            os, "access", lambda p, mode: False if Path(p) == folder else real(p, mode)
        )
    yield folder
    folder.chmod(0o755)


@pytest.mark.parametrize(
    "argv",
    [
        [*TRAIN, "--out", "{ro}"],
        [*EXPERIMENT, "--out", "{ro}/new/sub"],
        ["demo", "--out", "{ro}"],
        ["data", "chars", "--root", "{ro}/chars"],
        ["data", "speech", "--root", "{ro}"],
        ["data", "translation", "--root", "{ro}"],
        ["bench", "encodings", "--out", "{ro}"],
        ["bench", "slowdown", "--out", "{ro}"],
        ["bench", "throughput", "vit", "--out", "{ro}"],
        ["bench", "gpu", "--out", "{ro}"],
        ["plot", "{ro}"],
        ["transcribe", "run", "{wavs}", "--transcripts", "{tsv_dup}", "--out", "{ro}/s.json"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_read_only_folder_is_named_before_any_work(argv, read_only, paths, capsys) -> None:
    argv = [a.format(ro=read_only, **paths) for a in argv]
    code, err = run(argv, capsys)
    assert code == 2 and len(err) == 1, err
    assert "read_only' is not writable; give a writable folder" in err[0], err[0]


def _fail_with(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """`cape encodings` raises `error`: what a crash inside any command looks like to main."""

    def crash(args, rest):
        raise error

    monkeypatch.setattr(cli, "_encodings", crash)


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (RunError("training diverged at step 7"), 1, "training diverged at step 7"),
        (
            OSError(28, "No space left on device", "runs/x/metrics.jsonl"),
            1,
            "no space left on the disk writing 'runs/x/metrics.jsonl'; free some space and run",
        ),
        (PermissionError(13, "Permission denied", "runs/x"), 1, "Permission denied: 'runs/x'"),
        (RunError("2 problem(s):\n  a.wav\n  b.wav"), 1, "2 problem(s): a.wav; b.wav"),
        (
            ZeroDivisionError("division by zero"),
            1,
            "unexpected ZeroDivisionError: division by zero (rerun with --debug or CAPE_DEBUG",
        ),
        (KeyError("records"), 1, "unexpected KeyError: 'records' (rerun with --debug"),
        (
            KeyError("best_metric 'acc' not in eval metrics ['loss']"),
            2,
            "best_metric 'acc' not in eval metrics ['loss']",
        ),
        (UsageError("--out 'x' is busy"), 2, "--out 'x' is busy"),
        (ValueError("dim must be > 0, got 0"), 2, "dim must be > 0, got 0"),
        (FileNotFoundError("no checkpoint in runs/x: train it first"), 2, "no checkpoint in"),
        (
            ModuleNotFoundError("no sacrebleu", name="sacrebleu"),
            1,
            "'sacrebleu' is not installed; install it with: pip install \"cape[translation]\"",
        ),
        (ModuleNotFoundError("no nothere", name="nothere"), 1, "unexpected ModuleNotFoundError"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None,
)
def test_failures_map_to_their_code_in_one_line(error, code, line, monkeypatch, capsys) -> None:
    monkeypatch.delenv("CAPE_DEBUG", raising=False)
    _fail_with(monkeypatch, error)
    check_one_line(*run(["encodings"], capsys), code, "cape encodings", line)


def test_ctrl_c_exits_130_quietly(monkeypatch, capsys) -> None:
    monkeypatch.delenv("CAPE_DEBUG", raising=False)
    _fail_with(monkeypatch, KeyboardInterrupt())
    assert run(["encodings"], capsys) == (130, [])


def test_a_preempted_run_exits_75_and_only_rank_0_says_where_it_saved(monkeypatch, capsys) -> None:
    monkeypatch.delenv("CAPE_DEBUG", raising=False)
    line = "stopped by SIGTERM after step 7 of 20, saved in r/checkpoints/step_00000007; rerun"
    _fail_with(monkeypatch, Preempted(line))
    assert run(["encodings"], capsys) == (75, [f"cape encodings: {line}"])
    _fail_with(monkeypatch, Preempted(line, rank=1))
    assert run(["encodings"], capsys) == (75, [])


@pytest.mark.parametrize(
    ("argv", "env", "traceback"),
    [
        (["encodings"], None, False),
        (["--debug", "encodings"], None, True),
        (["encodings", "--debug"], None, True),
        (["encodings"], "1", True),
        (["encodings"], "0", False),
    ],
)
def test_debug_adds_the_traceback(argv, env, traceback, monkeypatch, capsys) -> None:
    if env is None:
        monkeypatch.delenv("CAPE_DEBUG", raising=False)
    else:
        monkeypatch.setenv("CAPE_DEBUG", env)
    _fail_with(monkeypatch, RunError("step 3 failed"))
    code, err = run(argv, capsys)
    assert code == 1 and err[-1] == "cape encodings: error: step 3 failed"
    assert (err[0] == "Traceback (most recent call last):") is traceback, err
    assert len(err) > 1 if traceback else len(err) == 1


def test_help_documents_the_codes_and_debug(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--debug" in text and "CAPE_DEBUG=1" in text
    assert "2 a mistake in the command" in text and "1 a failure at run time" in text


def _console(args: list[str], tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "CAPE_DEBUG"} | env
    return subprocess.run(
        [CAPE, *args], capture_output=True, text=True, timeout=300, cwd=tmp, env=environ
    )


def test_console_script_codes_lines_and_tracebacks(paths, tmp_path: Path) -> None:
    """The installed `cape`, as users run it: the same codes, one line, tracebacks on request."""
    if not os.access(CAPE, os.X_OK):
        pytest.skip(f"no console script at {CAPE}")
    bad = [*TRAIN, "--config", paths["bad_yaml"]]
    cases = [
        (bad, {}, "cape train: error: config file", False),
        ([*EVAL, "--out", paths["missing"]], {}, "cape eval: error: no run", False),
        (["transcribe", paths["missing"], paths["wavs"]], {}, "cape transcribe: error:", False),
        (["translate", paths["missing"], "hi"], {}, "cape translate: error: run", False),
        ([*TRAIN, "--seed", "x"], {}, "cape train: error: argument --seed", False),
        (["--debug", *bad], {}, "cape train: error: config file", True),
        ([*bad, "--debug"], {}, "cape train: error: config file", True),
        (bad, {"CAPE_DEBUG": "1"}, "cape train: error: config file", True),
    ]
    for argv, env, line, traceback in cases:
        proc = _console(argv, tmp_path, **env)
        err = proc.stderr.splitlines()
        assert proc.returncode == 2, (argv, proc.stderr)
        assert err[-1].startswith(line), (argv, err)
        assert ("Traceback" in proc.stderr) is traceback, (argv, proc.stderr)
        assert len(err) == 1 or traceback, (argv, err)


def test_comma_lists_are_read_once_per_name_in_the_order_given(capsys) -> None:
    from cape.lab.arguments import ArgumentParser

    p = ArgumentParser(prog="cape bench x")
    assert p.names("--checks", " export, onnx,export ,", ["onnx", "export"]) == ["export", "onnx"]
    assert p.positive_ints("--lengths", "256,64,256") == [256, 64]
    for call in (
        lambda: p.names("--checks", "export,video", ["onnx", "export"]),
        lambda: p.names("--checks", " , ", ["onnx", "export"]),
        lambda: p.positive_ints("--lengths", "64,0"),
        lambda: p.positive_ints("--lengths", "64,x"),
    ):
        with pytest.raises(SystemExit) as err:
            call()
        assert err.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4
    assert all(line.startswith("cape bench x: error: --") for line in lines)
    assert "--checks must be a comma list of onnx, export; got 'export,video'" in lines[0]
    assert "--lengths must be a comma list of integers >= 1, got '64,x'" in lines[3]
