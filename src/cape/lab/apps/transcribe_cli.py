"""`cape transcribe`: the command line of `cape.lab.apps.transcribe` (print each WAV file's
text, or score a folder against a transcript list). Every input is checked before the model is
loaded; a mistake raises UsageError (or FileNotFoundError) naming the file, line or flag. Of
several WAV files, the ones that cannot be read (damaged, truncated, empty) are skipped, the
others transcribed, and the bad ones listed at the end with their reasons (RunError: exit 1);
when none can be read, that is a mistake (UsageError: exit 2)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cape.lab.apps.transcribe import (
    SPEC_FILE,
    evaluate_folder,
    load_asr_model,
    load_audio,
    read_transcripts,
    transcribe,
)
from cape.lab.arguments import ArgumentParser, check_out_file
from cape.lab.errors import RunError, UsageError
from cape.lab.io import write_json

__all__ = ["main"]


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.2f}"


def _table(result: dict[str, Any]) -> str:
    """Markdown table: WER/CER % per duration bin, then all utterances."""
    lines = ["| duration (s) | utterances | WER % | CER % |", "|---|---:|---:|---:|"]
    for b in result["bins"]:
        lines.append(
            f"| {b['low']:g}-{b['high']:g} | {b['count']} | {_pct(b['wer'])} | {_pct(b['cer'])} |"
        )
    lines.append(
        f"| all ({result['seconds']:.1f} s) | {result['utterances']} | "
        f"{_pct(result['wer'])} | {_pct(result['cer'])} |"
    )
    return "\n".join(lines)


def _audio_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.wav"))
            if not found:
                raise ValueError(f"audio folder {p} holds no .wav file")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"no such audio file or folder: {p}")
    return files


def _audio_problem(file: Path) -> str | None:
    """Why `file` is not a WAV file that can be transcribed (read from its header: before the
    model is loaded), naming it; None when it looks whole."""
    import soundfile

    from cape.lab.data.speech.audio import wav_truncation

    if file.stat().st_size == 0:
        return f"{file} is an empty file (0 bytes); give WAV files"
    try:
        frames = soundfile.info(str(file)).frames
        cut = wav_truncation(file)
    except Exception as e:  # soundfile raises LibsndfileError, RuntimeError, ...
        reason = " ".join(str(e).split()) or type(e).__name__
        return f"{file} is not a readable WAV file ({reason}); give WAV files"
    if frames == 0:
        return f"{file} holds no audio samples; give WAV files with speech"
    if cut is not None:
        return f"WAV file {file} is truncated: {cut}"
    return None


def _check_audio(files: list[Path]) -> dict[Path, str]:
    """{file: why} of the files that cannot be transcribed; UsageError naming them when no
    file can be (nothing to do: a mistake in the command)."""
    bad = {f: why for f in files if (why := _audio_problem(f)) is not None}
    if len(bad) == len(files):
        raise UsageError("; ".join(bad.values()))
    return bad


def _transcribe_files(
    files: list[Path], bad: dict[Path, str], model: Any, spec: dict[str, Any], args: Any
) -> None:
    """Print `name<TAB>text` for each file not in `bad` as it goes; a file that fails to load
    joins `bad`. RunError listing every bad file, after the good ones are printed."""
    feat = spec["features"]
    for file in files:
        if file in bad:
            continue
        try:
            wave = load_audio(file, feat["sample_rate"], win_ms=feat["win_ms"])
        except (OSError, ValueError) as e:  # its message names the file
            bad[file] = str(e)
            continue
        text = transcribe(model, spec, [wave], hop_ms=args.hop_ms, beam=args.beam)[0]
        print(f"{file}\t{text}", flush=True)  # as it goes: long lists show progress
    if bad:
        listed = "; ".join(bad[f] for f in files if f in bad)
        raise RunError(
            f"{len(bad)} of {len(files)} WAV file(s) could not be transcribed (the others are "
            f"printed above): {listed}"
        )


def main(argv: list[str]) -> int:
    """`cape transcribe MODEL AUDIO...`: print `name<TAB>text` per WAV file, or with
    `--transcripts TSV` score one folder and print WER/CER per duration bin. Returns 0; raises
    ValueError for bad usage, RunError listing the WAV files that could not be transcribed."""
    p = ArgumentParser(
        prog="cape transcribe", description="Transcribe WAV files with a trained CTC model."
    )
    p.add_argument("model", help="run folder (with model.json) or one of its checkpoint folders")
    p.add_argument("audio", nargs="+", help="WAV files or folders (their *.wav, sorted)")
    p.add_argument("--checkpoint", default=None, help="best (default), latest or a checkpoint name")
    p.add_argument("--beam", type=int, default=0, help="beam width; 0 = greedy (default)")
    p.add_argument("--hop-ms", type=float, default=None, help="STFT hop (default: the model's)")
    p.add_argument("--transcripts", default=None, help="TSV of name<TAB>text: score one folder")
    p.add_argument("--out", default=None, help="with --transcripts: write the scores as JSON")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    args = p.parse_args(argv)
    if args.beam < 0:
        raise ValueError(f"--beam must be >= 0 (0 = greedy), got {args.beam}")
    if args.hop_ms is not None and not (math.isfinite(args.hop_ms) and args.hop_ms > 0):
        raise ValueError(f"--hop-ms must be a number > 0, got {args.hop_ms}")
    if args.out is not None and args.transcripts is None:
        raise ValueError("--out needs --transcripts (it writes the scores)")
    model_path = Path(args.model)
    if args.checkpoint is not None and not (model_path / SPEC_FILE).is_file():
        raise ValueError(f"--checkpoint needs a run folder (with {SPEC_FILE}), got {model_path}")
    # every input is checked before the model is loaded: a mistake costs no waiting
    if args.out is not None:
        check_out_file(args.out, "--out")
    if args.transcripts is None:
        files = _audio_files(args.audio)
        bad = _check_audio(files)
    elif len(args.audio) != 1 or not Path(args.audio[0]).is_dir():
        raise ValueError(f"with --transcripts, audio must be one folder, got {args.audio}")
    else:
        read_transcripts(args.transcripts)  # its errors name the line
    model, spec = load_asr_model(
        model_path, checkpoint=args.checkpoint or "best", device=args.device
    )
    feat = spec["features"]
    if args.transcripts is None:
        _transcribe_files(files, bad, model, spec, args)
        return 0
    result = evaluate_folder(
        model, spec, args.audio[0], args.transcripts, hop_ms=args.hop_ms, beam=args.beam
    )
    print(_table(result))
    if result["unlisted"]:
        print(
            f"({result['unlisted']} WAV file(s) in {args.audio[0]} not in "
            f"{args.transcripts}: ignored)"
        )
    if args.out is not None:
        settings = {
            "model": str(model_path),
            "checkpoint": spec["checkpoint"],
            "hop_ms": args.hop_ms or feat["hop_ms"],
            "beam": args.beam,
        }
        write_json(args.out, {"settings": settings, **result})  # an empty bin's NaN -> null
        print(f"scores -> {args.out}")
    return 0
