"""Transcribe users' audio with a trained CTC model, and score it against reference transcripts.

A trained run folder holds `model.json` ({"model": CTCModel keywords, "features": {"sample_rate",
"n_mels", "win_ms", "hop_ms"}}) and `checkpoints/` (see `cape.lab.train.checkpoint`):

    model, spec = load_asr_model("runs/asr/cape1d")            # best/, else the newest step
    wave = load_audio("talk.wav", spec["features"]["sample_rate"])  # mono, resampled  [S]
    print(transcribe(model, spec, [wave])[0])
    result = evaluate_folder(model, spec, "my_wavs", "my_wavs/transcripts.tsv")

Utterances are decoded one at a time (batch size 1, as CAPE evaluates), so no padding can change
a result. `cape transcribe` (`cape.lab.apps.transcribe_cli`) is the command-line front end.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch

from cape._checks import check_float, check_int, check_tensor
from cape.lab.apps.device import inference_device
from cape.lab.data.speech.audio import read_wav, resample
from cape.lab.data.speech.features import _samples, frame_hop_seconds, log_mel
from cape.lab.data.speech.tokens import VOCAB_SIZE, ctc_beam_decode, ctc_greedy_decode
from cape.lab.data.text.sentences import normalize_text
from cape.lab.io import read_json_object
from cape.lab.metrics import DURATION_BINS, cer, wer, wer_by_bin
from cape.lab.train.checkpoint import (
    MODEL_FILE,
    STATE_FILE,
    is_checkpoint,
    load_checkpoint,
    pick_checkpoint,
)
from cape.models.asr import CTCModel

__all__ = [
    "load_asr_model",
    "load_audio",
    "transcribe",
    "read_transcripts",
    "evaluate_folder",
]

SPEC_FILE = "model.json"
_FEATURE_KEYS = ("sample_rate", "n_mels", "win_ms", "hop_ms")


# -- model -------------------------------------------------------------------------------------
def _read_spec(file: Path) -> dict[str, Any]:
    """model.json -> spec, checked enough that errors name the file rather than a deep KeyError."""
    if not file.is_file():
        raise FileNotFoundError(f"no model description {file}: is this a trained run folder?")
    spec = read_json_object(file)
    if not isinstance(spec.get("model"), dict):
        raise ValueError(f'{file} must hold an object with a "model" object (CTCModel keywords)')
    features = spec.get("features")
    if not isinstance(features, dict) or any(k not in features for k in _FEATURE_KEYS):
        raise ValueError(f'{file} must hold a "features" object with keys {list(_FEATURE_KEYS)}')
    try:
        check_int("features.sample_rate", features["sample_rate"])
        check_int("features.n_mels", features["n_mels"])
        check_float("features.win_ms", features["win_ms"], strict=True)
        check_float("features.hop_ms", features["hop_ms"], strict=True)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{file}: {e}") from e
    return spec


def load_asr_model(
    path: str | Path, *, checkpoint: str = "best", device: str | torch.device = "cpu"
) -> tuple[CTCModel, dict[str, Any]]:
    """Rebuild a trained CTCModel -> (model in eval mode on `device`, spec).

    path: a run folder (holding model.json and checkpoints/) or one checkpoint folder
    (RUN/checkpoints/<name>, whose model.json is two levels up; `checkpoint` is then unused).
    checkpoint: "best" (best/, or the newest step when there is none), "latest", or the name of
    a folder in RUN/checkpoints. The spec is model.json's content plus "checkpoint": the folder
    the weights came from.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model must be a run folder or a checkpoint folder, got {path}")
    if (path / SPEC_FILE).is_file():
        spec_file, ckpt = path / SPEC_FILE, pick_checkpoint(path / "checkpoints", checkpoint)
    elif is_checkpoint(path):
        spec_file, ckpt = path.parent.parent / SPEC_FILE, path
    else:
        raise FileNotFoundError(
            f"{path} holds neither {SPEC_FILE} (a run folder) nor {MODEL_FILE} + {STATE_FILE} "
            "(a checkpoint folder)"
        )
    device = inference_device(device)
    spec = _read_spec(spec_file)
    try:
        model = CTCModel(**spec["model"])
    except (TypeError, ValueError) as e:
        raise ValueError(f'{spec_file}: "model" is not valid CTCModel keywords: {e}') from e
    if model.n_mels != spec["features"]["n_mels"]:
        raise ValueError(
            f"{spec_file}: model n_mels {model.n_mels} != features n_mels "
            f"{spec['features']['n_mels']}"
        )
    try:
        load_checkpoint(ckpt, model)
    except RuntimeError as e:  # missing/unexpected keys or shape mismatches
        raise ValueError(f"weights in {ckpt} do not fit the model in {spec_file}: {e}") from e
    return model.to(device).eval(), {**spec, "checkpoint": str(ckpt)}


