"""The offline English->Spanish corpus for the machine-translation experiment.

English sentences (`english_sentences`: WordNet glosses and examples, fortunes) are translated by
Apertium (`translate_apertium`, `apertium -u eng-spa` in paragraph mode). Layout under `root`
(the experiment uses "data/translation"):

- `chunks/NNNNN.tsv`: the raw translations of English sentences [i*chunk, (i+1)*chunk), one
  `english<TAB>spanish` line per sentence in order; each written atomically, so an interrupted
  build redoes only the chunks it lacks; a chunk whose sources differ from the expected ones
  (wrong line count, other sentences) is logged by name and translated again.
- `<split>.tsv`: `src<TAB>tgt` per line, both lower-cased with single spaces, no tabs
  (`split_names`; the long buckets are named after `max_train_words`: test_21-30, test_31-40,
  test_41+ for 20).
- `manifest.json`: counts per split, the settings, the mean tgt/src word ratio of train, how
  many pairs the ratio filter and the de-duplication dropped, and the sources; written last.

A build with other settings than the manifest's raises ValueError (use a new root); the same
settings return the manifest at once. One process builds a root at a time (`.lock` in it): one
started meanwhile waits, then returns the manifest the first wrote. The joint SentencePiece BPE
lives in `cape.lab.data.translation.bpe`.
"""

from __future__ import annotations

import logging
import random
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from cape._checks import check_choice, check_int
from cape.lab.data.cache import building, remove_leftovers
from cape.lab.data.settings import check_made_with
from cape.lab.data.text.sentences import WORDNET_DIR
from cape.lab.data.translation.apertium import (
    FORTUNES_DIR,
    MAX_WORDS,
    MIN_WORDS,
    CorpusError,
    _chunks,
    _english,
    _one_line,
    _run_parallel,
    _translate_chunk,
    english_sentences,
    translate_apertium,
)
from cape.lab.errors import DamagedFile
from cape.lab.io import read_json, set_aside, write_json, write_text

__all__ = [
    "CorpusError",
    "english_sentences",
    "load_pairs",
    "long_buckets",
    "make_translation_corpus",
    "split_names",
    "translate_apertium",
    "verify_translation_corpus",
]

_log = logging.getLogger(__name__)
_VERSION = 1


def long_buckets(max_train_words: int = 20) -> list[tuple[str, int, int | None]]:
    """The long test buckets (name, min words, max words or None): three of ten words above
    `max_train_words`, the last open: [("test_21-30", 21, 30), ("test_31-40", 31, 40),
    ("test_41+", 41, None)] for 20."""
    m = check_int("max_train_words", max_train_words)
    return [
        (f"test_{m + 1}-{m + 10}", m + 1, m + 10),
        (f"test_{m + 11}-{m + 20}", m + 11, m + 20),
        (f"test_{m + 21}+", m + 21, None),
    ]


def split_names(max_train_words: int = 20) -> list[str]:
    """Every split of a corpus made with `max_train_words`: train, val, test, the long buckets,
    stacked."""
    return ["train", "val", "test", *(b[0] for b in long_buckets(max_train_words)), "stacked"]


def _write_tsv(path: Path, pairs: Iterable[tuple[str, str]]) -> None:
    write_text(path, "".join(f"{src}\t{tgt}\n" for src, tgt in pairs))


def _read_tsv(path: Path) -> list[tuple[str, str]]:
    pairs = []
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n")[:-1], 1):
        src, tab, tgt = line.partition("\t")
        if not tab or "\t" in tgt:
            raise CorpusError([f"{path}:{n}: not a src<TAB>tgt line"])
        pairs.append((src, tgt))
    return pairs


