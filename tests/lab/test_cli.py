"""The `cape` command line: help, exit codes, demo output, bench table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import cape
from cape.build import ENCODINGS, encoding_class, encoding_options
from cape.lab.cli import main


def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for command in ("bench", "demo", "encodings"):
        assert command in out


def test_bad_usage_exits_2() -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "nothing"])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2


def test_encodings_lists_every_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["encodings"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == list(cape.ENCODINGS)


def test_demo_writes_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert main(["demo", "--out", str(tmp_path)]) == 0
    png = tmp_path / "similarity.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "E(25) == E(5) (mod-20 rule): True" in out
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_console_script_bench_runs() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cape.lab.cli",
            "bench",
            "encodings",
            "--runs",
            "1",
            "--scale",
            "0.05",
            "--families",
            "text",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| text | cape1d")]
    assert len(rows) == 4  # train and eval, at T = 1000 and T = 100


def test_bench_train_reports_fraction_of_peak(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "bench",
        "train",
        "--layers",
        "1",
        "--dim",
        "32",
        "--heads",
        "2",
        "--length",
        "16",
        "--batch",
        "2",
        "--runs",
        "1",
        "--peak-size",
        "128",
        "--engine-steps",
        "0",
    ]
    assert main(args) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith(("| fp32", "| bf16"))]
    assert len(rows) == 2 and all(r.rstrip().endswith("% |") for r in rows)


def test_step_flops_closed_form() -> None:
    from cape.lab.bench.train import step_flops

    # one layer, d=2, f=4, B=1, T=3: 3 * 3 tokens * (8*4 + 4*2*4 + 4*3*2) = 3 * 3 * 88
    assert step_flops(1, 2, 4, 1, 3) == 3 * 3 * 88


def test_data_chars_makes_cached_splits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "data",
        "chars",
        "--root",
        str(tmp_path),
        "--sizes",
        "16",
        "--train",
        "36",
        "--val",
        "0",
        "--test",
        "36",
        "--native",
        "4",
        "--workers",
        "1",
    ]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert len(list(tmp_path.glob("*.npz"))) == 4  # train, test, test_fonts, native
    assert main(args) == 0  # second run: everything cached, same files
    assert capsys.readouterr().out == first
    assert main(["data", "chars", "--root", str(tmp_path), "--sizes", "a,b"]) == 2


def test_data_speech_makes_then_verifies_and_names_a_corrupt_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cape.lab.data import espeak_available

    if not espeak_available():
        pytest.skip("libespeak-ng is not installed (scripts/setup.sh installs it)")
    args = [
        "data",
        "speech",
        "--root",
        str(tmp_path),
        "--train",
        "2",
        "--val",
        "1",
        "--test-per-bin",
        "0",
        "--workers",
        "1",
    ]
    assert main(args) == 0
    wavs = sorted(tmp_path.rglob("*.wav"))
    assert len(wavs) == 3
    wavs[0].write_bytes(wavs[0].read_bytes()[:100])  # truncate one file
    capsys.readouterr()
    assert main(["data", "speech", "--root", str(tmp_path), "--verify"]) == 1
    assert wavs[0].name in capsys.readouterr().err
    assert main(args) == 0  # a rerun repairs it
    assert main(["data", "speech", "--root", str(tmp_path), "--verify"]) == 0


def test_cli_lists_exactly_the_options_build_accepts(capsys) -> None:
    assert main(["encodings"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    listed = {}
    for line in lines:
        name, kind, rest = line.split(maxsplit=2)
        options = rest.removeprefix("options:").strip()
        listed[name] = ([o.strip() for o in options.split(",")] if options else [], kind)
    assert listed == {n: (encoding_options(n), encoding_class(n).kind) for n in ENCODINGS}


def _exit_code(argv: list[str]) -> int:
    """`main(argv)`'s exit code, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as e:
        return 0 if e.code is None else int(e.code)


_HELPS = [
    [],
    ["bench"],
    *(["bench", b] for b in ("encodings", "slowdown", "throughput", "train", "gpu", "rotary")),
    ["data"],
    *(["data", d] for d in ("chars", "speech", "translation", "text")),
    ["experiment"],
    *(["experiment", e] for e in ("asr", "length", "vision")),
    ["train"],
    ["train", "length"],
    ["eval"],
    ["eval", "length"],
    ["plot"],
    ["transcribe"],
    ["translate"],
    ["generate"],
    ["demo"],
    ["encodings"],
]


