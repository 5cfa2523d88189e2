"""Failures a run meets on the machine or in the user's files, each one line through `cape`:
a full disk (exit 1, the folder and the bytes), a damaged image or an empty class folder in an
image folder, a truncated WAV file, and `cape transcribe` over a folder with a bad file in it
(the good files transcribed, the bad ones listed at the end, exit 1)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cape.lab import cli
from cape.lab.errors import DiskFull
from cape.lab.io import disk_full_named, write_json

TORCH_FULL = (
    "[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
    "data/2: file write failed"
)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    """(exit code, stdout, stderr lines) of `cape ARGV` in this process."""
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err.splitlines()


def _one_line(err: list[str], prog: str, *fragments: str) -> None:
    assert len(err) == 1 and err[0].startswith(f"{prog}: error: "), err
    for fragment in fragments:
        assert fragment in err[0], (fragment, err[0])


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


# ---------------------------------------------------------------------------------- a full disk


def test_a_full_disk_while_rendering_names_the_folder(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("CAPE_DEBUG", raising=False)
    monkeypatch.setattr(np, "savez_compressed", _no_space)
    root = tmp_path / "chars"
    argv = ["data", "chars", "--root", str(root), "--sizes", "8", "--train", "2", "--val", "1"]
    code, _, err = _run([*argv, "--test", "1", "--native", "1", "--workers", "1"], capsys)
    assert code == 1
    _one_line(err, "cape data chars", f"no space left on the disk of '{root}/", "free)", "run the")
    assert not [p for p in root.rglob("*") if ".tmp-" in p.name]  # nothing half-written left


def test_a_full_disk_names_the_bytes_being_written(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("CAPE_DEBUG", raising=False)
    monkeypatch.setattr("cape.lab.io._write_str", _no_space)
    root = tmp_path / "speech"  # corpus.json is its first write
    argv = ["data", "speech", "--root", str(root), "--train", "1", "--val", "0"]
    code, _, err = _run([*argv, "--test-per-bin", "0"], capsys)
    assert code == 1
    _one_line(err, "cape data speech", f"no space left on the disk of '{root}' (", "B needed, ")


def test_torchs_full_disk_error_is_one_line(monkeypatch, capsys) -> None:
    monkeypatch.delenv("CAPE_DEBUG", raising=False)

    def crash(args, rest):
        raise RuntimeError(TORCH_FULL)

    monkeypatch.setattr(cli, "_encodings", crash)
    code, _, err = _run(["encodings"], capsys)
    assert code == 1
    _one_line(err, "cape encodings", "no space left on the disk (", "run the command again")
    assert "unexpected" not in err[0]


def test_a_full_disk_during_training_names_the_run_folder(tmp_path) -> None:
    with pytest.raises(DiskFull, match=f"no space left on the disk of '{tmp_path}'"):
        with disk_full_named(tmp_path):
            torch.save({"x": 1}, str(tmp_path / "a.pt"))  # works
            raise RuntimeError(TORCH_FULL)  # what torch.save raises on a full disk
    with pytest.raises(RuntimeError, match="PytorchStreamReader"):  # a read error passes
        with disk_full_named(tmp_path):
            raise RuntimeError("PytorchStreamReader failed reading zip archive")


def test_write_json_on_a_full_disk_leaves_the_old_file(tmp_path, monkeypatch) -> None:
    path = write_json(tmp_path / "results.json", {"a": 1})
    monkeypatch.setattr("cape.lab.io._write_str", _no_space)
    with pytest.raises(DiskFull) as caught:
        write_json(path, {"a": 2})
    assert caught.value.folder == tmp_path and caught.value.needed == len('{\n  "a": 2\n}\n')
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


# ----------------------------------------------------------------------------- a user's images


def _image_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(5):
            pixels = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / c / f"{i}.png")
    return root


def _vision(root: Path, out: Path) -> list[str]:
    return ["experiment", "vision", "--set", f"data.source={root}", "--out", str(out)]


def test_a_truncated_image_is_named(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("CAPE_DEBUG", raising=False)
    root = _image_folder(tmp_path / "images")
    bad = root / "cat" / "0.png"
    bad.write_bytes(bad.read_bytes()[:80])
    code, _, err = _run(_vision(root, tmp_path / "run"), capsys)
    assert code == 1
    _one_line(err, "cape experiment", f"image '{bad}' is damaged", "truncated", "remove it")


def test_a_class_folder_without_images_is_named(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("CAPE_DEBUG", raising=False)
    root = _image_folder(tmp_path / "images")
    (root / "empty").mkdir()
    (root / "empty" / "notes.txt").write_text("no images here\n")
    (root / ".ipynb_checkpoints").mkdir()  # hidden: not a class, no error
    code, _, err = _run(_vision(root, tmp_path / "run"), capsys)
    assert code == 2
    _one_line(err, "cape experiment", f"class folder '{root / 'empty'}' holds no images")


# ------------------------------------------------------------------------------- WAV files


def _truncated_wav(path: Path, seconds: float) -> Path:
    from cape.lab.data.speech.audio import write_wav

    write_wav(path, np.full(int(16000 * seconds), 0.1, np.float32), 16000)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 3])
    return path


def test_a_truncated_wav_is_named_with_what_is_missing(tmp_path) -> None:
    pytest.importorskip("soundfile")
    from cape.lab.data.speech.audio import read_wav, wav_truncation

    wav = _truncated_wav(tmp_path / "cut.wav", 7.4)
    assert wav_truncation(wav).startswith("its header says 7.40 s (118400 frames), the file holds")
    with pytest.raises(ValueError, match=f"WAV file {wav} is truncated: its header says 7.40 s"):
        read_wav(wav)


def test_transcribe_a_folder_transcribes_the_good_and_lists_the_bad(
    tmp_path, monkeypatch, capsys
) -> None:
    pytest.importorskip("soundfile")
    from test_asr_inference import _make_run, _noise

    from cape.lab.data.speech.audio import write_wav

    monkeypatch.delenv("CAPE_DEBUG", raising=False)
    run, _, _ = _make_run(tmp_path)
    folder = tmp_path / "wavs"
    folder.mkdir()
    write_wav(folder / "a.wav", _noise(0.5, seed=1), 16000)
    write_wav(folder / "d.wav", _noise(0.5, seed=2), 16000)
    cut = _truncated_wav(folder / "b.wav", 7.4)
    (folder / "c.wav").write_bytes(b"not audio at all\n")
    code, out, err = _run(["transcribe", str(run), str(folder)], capsys)
    assert code == 1
    assert [line.split("\t")[0] for line in out.splitlines()] == [
        str(folder / "a.wav"),
        str(folder / "d.wav"),
    ]
    _one_line(
        err,
        "cape transcribe",
        "2 of 4 WAV file(s) could not be transcribed",
        f"WAV file {cut} is truncated: its header says 7.40 s",
        f"{folder / 'c.wav'} is not a readable WAV file",
    )
