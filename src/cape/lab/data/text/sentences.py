"""English text for the speech corpus: WordNet glosses and examples, normalised for CTC targets.

The text comes from the Debian package `wordnet-base` (/usr/share/wordnet/data.{noun,verb,adj,adv}):
each synset line ends with `| gloss`, a definition followed by quoted examples, separated by
semicolons. `normalize_text` maps any English string onto the CTC alphabet `ALPHABET`
(a-z, apostrophe, space), spelling numbers out; `wordnet_sentences` gives the whole corpus:
normalised, de-duplicated, in file order (deterministic), cached in memory and optionally on disk.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import Path

import numpy as np

from cape._checks import check_choice, check_int
from cape.lab.data.text import numwords
from cape.lab.data.text.numwords import (
    decimal_words,
    digit_words,
    integer_words,
    ordinal_words,
    plural_words,
    year_words,
)
from cape.lab.io import atomic_write

__all__ = [
    "ALPHABET",
    "TEXT_SOURCES",
    "WORDNET_DIR",
    "digit_sentences",
    "normalize_text",
    "source_sentences",
    "split_sentences",
    "wordnet_glosses",
    "wordnet_sentences",
]

ALPHABET = " 'abcdefghijklmnopqrstuvwxyz"
"""The characters `normalize_text` can return (space, apostrophe, a-z)."""
WORDNET_DIR = Path("/usr/share/wordnet")
"""Where Debian's `wordnet-base` puts data.noun, data.verb, data.adj and data.adv."""
_WORDNET_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
_CACHE_VERSION = 1
TEXT_SOURCES = ("wordnet", "digits")
"""What a speech corpus says: WordNet sentences, or spoken digit strings (`digit_sentences`)."""

_SYMBOLS = {"&": " and ", "%": " percent ", "+": " plus ", "=": " equals ", "@": " at "}
_QUOTES = {"\u2018": "'", "\u2019": "'", "\u02bc": "'", "\u201c": '"', "\u201d": '"'}
_DIGIT = re.compile(r"\d")
_NUM = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d*\.\d+|\d+)"
_MINUS = re.compile(r"(?<![\w.])-(?=\.?\d)")
_CURRENCY = re.compile(rf"\$\s?({_NUM})")
_FRACTION = re.compile(r"(?<![\d.,/])(\d+)/(\d+)(?![\d/])")
_ORDINAL_RE = re.compile(r"(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_PLURAL_RE = re.compile(r"(\d+)'?s\b")
_NUMBER_RE = re.compile(_NUM)
_STRAY_APOSTROPHE = re.compile(r"(?<![a-z])'|'(?![a-z])")
_NOT_ALPHABET = re.compile(r"[^a-z' ]+")
_SPACES = re.compile(r" +")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(]?[A-Z0-9])")
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "no", "u.s"}


def _number(token: str) -> str:
    """Words of one number token as written in text: "1,200" "3.5" "1984" "007" "42"."""
    plain = token.replace(",", "")
    if "." in plain:
        return decimal_words(plain)
    if len(plain) > 1 and plain[0] == "0":
        return digit_words(plain)  # "007", "05": read digit by digit
    n = int(plain)
    if len(token) == 4 and 1100 <= n <= 2099:  # "1984" is a year, "1,984" is not
        return year_words(n)
    return integer_words(n)


def _fraction(match: re.Match[str]) -> str:
    num, den = int(match.group(1)), int(match.group(2))
    if den == 0:
        return f" {integer_words(num)} over zero "
    name = {2: "half", 4: "quarter"}.get(den) or ordinal_words(den)
    if num != 1:
        name = "halves" if den == 2 else plural_words(name)
    return f" {integer_words(num)} {name} "


def _plural(match: re.Match[str]) -> str:
    token = match.group(1)
    return f" {plural_words(_number(token))} "


def _currency(match: re.Match[str]) -> str:
    words = _number(match.group(1))
    return f" {words} {'dollar' if words == 'one' else 'dollars'} "