# -- audio -------------------------------------------------------------------------------------
def load_audio(path: str | Path, sample_rate: int, *, win_ms: float = 25.0) -> torch.Tensor:
    """Read a WAV file -> wave [S] float32 at `sample_rate` Hz, channels averaged.

    Raises FileNotFoundError for a missing file and ValueError naming the file when it cannot
    be read, holds NaN/inf, or is shorter than one STFT window of `win_ms` after resampling.
    """
    path = Path(path)
    check_int("sample_rate", sample_rate)
    wave, sr = read_wav(path, mix=True)  # its errors name the file; channels averaged
    if not np.all(np.isfinite(wave)):
        raise ValueError(f"WAV file {path} holds NaN or infinite samples")
    if sr != sample_rate:
        try:
            wave = resample(wave, int(sr), sample_rate)
        except ValueError as e:
            raise ValueError(f"cannot resample {path} from {sr} to {sample_rate} Hz: {e}") from e
    win = _samples("win_ms", win_ms, sample_rate)
    if len(wave) < win:
        raise ValueError(
            f"WAV file {path} is too short: {len(wave)} samples at {sample_rate} Hz, the model "
            f"needs at least one {win_ms} ms window ({win} samples)"
        )
    return torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))


# -- decoding ----------------------------------------------------------------------------------
def transcribe(
    model: CTCModel,
    spec: dict[str, Any],
    waves: Sequence[torch.Tensor],
    *,
    hop_ms: float | None = None,
    beam: int = 0,
) -> list[str]:
    """waves: N waves [S_i] at spec's sample rate -> N transcripts (lower-case words).

    Each wave alone: log-mel [1, F, n_mels] at the spec's window and hop (`hop_ms` overrides the
    hop; the model gets the real hop in seconds, so its positions stay in seconds), the model,
    then greedy decoding (beam=0) or CTC prefix beam search of width `beam`. The model runs in
    eval mode (its previous mode is restored afterwards).
    """
    if isinstance(waves, torch.Tensor):
        raise TypeError("waves must be a sequence of 1-D tensors; wrap a single wave in a list")
    check_int("beam", beam, minimum=0)
    feat = spec["features"]
    sr = feat["sample_rate"]
    hop = feat["hop_ms"] if hop_ms is None else check_float("hop_ms", hop_ms, strict=True)
    hop_s = frame_hop_seconds(hop, sr)  # the hop in whole samples, as training used it
    if model.vocab_size != VOCAB_SIZE:
        raise ValueError(
            f"the model must output the {VOCAB_SIZE} letter classes, has {model.vocab_size}"
        )
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()  # dropout / layer drop would make decoding random
    texts: list[str] = []
    try:
        with torch.inference_mode():
            for i, wave in enumerate(waves):
                check_tensor(f"waves[{i}]", wave, ndims=(1,), floating=True)
                try:
                    feats = log_mel(
                        wave.to(device),
                        sr,
                        hop_ms=hop,
                        win_ms=feat["win_ms"],
                        n_mels=feat["n_mels"],
                    )
                except ValueError as e:
                    raise ValueError(f"waves[{i}]: {e}") from e
                log_probs, lengths = model(feats[None], hop=hop_s)  # [1, T', V], [1]
                if beam:
                    texts += ctc_beam_decode(log_probs, lengths.cpu(), beam_width=beam)
                else:
                    texts += ctc_greedy_decode(log_probs, lengths.cpu())
    finally:
        model.train(was_training)
    return texts