def _cached_chunk(path: Path, sources: list[str]) -> tuple[list[str] | None, str | None]:
    """(translations, None) when `path` holds `sources` in order; (None, why) otherwise, why None
    for a plainly missing file."""
    if not path.is_file():
        return None, None
    try:
        pairs = _read_tsv(path)
    except (CorpusError, OSError, UnicodeDecodeError) as e:
        return None, f"{path}: unreadable ({e})"
    if len(pairs) != len(sources):
        return None, f"{path}: {len(pairs)} lines, expected {len(sources)}"
    if any(p[0] != _one_line(s) for p, s in zip(pairs, sources, strict=True)):
        return None, f"{path}: holds other sentences than expected"
    return [p[1] for p in pairs], None


def _translate_cached(
    root: Path, sentences: list[str], chunk: int, workers: int, progress: bool
) -> tuple[list[str], dict[str, int]]:
    """Translations of `sentences` through the chunk cache; returns them and {"kept", "made",
    "redone"} chunk counts (redone: a corrupt or stale chunk file, logged by name)."""
    ranges = _chunks(len(sentences), chunk)
    results: list[list[str] | None] = []
    todo: list[int] = []
    stats = {"kept": 0, "made": 0, "redone": 0}
    for i, r in enumerate(ranges):
        cached, why = _cached_chunk(root / "chunks" / f"{i:05d}.tsv", sentences[r.start : r.stop])
        results.append(cached)
        if cached is None:
            todo.append(i)
            stats["made"] += 1
            if why is not None:
                stats["redone"] += 1
                _log.warning("translating again: %s", why)
        else:
            stats["kept"] += 1

    def run(i: int) -> None:
        path = root / "chunks" / f"{i:05d}.tsv"
        src = [_one_line(s) for s in sentences[ranges[i].start : ranges[i].stop]]
        tgt = _translate_chunk(src, str(path))
        _write_tsv(path, zip(src, tgt, strict=True))
        results[i] = tgt

    _run_parallel(run, todo, workers, progress)
    return [t for part in results for t in (part or [])], stats


def _clean_pairs(sources: list[str], targets: list[str]) -> tuple[list[tuple[str, str]], int, int]:
    """Lower-case and collapse both sides, drop repeated sources (first kept) and pairs whose
    tgt/src word ratio is outside [0.5, 2]; returns (pairs, dropped by dedup, by ratio)."""
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    dup = ratio = 0
    for s, t in zip(sources, targets, strict=True):
        s, t = _one_line(s).lower(), _one_line(t).lower()
        if s in seen:
            dup += 1
            continue
        seen.add(s)
        ns, nt = len(s.split()), len(t.split())
        if not ns or not 0.5 <= nt / ns <= 2.0:
            ratio += 1
            continue
        pairs.append((s, t))
    return pairs, dup, ratio


def _stack(
    rng: random.Random, long: list[tuple[str, str]], test: list[tuple[str, str]], n: int
) -> list[tuple[str, str]]:
    """`n` sequences of 2-4 held-out pairs joined by spaces, sources preferably 60-200 words:
    drawn from the long buckets (from test too when those are too few), up to 100 draws each."""
    pool = long if len(long) >= 4 else long + test
    if n and len(pool) < 2:
        raise ValueError(f"stacked={n} needs at least 2 held-out pairs, the corpus has {len(pool)}")
    out = []
    for _ in range(n):
        k = min(rng.randint(2, 4), len(pool))
        for _ in range(100):
            picked = rng.sample(pool, k)
            words = sum(len(p[0].split()) for p in picked)
            if 60 <= words <= 200:
                break
        out.append((" ".join(p[0] for p in picked), " ".join(p[1] for p in picked)))
    return out