def normalize_text(text: str) -> str:
    """Map English text onto `ALPHABET`: lower case a-z, apostrophe, single spaces.

    Numbers are spelled out: integers ("42" -> "forty two", "1,200" -> "one thousand two
    hundred"), decimals ("3.5" -> "three point five"), ordinals ("21st" -> "twenty first"), years
    1100-2099 ("1984" -> "nineteen eighty four"), decades ("1920s" -> "nineteen twenties"),
    fractions ("3/4" -> "three quarters"), money ("$5" -> "five dollars"), "%" -> "percent",
    a leading minus ("-3" -> "minus three"). Accents are dropped ("café" -> "cafe"); an apostrophe
    is kept only between two letters ("don't", "o'clock"; not "'quoted'"); every other character
    becomes a space. Deterministic and idempotent. Returns "" when nothing speakable is left.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = text.replace("`", "'")
    if not text.isascii():
        for a, b in _QUOTES.items():
            text = text.replace(a, b)
        text = unicodedata.normalize("NFKD", text)
        text = "".join(c for c in text if not unicodedata.combining(c))
    if _DIGIT.search(text):
        text = _MINUS.sub(" minus ", text)
        text = _CURRENCY.sub(_currency, text)
        text = _FRACTION.sub(_fraction, text)
        text = _ORDINAL_RE.sub(lambda m: f" {ordinal_words(int(m.group(1)))} ", text)
        text = _PLURAL_RE.sub(_plural, text)
        text = _NUMBER_RE.sub(lambda m: f" {_number(m.group(0))} ", text)
    for a, b in _SYMBOLS.items():
        text = text.replace(a, b)
    text = text.lower()
    text = _STRAY_APOSTROPHE.sub(" ", text)
    text = _NOT_ALPHABET.sub(" ", text)
    return _SPACES.sub(" ", text).strip()


def split_sentences(text: str) -> list[str]:
    """Split running text after ".", "!" or "?" followed by a space and a capital, a digit or an
    opening quote; not after common abbreviations ("Mr.", "e.g."). Pieces are stripped, empty
    ones dropped; the text is not normalised."""
    pieces = _SENTENCE_END.split(text.strip())
    out: list[str] = []
    for piece in pieces:
        prev = out[-1].rsplit(None, 1)[-1].rstrip(".").lower() if out else ""
        if out and prev in _ABBREVIATIONS:
            out[-1] = f"{out[-1]} {piece}"
        elif piece.strip():
            out.append(piece.strip())
    return out


def _parse_gloss(gloss: str) -> list[str]:
    """One synset's gloss -> its pieces: definition clauses, then the quoted examples."""
    examples = re.findall(r'"([^"]+)"', gloss)
    definition = re.sub(r'"[^"]*"', " ", gloss)
    clauses = [c.strip() for c in definition.split(";")]
    # what is left of an example's attribution ("- Shakespeare") or an empty clause is dropped
    clauses = [c for c in clauses if c and not c.startswith("-")]
    return clauses + [e.strip() for e in examples if e.strip()]


def _find_wordnet(root: str | Path | None) -> list[Path]:
    root = WORDNET_DIR if root is None else Path(root)
    paths = [root / name for name in _WORDNET_FILES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"WordNet data files not found: {', '.join(missing)}; install the Debian package "
            "wordnet-base (scripts/setup.sh does) or pass root= the folder holding them"
        )
    return paths


def wordnet_glosses(root: str | Path | None = None) -> list[str]:
    """Raw (not normalised) gloss pieces of every synset: definition clauses and the quoted
    examples, in file order (noun, verb, adj, adv). `root` defaults to `WORDNET_DIR`."""
    out: list[str] = []
    for path in _find_wordnet(root):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  "):  # the licence header
                    continue
                _, bar, gloss = line.partition(" | ")
                if bar:
                    out.extend(_parse_gloss(gloss.strip()))
    return out


_MEMORY: dict[tuple[str, int, int], list[str]] = {}
_DIGIT_MEMORY: dict[tuple[int, int, int, int], list[str]] = {}