@pytest.mark.parametrize("argv", _HELPS, ids=lambda a: " ".join(a) or "cape")
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_help_exits_0(argv: list[str], flag: str, capsys: pytest.CaptureFixture) -> None:
    assert _exit_code([*argv, flag]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage:") and not err


def test_bench_help_lists_every_benchmark_with_a_line(capsys: pytest.CaptureFixture) -> None:
    from cape.lab.cli import _BENCHES

    assert _exit_code(["bench", "--help"]) == 0
    lines = capsys.readouterr().out.split("benchmarks:\n")[1].splitlines()
    assert [line.split()[0] for line in lines] == list(_BENCHES)
    assert all(len(line.split()) > 3 for line in lines)  # a description after each name


def test_data_help_lists_every_data_set_with_a_line(capsys: pytest.CaptureFixture) -> None:
    assert _exit_code(["data", "--help"]) == 0
    lines = capsys.readouterr().out.split("data sets:\n")[1].splitlines()
    assert [line.split()[0] for line in lines] == ["chars", "speech", "translation", "text"]
    assert all(len(line.split()) > 3 for line in lines)


@pytest.mark.parametrize("command", ["bench", "data"])
def test_bench_and_data_without_a_name_are_a_usage_error(
    command: str, capsys: pytest.CaptureFixture
) -> None:
    assert _exit_code([command]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert f"cape {command}: error: the following arguments are required" in err


def _listed(rows: str) -> dict[str, str]:
    """The preset -> row names section of an experiment's help, continuation lines joined."""
    entries: dict[str, str] = {}
    for line in rows.splitlines()[1:]:
        if line.startswith("  ") and not line[2].isspace():  # "  PRESET  name, name, ..."
            preset, _, names = line.strip().partition(" ")
            entries[preset] = names.strip()
        elif line.strip():
            entries[preset] += " " + line.strip()
    return entries


@pytest.mark.parametrize("command", ["experiment", "train", "eval"])
def test_experiment_help_lists_its_presets_and_rows(
    command: str, capsys: pytest.CaptureFixture
) -> None:
    from cape.lab.experiments import EXPERIMENTS, resolve_config

    for name, exp in EXPERIMENTS.items():
        assert _exit_code([command, name, "--help"]) == 0
        out = capsys.readouterr().out
        presets, rows = out.split(f"presets of {name} ")[1].split("\nrows of each preset ")
        for preset in exp.presets:
            cfg, _ = resolve_config(exp.config_cls, exp.presets, preset)
            (line,) = [p for p in presets.splitlines() if p.split()[:1] == [preset]]
            assert exp.preset_notes[preset] in line  # one line each: what it trains, how long
            assert f"{len(cfg.rows)} row" in line and f"{cfg.train.steps} steps" in line
            assert _listed(rows)[preset] == ", ".join(r.name for r in cfg.rows)
        assert ("--row NAME" if command != "experiment" else "--rows NAME,NAME") in rows


def test_every_preset_has_a_note() -> None:
    from cape.lab.experiments import EXPERIMENTS

    for exp in EXPERIMENTS.values():
        assert set(exp.preset_notes) == set(exp.presets), exp.name


def test_version_is_one_line(capsys) -> None:
    import cape
    from cape.lab.cli import main as cape_main

    with pytest.raises(SystemExit) as exit_info:
        cape_main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"cape {cape.__version__}"


def test_an_experiments_help_needs_no_other_studys_extra() -> None:
    """`cape experiment vision --help` with the lab extra alone: the speech extra's jiwer is
    imported where WER is counted, not when the experiments are listed."""
    code = (
        "import sys; sys.modules['jiwer'] = None\n"
        "from cape.lab.cli import main\n"
        "try:\n    main(['experiment', 'vision', '--help'])\n"
        "except SystemExit as e:\n    print('exit', e.code)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip().splitlines()[-1] == "exit 0", out.stderr[-500:]
