"""The benchmark plumbing: saved-memory accounting, the results writer, `cape bench encodings`
and `cape bench throughput vit` on tiny shapes (their numbers, not their speed)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from cape.lab.bench import encodings, throughput
from cape.lab.bench.memory import cuda_peak_bytes, saved_bytes
from cape.lab.bench.results import machine, markdown_table, write_results


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# -- saved_bytes ------------------------------------------------------------------------------
def test_saved_bytes_counts_what_autograd_keeps() -> None:
    x = torch.randn(8, 16, requires_grad=True)
    y = torch.randn(8, 16, requires_grad=True)
    assert saved_bytes(lambda: x + y) == 0  # an add keeps nothing for its backward
    assert saved_bytes(lambda: x * y) == 2 * x.numel() * 4  # a product keeps both factors
    assert saved_bytes(lambda: x * y, exclude=[x]) == y.numel() * 4
    # sin(2x) keeps its input 2x, a fresh [8, 16] float32 buffer, even with x excluded
    assert saved_bytes(lambda: (2 * x).sin(), exclude=[x]) == x.numel() * 4
    # the same storage saved twice counts once
    assert saved_bytes(lambda: x * x) == x.numel() * 4


def test_cuda_peak_is_none_off_cuda() -> None:
    assert cuda_peak_bytes(lambda: torch.ones(3), torch.device("cpu")) is None


# -- results ----------------------------------------------------------------------------------
def test_write_results_writes_markdown_and_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"case": "a|b", "ms": 1.23456, "n": 3}, {"case": "c", "ms": 2.0, "n": 4}]
    text = write_results(
        tmp_path,
        "demo",
        rows,
        title="Demo",
        columns=["case", "ms"],
        meta={"device": "cpu", "dtype": "fp32"},
        notes="a note",
    )
    assert text in capsys.readouterr().out
    md = (tmp_path / "demo.md").read_text()
    assert md == text and md.startswith("# Demo\n\n- device: cpu\n- dtype: fp32\n")
    assert "| a\\|b | 1.23 |" in md and "a note" in md
    got = _csv(tmp_path / "demo.csv")
    assert got == [
        {"case": "a|b", "ms": "1.23456", "n": "3", "device": "cpu", "dtype": "fp32"},
        {"case": "c", "ms": "2.0", "n": "4", "device": "cpu", "dtype": "fp32"},
    ]
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_results_reject_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rows"):
        write_results(tmp_path, "x", [], title="t", columns=["a"])
    with pytest.raises(ValueError, match="missing \\['b'\\]"):
        markdown_table([{"a": 1}], ["a", "b"])
    with pytest.raises(ValueError, match="columns"):
        markdown_table([{"a": 1}], [])


def test_machine_names_torch_and_device() -> None:
    info = machine("cpu")
    assert info["device"] == "cpu" and info["torch"] == torch.__version__
    assert int(info["threads"]) == torch.get_num_threads()


# -- cape bench encodings ---------------------------------------------------------------------
def test_every_encoding_has_a_case() -> None:
    names = {c.name.split(" ")[0] for c in encodings.CASES}
    assert {
        "cape1d",
        "cape2d",
        "sinpos",
        "sinpos2d",
        "abspos",
        "abspos2d",
        "lff",
        "rotary",
    } <= names
    assert {c.family for c in encodings.CASES} == {"text", "audio", "vit"}
    # eager add_to within 2.2x the table add at T1000 and 14x14, 2.5x at T100; the fused
    # (compiled) path within 1.8x for the sinusoids and the rotary family, 2.5x for CAPE1d at
    # T100 (the default path at that size)
    targets = {(c.name, c.shape): c.target for c in encodings.CASES if c.target is not None}
    assert targets[("cape1d train, all aug", (32, 1000, 512))] == 2.2
    assert targets[("cape1d train, all aug", (32, 100, 512))] == 2.5
    assert targets[("cape2d train, all aug", (64, 14, 14, 768))] == 2.2
    fused = {(c.name, c.shape) for c in encodings.CASES if c.compiled_target == 1.8}
    assert {
        ("cape1d train, all aug", (32, 1000, 512)),
        ("rotary", (32, 1000, 512)),
        ("cape2d train, all aug", (64, 14, 14, 768)),
        ("sine-2d train, all aug", (64, 14, 14, 768)),
        ("rotary (2d)", (64, 14, 14, 768)),
    } == fused
    assert {(c.name, c.shape) for c in encodings.CASES if c.compiled_target == 2.5} == {
        ("cape1d train, all aug", (32, 100, 512))
    }
    # the sine alone is timed where CAPE trains (the floor of its targets), nowhere else
    floors = {(c.name, c.family) for c in encodings.CASES if c.floor}
    assert floors == {(c.name, c.family) for c in encodings.CASES if "train, all aug" in c.name}


def test_verdict_meets_a_target_under_its_floor_within_1_2x() -> None:
    assert encodings._verdict(2.4, 2.5) == "<= 2.5 ok"
    assert encodings._verdict(2.6, 2.5) == "<= 2.5 MISSED"
    assert encodings._verdict(2.6, 2.5, floor=2.2) == "<= 2.5 ok: 1.18x its floor"
    assert encodings._verdict(2.7, 2.5, floor=2.2) == "<= 2.5 MISSED"  # 1.23x
    assert encodings._verdict(float("nan"), 2.5, floor=2.0) == "<= 2.5 MISSED"  # not run
    assert encodings._verdict(9.0, None, floor=2.0) == ""


@pytest.mark.parametrize("family", ["text", "audio", "vit"])
def test_floor_is_the_same_embedding_without_the_draws(family: str) -> None:
    # the floor adds the embedding of the positions the call starts from, unaugmented: the
    # encoding's own x + enc(x) (its cached-table path) once its augmentation is taken away
    case = next(c for c in encodings.CASES if c.floor and c.family == family)
    shape = (2, *case.shape[1:])
    x = torch.randn(shape, requires_grad=True)
    enc = case.make(shape[-1]).eval()
    plain = case.make(shape[-1]).eval()
    plain.augmentation = None
    expected = case.outputs(plain, x)[0].detach()
    captured: list[torch.Tensor] = []
    finish = enc.finish
    enc.finish = lambda *a: captured.append(finish(*a).detach()) or finish(*a)  # type: ignore[method-assign]
    for run in encodings._floor(case, enc, x):
        run()
    assert len(captured) == 2
    for out in captured:
        # phases up to ~1000 rad: float32 rounds them by ~6e-5 (eager and compiled sines differ)
        torch.testing.assert_close(out.reshape(expected.shape), expected, rtol=0, atol=2e-4)


def test_bench_encodings_rows(tmp_path: Path) -> None:
    assert (
        encodings.main(
            ["--families", "vit,audio", "--runs", "3", "--scale", "0.02", "--out", str(tmp_path)]
        )
        == 0
    )
    rows = _csv(tmp_path / "encodings.csv")
    cases = [c for c in encodings.CASES if c.family in ("vit", "audio") and not c.peer]
    assert [r["case"] for r in rows] == [c.name for c in cases]
    for r in rows:
        assert float(r["ratio"]) == pytest.approx(float(r["encoding_ms"]) / float(r["table_ms"]))
        assert r["cpu"] and r["torch"] == torch.__version__ and r["dtype"] == "fp32"
        assert math.isnan(float(r["peak_mib"]))  # CUDA only
    by = {r["case"]: r for r in rows}
    # CAPE's phases do not depend on parameters: nothing is kept for the backward
    assert float(by["cape2d train, all aug"]["saved_mib"]) == 0.0
    # LFF keeps its MLP's activations ([B, T, hidden] at least)
    b = int(by["lff + mlp (2d)"]["shape"].split("x")[0])
    assert float(by["lff + mlp (2d)"]["saved_mib"]) * 2**20 >= b * 196 * 32 * 4
    # the compiled kernel runs where one exists (a compiler is present here), never for tables
    for name in ("cape2d train, all aug", "sine-2d train, all aug", "rotary (2d)"):
        assert float(by[name]["compiled_ms"]) > 0, name
        assert by[name]["compiled_target"].startswith("<= 1.8 ")
    for name in ("cape2d eval", "abspos2d", "lff + mlp (2d)"):
        assert math.isnan(float(by[name]["compiled_ms"])), name
    assert by["cape2d eval"]["target"].startswith("<= 1.3 ")
    # the floor: timed for CAPE in training on both paths, no cheaper than the table add
    for key in ("floor_ratio", "compiled_floor_ratio"):
        assert 0.5 < float(by["cape2d train, all aug"][key]) < math.inf, key
    assert math.isnan(float(by["cape2d eval"]["floor_ratio"]))


def test_bench_encodings_peers(tmp_path: Path) -> None:
    argv = ["--peers", "--families", "vit,audio", "--runs", "1", "--scale", "0.02"]
    assert encodings.main([*argv, "--out", str(tmp_path)]) == 0
    rows = {r["case"]: r for r in _csv(tmp_path / "encodings.csv")}
    assert set(rows) == {"alibi", "fire", "rope-axial (2d)", "rope-mixed (2d)"}
    # ALiBi has no parameters (nothing kept for a backward); FIRE keeps its MLP's activations
    # over the T x T distances of one shared bias: [1, T, T, hidden] at least, T = 333
    assert float(rows["alibi"]["saved_mib"]) == 0.0
    assert float(rows["fire"]["saved_mib"]) * 2**20 >= 333 * 333 * 32 * 4
    for name in ("alibi", "fire"):  # a bias: no kernel to fuse
        assert math.isnan(float(rows[name]["compiled_ms"]))
    papers = {c.name for c in encodings.CASES if not c.peer}
    assert not papers & set(rows)


def test_bench_encodings_rejects_bad_flags() -> None:
    for argv in (["--families", "video"], ["--runs", "0"], ["--scale", "2"]):
        with pytest.raises(SystemExit) as err:
            encodings.main(argv)
        assert err.value.code == 2


# -- cape bench throughput --------------------------------------------------------------------
def test_bench_throughput_vit(tmp_path: Path) -> None:
    assert (
        throughput.main(
            ["vit", "--sizes", "8,16", "--batch", "2", "--runs", "1", "--out", str(tmp_path)]
        )
        == 0
    )
    rows = _csv(tmp_path / "throughput-vit-experiment.csv")
    assert [(r["position"], int(r["size"])) for r in rows] == [
        (p, s) for s in (8, 16) for p in throughput.VIT_POSITIONS
    ]
    for r in rows:
        assert int(r["tokens"]) == (int(r["size"]) // 4) ** 2
        assert float(r["images_per_s"]) == pytest.approx(2 / (float(r["median_ms"]) / 1e3))
    assert (tmp_path / "throughput-vit-experiment.png").stat().st_size > 0


def test_bench_throughput_asr(tmp_path: Path) -> None:
    assert (
        throughput.main(
            [
                "asr",
                "--hops",
                "10,20",
                "--seconds",
                "1",
                "--batch",
                "2",
                "--runs",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    rows = _csv(tmp_path / "throughput-asr.csv")
    assert [(r["position"], float(r["hop_ms"])) for r in rows] == [
        (p, h) for h in (10.0, 20.0) for p in ("cape1d", "relpos")
    ]
    for r in rows:
        hop = round(float(r["hop_ms"]) * 16)  # samples at 16 kHz
        assert int(r["frames"]) == 1 + (16000 - 400) // hop  # 25 ms window
        assert int(r["model_frames"]) == -(-int(r["frames"]) // 3)  # kernel 7, stride 3, padded
        assert float(r["audio_s_per_s"]) == pytest.approx(2.0 / (float(r["median_ms"]) / 1e3))
    assert (tmp_path / "throughput-asr.png").stat().st_size > 0


def test_bench_throughput_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="multiples of the patch 16"):
        throughput.vit_throughput("tiny", [100])
    for argv in (["vit", "--sizes", "a"], ["vit", "--sizes", "0"], ["asr", "--hops", "-1"]):
        with pytest.raises(SystemExit) as err:
            throughput.main(argv)
        assert err.value.code == 2
