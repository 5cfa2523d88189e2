"""The offline speech corpus for the CTC experiments: WordNet text spoken by espeak-ng, on disk.

Layout under `root`:

- `corpus.json`: what the corpus was made with (seed, noise, sox, voices); a rerun must match.
- `<split>/<name>.wav`: 16 kHz mono 16-bit PCM; `<split>/<name>.json`: its record (written
  after the WAV: a WAV without a record is unfinished and is made again).
- `<split>.jsonl`: the manifest, one record per line in index order, written last.
- `cache/`: the normalised WordNet sentences.

Splits (`SPEECH_SPLITS`): train and val (one sentence each, <= 6 s), test and
test_unseen_voices (`test_per_bin` utterances in each of `DURATION_BINS`, sentences joined until
the duration falls in the bin; record["bin"] says which). test_unseen_voices speaks with
`HELDOUT_VOICES`, which share neither accent nor variant with the `TRAIN_VOICES` of the rest.
Records: name, path (relative to root), duration, num_samples, sample_rate, text (in
`cape.lab.data.text.sentences.ALPHABET`), word_starts (seconds or None, one per word), bin,
voice, rate, pitch, range, peak, snr_db, noise, reverb, tempo, seed, split, and the WAV file's
size (bytes) and CRC-32 (crc32), which `verify_corpus` checks.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from cape._checks import check_choice, check_int
from cape.lab.arguments import ArgumentParser, check_out_folder, report_error
from cape.lab.data.cache import building, fork_context, remove_leftovers
from cape.lab.data.settings import check_made_with
from cape.lab.data.speech.audio import read_wav
from cape.lab.data.speech.synth import (
    DURATION_BINS,
    HELDOUT_VOICES,
    SAMPLE_RATE,
    SNR_DB,
    SPEECH_SPLITS,
    TRAIN_VOICES,
    UtteranceParams,
    utterance_params,
)
from cape.lab.data.speech.utterance_files import _make_one
from cape.lab.data.text.sentences import TEXT_SOURCES, source_sentences
from cape.lab.errors import DamagedFile, DiskFull
from cape.lab.io import crc32, read_json, set_aside, write_json, write_text
from cape.lab.progress import progress as progress_bar  # `progress` names the on/off flag here

__all__ = [
    "CorpusError",
    "load_manifest",
    "make_speech_corpus",
    "read_wav",
    "speech_main",
    "verify_corpus",
]

_log = logging.getLogger(__name__)
_VERSION = 1
_REQUIRED = ("name", "path", "duration", "num_samples", "text")


class CorpusError(RuntimeError):
    """A speech corpus has missing or corrupt files; `problems` names each one."""

    what = "speech corpus"  # subclasses for other corpora change only this

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        shown = "\n  ".join(self.problems[:50])
        more = f"\n  ... and {len(self.problems) - 50} more" if len(self.problems) > 50 else ""
        super().__init__(f"{len(self.problems)} problem(s) in the {self.what}:\n  {shown}{more}")


def _plan(
    seed: int, counts: dict[str, int], snr_db: tuple[float, float] | None, sox: bool, source: str
) -> dict[str, list[UtteranceParams]]:
    kw = dict(snr_db=snr_db, sox=sox, source=source)
    plan: dict[str, list[UtteranceParams]] = {}
    for split in SPEECH_SPLITS:
        n = counts[split]
        if split.startswith("test"):
            plan[split] = [
                utterance_params(seed, split, i, bin_index=b, **kw)
                for b in range(len(DURATION_BINS))
                for i in range(n)
            ]
        else:
            plan[split] = [utterance_params(seed, split, i, **kw) for i in range(n)]
    return plan


def _check_config(root: Path, config: dict) -> None:
    path = root / "corpus.json"
    if path.is_file():
        try:
            old = read_json(path)
            if not isinstance(old, dict):
                raise DamagedFile(f"{path} is damaged (not a JSON object)", path)
        except DamagedFile as e:  # each utterance's own record is still checked
            set_aside(path, f"{e}; it is written again")
            return _check_config(root, config)
        old = {"text": "wordnet", **old}  # a corpus.json that names no text holds WordNet's
        check_made_with(root, "corpus", old, config, set(old) | set(config))
    else:
        write_json(path, config)


def make_speech_corpus(
    root: str | Path,
    *,
    train: int = 10_000,
    val: int = 500,
    test_per_bin: int = 100,
    seed: int = 0,
    workers: int = 2,
    snr_db: tuple[float, float] | None = SNR_DB,
    sox: bool = False,
    text: str = "wordnet",
    progress: bool = True,
) -> dict[str, dict[str, int]]:
    """Make (or finish) the speech corpus under `root`; returns {split: {"made", "kept",
    "repaired"}} counts.

    `train`/`val` utterances (<= 6 s) and `test_per_bin` utterances per duration bin in each of
    the two test splits; `seed` fixes every utterance (its text, voice, rate, pitch, noise and
    samples). `workers` processes (>= 1) synthesise in parallel. `snr_db`: (low, high) range of
    the additive white/pink noise's SNR in dB, or None for none; `sox`: random sox reverb/tempo;
    `text`: what is said, "wordnet" sentences or "digits" strings
    (`cape.lab.data.text.sentences.TEXT_SOURCES`).

    Resumable: existing complete utterances are kept, missing ones made, ones whose WAV has the
    wrong size or checksum or whose record is unreadable are made again (logged by name). Every
    file is written atomically and the manifests last, so an interrupted run loses at most the
    utterances in flight. One process builds `root` at a time (a lock in it): another waits.
    Raises ValueError when `root` holds a corpus made with another seed, noise, sox or text
    setting; CorpusError naming every utterance that could not be made.
    """
    root = Path(root)
    counts = {
        "train": check_int("train", train, minimum=0),
        "val": check_int("val", val, minimum=0),
        "test": check_int("test_per_bin", test_per_bin, minimum=0),
        "test_unseen_voices": test_per_bin,
    }
    check_int("seed", seed, minimum=0)
    check_int("workers", workers)
    check_choice("sox", sox, [True, False])
    check_choice("text", text, TEXT_SOURCES)
    if snr_db is not None:
        lo, hi = (float(v) for v in snr_db)
        if not lo <= hi:
            raise ValueError(f"snr_db must be a (low, high) pair with low <= high, got {snr_db}")
        snr_db = (lo, hi)
    config = {
        "version": _VERSION,
        "seed": seed,
        "sample_rate": SAMPLE_RATE,
        "sox": sox,
        "text": text,
        "snr_db": None if snr_db is None else list(snr_db),
        "train_voices": list(TRAIN_VOICES),
        "heldout_voices": list(HELDOUT_VOICES),
        "duration_bins": [list(b) for b in DURATION_BINS],
    }
    root.mkdir(parents=True, exist_ok=True)
    with building(root, folder=True):  # one builder; the others wait, then find it made
        remove_leftovers(root, recursive=True)  # a killed builder's temporaries
        _check_config(root, config)
        source_sentences(text, cache_dir=root / "cache")  # once here, not in every worker
        return _make(root, _plan(seed, counts, snr_db, sox, text), workers, progress)


def _make(root: Path, plan: dict[str, list[UtteranceParams]], workers: int, progress: bool):
    """Make the utterances of `plan` missing under `root`, then the manifests (lock held)."""
    jobs = [(str(root), p) for split in SPEECH_SPLITS for p in plan[split]]
    records: dict[tuple[str, str], dict] = {}
    summary = {s: {"made": 0, "kept": 0, "repaired": 0} for s in SPEECH_SPLITS}
    failures: list[str] = []

    def collect(params: UtteranceParams, result: tuple[dict, str, str | None]) -> None:
        record, status, defect = result
        records[(params.split, params.name)] = record
        summary[params.split][status] += 1
        if defect is not None:
            summary[params.split]["repaired"] += 1
            _log.warning("remade %s", defect)

    def gather(pending: Iterable[tuple[tuple[str, UtteranceParams], Callable[[], tuple]]]) -> None:
        """Collect each job's result (`get()`: made here, or awaited from the pool) in order; a
        failed job is reported by name below, a full disk stops everything."""
        for job, get in pending:
            try:
                collect(job[1], get())
            except DiskFull:
                raise
            except Exception as e:  # noqa: BLE001 - reported by name below
                failures.append(f"{job[1].split}/{job[1].name}: {type(e).__name__}: {e}")
            bar.update()

    bar = progress_bar(
        total=len(jobs), desc="speech corpus", unit="utt", enabled=progress, smoothing=0.05
    )
    try:
        if workers == 1:
            gather((job, functools.partial(_make_one, job)) for job in jobs)
        else:
            # forked workers use neither torch nor BLAS threads; get_espeak() starts afresh in each
            with fork_context().Pool(workers) as pool:
                gather([(job, pool.apply_async(_make_one, (job,)).get) for job in jobs])
    finally:
        bar.close()
    if failures:
        raise CorpusError(failures)
    for split in SPEECH_SPLITS:
        lines = [json.dumps(records[(split, p.name)], sort_keys=True) for p in plan[split]]
        write_text(root / f"{split}.jsonl", "".join(line + "\n" for line in lines))
    return summary


def load_manifest(root: str | Path, split: str, *, bin: str | None = None) -> list[dict]:
    """The records of `split` (one of `SPEECH_SPLITS`) in index order, optionally only duration
    bin `bin` ("00-06", "06-10", ...). Raises FileNotFoundError naming a missing manifest and
    ValueError naming a malformed line."""
    check_choice("split", split, SPEECH_SPLITS)
    path = Path(root) / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no manifest {path}: make the corpus with `cape data speech`")
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: malformed manifest line ({e})") from e
        missing = [k for k in _REQUIRED if not isinstance(record, dict) or k not in record]
        if missing:
            raise ValueError(f"{path}:{n}: manifest line lacks {', '.join(missing)}")
        if bin is None or record.get("bin") == bin:
            records.append(record)
    return records


def verify_corpus(
    root: str | Path, splits: Sequence[str] = SPEECH_SPLITS, *, progress: bool = False
) -> dict[str, dict[str, float]]:
    """Read every file of every manifest entry of `splits`; returns {split: {"utterances",
    "seconds"}}. Raises CorpusError naming every missing manifest and every missing or corrupt
    WAV (wrong checksum, unreadable, wrong sample rate or length) -- nothing is skipped."""
    root = Path(root)
    problems: list[str] = []
    summary: dict[str, dict[str, float]] = {}
    manifests: dict[str, list[dict]] = {}
    for split in splits:
        try:
            manifests[split] = load_manifest(root, split)
        except (FileNotFoundError, ValueError) as e:
            problems.append(str(e))
    bar = progress_bar(
        total=sum(len(m) for m in manifests.values()),
        desc="verifying",
        unit="utt",
        enabled=progress,
        smoothing=0.05,
    )
    for split, records in manifests.items():
        seconds = 0.0
        for record in records:
            bar.update()
            path = root / record["path"]
            if not path.is_file():
                problems.append(f"{path}: missing")
                continue
            if record.get("crc32") is not None and crc32(path) != record["crc32"]:
                problems.append(f"{path}: corrupt (checksum differs from the manifest)")
                continue
            try:
                wave, sr = read_wav(path)
            except (OSError, ValueError) as e:
                problems.append(f"{path}: corrupt ({e})")
                continue
            if sr != record.get("sample_rate", SAMPLE_RATE) or len(wave) != record["num_samples"]:
                problems.append(
                    f"{path}: corrupt ({len(wave)} samples at {sr} Hz, manifest says "
                    f"{record['num_samples']} at {record.get('sample_rate')} Hz)"
                )
                continue
            seconds += len(wave) / sr
        summary[split] = {"utterances": len(records), "seconds": round(seconds, 3)}
    bar.close()
    if problems:
        raise CorpusError(problems)
    return summary


def speech_main(argv: list[str]) -> int:
    """`cape data speech`: make (or finish) the speech corpus, then verify it; `--verify` only
    verifies. Returns the exit status (0 ok, 1 corpus problems, 2 bad settings)."""
    parser = ArgumentParser(
        prog="cape data speech", description="Make the offline espeak-ng speech corpus."
    )
    parser.add_argument("--root", default="data/speech", help="corpus folder (data/speech)")
    parser.add_argument("--train", type=int, default=10_000, help="training utterances")
    parser.add_argument("--val", type=int, default=500, help="validation utterances")
    parser.add_argument(
        "--test-per-bin", type=int, default=100, help="test utterances per duration bin"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="synthesis processes")
    parser.add_argument("--no-noise", action="store_true", help="no additive noise (floor only)")
    parser.add_argument("--sox", action="store_true", help="random sox reverb and tempo")
    parser.add_argument(
        "--text",
        default="wordnet",
        choices=TEXT_SOURCES,
        help="what is said: WordNet sentences or digit strings (default wordnet)",
    )
    parser.add_argument("--verify", action="store_true", help="only verify an existing corpus")
    args = parser.parse_args(argv)
    try:
        if args.verify and not Path(args.root).is_dir():
            raise FileNotFoundError(f"--root {args.root!r}: no corpus there to verify")
        if not args.verify:
            check_out_folder(args.root, "--root")
            summary = make_speech_corpus(
                args.root,
                train=args.train,
                val=args.val,
                test_per_bin=args.test_per_bin,
                seed=args.seed,
                workers=args.workers,
                sox=args.sox,
                text=args.text,
                snr_db=None if args.no_noise else SNR_DB,
            )
            for split, counts in summary.items():
                print(
                    f"{split}: {counts['made']} made, {counts['kept']} kept"
                    + (f", {counts['repaired']} repaired" if counts["repaired"] else "")
                )
        for split, info in verify_corpus(args.root, progress=True).items():
            seconds = info["seconds"]
            print(
                f"{split}: {info['utterances']} utterances, "
                f"{seconds:.0f} s = {seconds / 3600:.2f} h, ok"
            )
    except CorpusError as e:  # missing or damaged files: a failure, not a mistake
        return report_error(parser.prog, e, code=1)
    except (ValueError, FileNotFoundError) as e:
        return report_error(parser.prog, e)
    return 0