# -- reference transcripts and scoring ---------------------------------------------------------
def read_transcripts(path: str | Path) -> dict[str, str]:
    """A TSV of `name<TAB>text` lines -> {name without ".wav": normalised text}, in file order.

    Names are WAV files relative to the audio folder (".wav" optional); blank lines and lines
    starting with "#" are skipped; text goes through `normalize_text` (numbers spelled out,
    punctuation dropped). ValueError names the file and line for a line without a tab, an empty
    or absolute name, a name with "..", and a repeated name.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"transcripts {path} is a folder; give a TSV file of name<TAB>text lines")
    if not path.is_file():
        raise FileNotFoundError(f"no such transcripts file: {path}")
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: Windows editors add a BOM
    except UnicodeDecodeError as e:
        raise ValueError(f"transcripts {path} is not UTF-8 text: {e}") from e
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}, line {number}"
        if "\t" not in line:
            raise ValueError(f"{where}: expected 'name<TAB>text', found no tab: {line!r}")
        raw, text = line.split("\t", 1)
        name = raw.strip().removesuffix(".wav")
        if not name:
            raise ValueError(f"{where}: empty name (the WAV file's name before the tab)")
        parts = PurePosixPath(name).parts
        if PurePosixPath(name).is_absolute() or ".." in parts:
            raise ValueError(f"{where}: the name must be relative to the audio folder, got {raw!r}")
        if name in seen:
            raise ValueError(f"{where}: duplicate name {name!r} (first on line {seen[name]})")
        seen[name] = number
        out[name] = normalize_text(text)
    return out


def evaluate_folder(
    model: CTCModel,
    spec: dict[str, Any],
    folder: str | Path,
    transcripts_path: str | Path,
    *,
    bins: Sequence[tuple[float, float]] = DURATION_BINS,
    hop_ms: float | None = None,
    beam: int = 0,
) -> dict[str, Any]:
    """Transcribe every WAV listed in the transcripts TSV (see `read_transcripts`) and score it.

    Every listed name must have `folder/<name>.wav` (all missing ones are named in one
    FileNotFoundError); other WAVs in the folder are ignored but counted ("unlisted"). Returns
    {"utterances", "seconds", "wer", "cer" (corpus-level fractions), "bins" (`wer_by_bin` over
    the durations in seconds), "items": [{"name", "duration", "ref", "hyp"}], "unlisted"}.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no such audio folder: {folder}")
    refs = read_transcripts(transcripts_path)
    if not refs:
        raise ValueError(f"{transcripts_path} lists no utterance")
    files = {name: folder / f"{name}.wav" for name in refs}
    missing = [str(f) for f in files.values() if not f.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} WAV file(s) listed in {transcripts_path} are not in {folder}: "
            + ", ".join(missing)
        )
    listed = {f.resolve() for f in files.values()}
    unlisted = sum(1 for f in folder.rglob("*.wav") if f.resolve() not in listed)
    feat = spec["features"]
    items = []
    for name, file in files.items():  # one at a time: a long test set never sits in memory
        wave = load_audio(file, feat["sample_rate"], win_ms=feat["win_ms"])
        hyp = transcribe(model, spec, [wave], hop_ms=hop_ms, beam=beam)[0]
        duration = len(wave) / feat["sample_rate"]
        items.append({"name": name, "duration": duration, "ref": refs[name], "hyp": hyp})
    ref_texts = [it["ref"] for it in items]
    hyp_texts = [it["hyp"] for it in items]
    try:
        total_wer, total_cer = wer(ref_texts, hyp_texts), cer(ref_texts, hyp_texts)
    except ValueError as e:  # every reference empty
        raise ValueError(f"{transcripts_path}: {e}") from e
    return {
        "utterances": len(items),
        "seconds": sum(it["duration"] for it in items),
        "wer": total_wer,
        "cer": total_cer,
        "bins": wer_by_bin([it["duration"] for it in items], ref_texts, hyp_texts, bins),
        "items": items,
        "unlisted": unlisted,
    }