def _split(pairs: list[tuple[str, str]], settings: dict) -> dict[str, list[tuple[str, str]]]:
    rng = random.Random(settings["seed"])
    m = settings["max_train_words"]
    short = [p for p in pairs if len(p[0].split()) <= m]
    rng.shuffle(short)
    n_val, n_test = settings["val"], settings["test"]
    if n_val + n_test >= len(short):
        raise ValueError(
            f"val={n_val} + test={n_test} leave no training pairs: the corpus has {len(short)} "
            f"pairs of <= max_train_words={m} words"
        )
    splits = {"test": short[:n_test], "val": short[n_test : n_test + n_val]}
    splits["train"] = short[n_test + n_val :]
    long_all: list[tuple[str, str]] = []
    for name, lo, hi in long_buckets(m):
        bucket = [p for p in pairs if lo <= len(p[0].split()) <= (hi or MAX_WORDS * 10)]
        rng.shuffle(bucket)
        splits[name] = bucket[: settings["long_per_bucket"]]
        long_all += splits[name]
    splits["stacked"] = _stack(rng, long_all, splits["test"], settings["stacked"])
    return {name: splits[name] for name in split_names(m)}


def make_translation_corpus(
    root: str | Path = "data/translation",
    *,
    seed: int = 0,
    val: int = 1000,
    test: int = 2000,
    long_per_bucket: int = 500,
    stacked: int = 300,
    max_train_words: int = 20,
    limit: int | None = None,
    fortunes: bool = True,
    workers: int = 2,
    chunk: int = 2000,
    progress: bool = True,
) -> dict:
    """Make (or finish) the English->Spanish corpus under `root`; returns the manifest (dict:
    "counts" {split: pairs}, "settings", "train_ratio" mean tgt/src words, "dropped" {"ratio",
    "duplicate"}, "sources", "chunks" {"kept", "made", "redone"} of the build that made it).

    `english_sentences(fortunes=...)`, only the first `limit` when given, are translated `chunk`
    at a time by `workers` Apertium processes (cached in chunks/, resumable). Pairs of <=
    `max_train_words` source words are shuffled (`seed`) into test (`test` pairs), val (`val`)
    and train (the rest); longer ones into the three long buckets (`long_buckets`, at most
    `long_per_bucket` each); `stacked` sequences join 2-4 long-bucket pairs. Raises ValueError
    when `root` holds a corpus made with other settings, CorpusError on misaligned output.
    """
    root = Path(root)
    settings = {
        "version": _VERSION,
        "seed": check_int("seed", seed, minimum=0),
        "val": check_int("val", val, minimum=0),
        "test": check_int("test", test, minimum=0),
        "long_per_bucket": check_int("long_per_bucket", long_per_bucket, minimum=0),
        "stacked": check_int("stacked", stacked, minimum=0),
        "max_train_words": check_int("max_train_words", max_train_words, minimum=MIN_WORDS),
        "limit": None if limit is None else check_int("limit", limit),
        "fortunes": check_choice("fortunes", fortunes, [True, False]),
    }
    check_int("workers", workers)
    check_int("chunk", chunk)
    made = _made(root, settings, set_damaged_aside=False)  # made before: no lock to wait for
    if made is not None:
        return made
    root.mkdir(parents=True, exist_ok=True)
    with building(root, folder=True):  # one builder; the others wait, then find it made
        made = _made(root, settings, set_damaged_aside=True)
        if made is not None:
            return made
        remove_leftovers(root, recursive=True)  # a killed builder's temporaries
        return _build(root, settings, chunk=chunk, workers=workers, progress=progress)


def _made(root: Path, settings: dict, *, set_damaged_aside: bool) -> dict | None:
    """The manifest of the corpus in `root` when it is complete, else None. ValueError when it
    was made with other `settings`."""
    old = _manifest(root / "manifest.json", set_damaged_aside=set_damaged_aside)
    if old is not None:
        check_made_with(root, "translation corpus", old["settings"], settings, settings)
        if all((root / f"{s}.tsv").is_file() for s in old["counts"]):
            return old
    return None