def _fingerprint(paths: list[Path], min_words: int, max_words: int) -> str:
    h = hashlib.sha256(f"v{_CACHE_VERSION} {min_words} {max_words}".encode())
    for module in (__file__, numwords.__file__):  # a change of the normalisation rebuilds
        h.update(Path(module).read_bytes())
    for p in paths:
        st = p.stat()
        h.update(f"{p.name} {st.st_size} {st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def wordnet_sentences(
    root: str | Path | None = None,
    *,
    min_words: int = 3,
    max_words: int = 40,
    cache_dir: str | Path | None = None,
) -> list[str]:
    """The normalised WordNet sentence corpus: list[str], each in `ALPHABET`, unique, in first-seen
    file order, with `min_words` <= word count <= `max_words`.

    Gloss pieces are split into sentences (`split_sentences`) and normalised (`normalize_text`).
    Cached per process; with `cache_dir`, also in `cache_dir/wordnet_sentences.txt`, rebuilt when
    the WordNet files (size, mtime), the word limits or this module's code change.
    """
    check_int("min_words", min_words)
    check_int("max_words", max_words, minimum=min_words)
    paths = _find_wordnet(root)
    key = (str(paths[0].parent.resolve()), min_words, max_words)
    if key in _MEMORY:
        return list(_MEMORY[key])
    stamp = _fingerprint(paths, min_words, max_words)
    cache = Path(cache_dir) / "wordnet_sentences.txt" if cache_dir is not None else None
    if cache is not None and cache.is_file():
        lines = cache.read_text(encoding="utf-8", errors="replace").split("\n")
        kept = [s for s in lines[1:] if s]
        # the header counts the sentences: a file cut short is rebuilt, not read as a corpus
        if lines[0] == f"# cape wordnet sentences {stamp} {len(kept)}" and lines[-1] == "":
            _MEMORY[key] = kept
            return list(kept)
    seen: set[str] = set()
    sentences: list[str] = []
    for piece in wordnet_glosses(paths[0].parent):
        for raw in split_sentences(piece):
            s = normalize_text(raw)
            if min_words <= len(s.split()) <= max_words and s not in seen:
                seen.add(s)
                sentences.append(s)
    if cache is not None:
        body = "\n".join([f"# cape wordnet sentences {stamp} {len(sentences)}", *sentences]) + "\n"
        atomic_write(cache, lambda tmp: Path(tmp).write_text(body, encoding="utf-8"))
    _MEMORY[key] = sentences
    return list(sentences)


def digit_sentences(
    count: int = 100_000, *, min_digits: int = 3, max_digits: int = 15, seed: int = 0
) -> list[str]:
    """Spoken digit strings: `count` unique strings of `min_digits`..`max_digits` random digits,
    each digit a word ("four zero seven"), in draw order; the same list for the same arguments.

    A ten-word vocabulary that a CPU-sized CTC model learns in minutes (WordNet's open one
    leaves its WER near 90%), so that WER against duration can say how positions generalise.
    """
    check_int("count", count)
    check_int("min_digits", min_digits)
    check_int("max_digits", max_digits, minimum=min_digits)
    if count > 10**max_digits:
        raise ValueError(f"count must be <= 10**max_digits = {10**max_digits}, got {count}")
    key = (seed, count, min_digits, max_digits)
    if key not in _DIGIT_MEMORY:
        rng = np.random.default_rng([seed, 7])
        seen: set[str] = set()
        out: list[str] = []
        while len(out) < count:
            n = int(rng.integers(min_digits, max_digits + 1))
            s = digit_words("".join(str(d) for d in rng.integers(0, 10, size=n)))
            if s not in seen:
                seen.add(s)
                out.append(s)
        _DIGIT_MEMORY[key] = out
    return list(_DIGIT_MEMORY[key])


def source_sentences(source: str, cache_dir: str | Path | None = None) -> list[str]:
    """The sentences of text source `source` (one of `TEXT_SOURCES`) with their defaults:
    `wordnet_sentences` (cached in `cache_dir`) or `digit_sentences`."""
    check_choice("source", source, TEXT_SOURCES)
    if source == "digits":
        return digit_sentences()
    return wordnet_sentences(cache_dir=cache_dir)
