"""One utterance of the speech corpus on disk: whether it is complete (its WAV matches the size
and CRC-32 of its JSON record) and making it (WAV, then record, each written atomically)."""

from __future__ import annotations

import json
from pathlib import Path

from cape.lab.data.speech.audio import write_wav
from cape.lab.data.speech.synth import SAMPLE_RATE, UtteranceParams, synthesize_utterance
from cape.lab.io import atomic_write, crc32, write_json

__all__: list[str] = []


def _existing(root: Path, params: UtteranceParams) -> tuple[dict | None, str | None]:
    """(record, None) when the utterance is complete on disk, (None, why) when it must be made;
    why is None for a plainly missing one, else names the defect."""
    wav = root / params.split / f"{params.name}.wav"
    meta = wav.with_suffix(".json")
    if not meta.is_file():
        return None, None if not wav.exists() else f"{wav}: no record (unfinished)"
    try:
        record = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return None, f"{meta}: unreadable record ({e})"
    if not wav.is_file():
        return None, f"{wav}: missing"
    if record.get("voice") != params.voice or record.get("seed") != params.seed:
        return None, f"{meta}: made with other parameters"
    size = wav.stat().st_size
    if size != record.get("bytes"):
        return None, f"{wav}: {size} bytes, its record says {record.get('bytes')}"
    if crc32(wav) != record.get("crc32"):
        return None, f"{wav}: corrupt (checksum differs from its record)"
    return record, None


def _make_one(job: tuple[str, UtteranceParams]) -> tuple[dict, str, str | None]:
    """Make (or keep) one utterance -> (record, "made" | "kept", defect that was repaired)."""
    root, params = Path(job[0]), job[1]
    record, defect = _existing(root, params)
    if record is not None:
        return record, "kept", None
    wave, record = synthesize_utterance(params, cache_dir=root / "cache")
    wav = root / params.split / f"{params.name}.wav"
    atomic_write(wav, lambda tmp: write_wav(tmp, wave, SAMPLE_RATE))
    record["crc32"] = crc32(wav)
    record["bytes"] = wav.stat().st_size
    write_json(wav.with_suffix(".json"), record)
    return record, "made", defect