def _build(root: Path, settings: dict, *, chunk: int, workers: int, progress: bool) -> dict:
    """Translate (through the chunk cache), split, write the splits and the manifest, last."""
    fortunes, limit = settings["fortunes"], settings["limit"]
    manifest_path = root / "manifest.json"
    start = time.perf_counter()
    english = english_sentences(fortunes=fortunes)
    if limit is not None:
        english = english[:limit]
    n_wordnet = _english(fortunes, str(WORDNET_DIR), str(FORTUNES_DIR))[1]
    spanish, chunk_stats = _translate_cached(root, english, chunk, workers, progress)
    pairs, dup, ratio = _clean_pairs(english, spanish)
    splits = _split(pairs, settings)
    for name, split_pairs in splits.items():
        _write_tsv(root / f"{name}.tsv", split_pairs)
    train = splits["train"]
    version = subprocess.run(["apertium", "-V"], capture_output=True, text=True).stdout.strip()
    manifest = {
        "settings": settings,
        "counts": {name: len(p) for name, p in splits.items()},
        "splits": list(splits),
        "train_ratio": round(
            sum(len(t.split()) / len(s.split()) for s, t in train) / max(len(train), 1), 4
        ),
        "dropped": {"ratio": ratio, "duplicate": dup},
        "english_sentences": len(english),
        "pairs": len(pairs),
        "sources": {
            "wordnet": str(WORDNET_DIR),
            "wordnet_sentences": min(len(english), n_wordnet),
            "fortune_sentences": len(english) - min(len(english), n_wordnet),
            "fortunes": str(FORTUNES_DIR) if fortunes else None,
            "translator": f"apertium -u eng-spa ({version or 'unknown version'})",
        },
        "chunks": {"size": chunk, **chunk_stats},
        "seconds": round(time.perf_counter() - start, 1),
    }
    write_json(manifest_path, manifest)
    return manifest


def _manifest(path: Path, *, set_damaged_aside: bool = False) -> dict | None:
    """manifest.json, or None when it is absent or damaged (named in a warning; with
    `set_damaged_aside` set aside, so that the corpus is made again from the chunk cache)."""
    try:
        manifest = read_json(path)
        if isinstance(manifest, dict) and {"settings", "counts", "splits"} <= set(manifest):
            return manifest
        raise DamagedFile(f"{path} is damaged (it lacks settings, counts or splits)", path)
    except FileNotFoundError:
        return None
    except DamagedFile as e:
        if set_damaged_aside:
            set_aside(path, f"{e}; the corpus is made again")
        else:
            _log.warning("%s", e)
        return None


def load_pairs(root: str | Path, split: str) -> list[tuple[str, str]]:
    """The (src, tgt) pairs of `split` (lower case, single spaces) in file order. Raises
    FileNotFoundError naming the split and the ones the corpus has."""
    root = Path(root)
    path = root / f"{split}.tsv"
    if not isinstance(split, str) or "/" in split or not path.is_file():
        manifest = _manifest(root / "manifest.json")
        allowed = manifest["splits"] if manifest is not None else split_names()
        raise FileNotFoundError(
            f"no split {split!r} in {root} (allowed: {', '.join(allowed)}); make the corpus with "
            "`cape data translation`"
        )
    return _read_tsv(path)


def verify_translation_corpus(root: str | Path) -> dict[str, int]:
    """Read every split file and check it against the manifest counts; returns {split: pairs}.
    Raises CorpusError naming every missing, malformed or miscounted file."""
    root = Path(root)
    path = root / "manifest.json"
    if not path.is_file():
        raise CorpusError([f"{path}: missing (make the corpus with `cape data translation`)"])
    try:
        counts = read_json(path)["counts"]
    except (DamagedFile, KeyError, TypeError) as e:
        why = e if isinstance(e, DamagedFile) else f"{path} is damaged (it lacks counts)"
        raise CorpusError([f"{why}; `cape data translation` makes it again"]) from e
    problems = []
    for split, n in counts.items():
        file = root / f"{split}.tsv"
        try:
            got = len(_read_tsv(file))
        except FileNotFoundError:
            problems.append(f"{file}: missing")
            continue
        except (CorpusError, OSError, UnicodeDecodeError) as e:
            problems.append(f"{file}: unreadable ({e})")
            continue
        if got != n:
            problems.append(f"{file}: {got} pairs, the manifest says {n}")
    if problems:
        raise CorpusError(problems)
    return dict(counts)
