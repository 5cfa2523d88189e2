"""English sentences and their Apertium Spanish translations, for
`cape.lab.data.translation.corpus`.

`english_sentences` gathers WordNet gloss clauses and examples
(`cape.lab.data.text.sentences.wordnet_glosses`) and the sentences of the Debian `fortunes` files;
`translate_apertium` runs `apertium -u eng-spa` (no `*` marks on unknown words) in paragraph mode:
each sentence made one line and followed by a blank line, the output split on blank lines and its
count checked (`-f line` or plain newlines let Apertium join or split sentences, so the pairs
would misalign).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

from cape._checks import check_choice, check_int
from cape.lab.data.speech import corpus as speech
from cape.lab.data.text.sentences import WORDNET_DIR, split_sentences, wordnet_glosses
from cape.lab.progress import progress as progress_bar  # `progress` names the on/off flag here

__all__ = [
    "FORTUNES_DIR",
    "MAX_WORDS",
    "MIN_WORDS",
    "CorpusError",
    "english_sentences",
    "fortune_sentences",
    "translate_apertium",
]

FORTUNES_DIR = Path("/usr/share/games/fortunes")
"""Where Debian's `fortunes`/`fortunes-min` put the fortune files."""
MIN_WORDS, MAX_WORDS = 3, 80
MAX_OFF_RATIO = 0.1
"""A chunk with more pairs than this outside the [0.5, 2] word ratio is misaligned."""
_SKIP_FORTUNES = {"ascii-art", "translate-me"}  # pictures; Latin/French/German
_ATTRIBUTION = re.compile(r"^\s*(--|-\s+[A-Z]|\u2014|~~)")
_ODD = re.compile(r"[{}<>|\\^~_=#@*+]|/\*|::|\$\w|\w\(\)|;\s*$|\.{2}\w|\t")
_SIGNED = re.compile(r"\s+--\s*[A-Z][\w.' ]{0,40}$")  # "... -- Steve Shorter"
_STARTS = re.compile(r"^[\"'(]*[A-Z0-9]")  # not a fragment of a broken paragraph
_OVERSTRIKE = re.compile(r".\x08")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class CorpusError(speech.CorpusError):
    """The translation corpus has a misaligned, missing or corrupt file; `problems` names each."""

    what = "translation corpus"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _prose(line: str) -> bool:
    """A line of running text: no code or markup symbols, mostly letters."""
    s = line.strip()
    if not s or _ODD.search(s):
        return False
    letters = sum(c.isalpha() for c in s)
    return letters >= 0.7 * sum(not c.isspace() for c in s)


def _fortune_paragraphs(fortune: str) -> list[str]:
    """The prose paragraphs of one fortune; a paragraph with any code/art line is dropped whole,
    and so is everything from an attribution line ("-- Author") on."""
    paragraphs: list[list[str]] = [[]]
    indented = False
    for line in fortune.split("\n"):
        if _ATTRIBUTION.match(line):
            break
        was, indented = indented, line.startswith(("\t", "  "))
        if not line.strip() or (indented and not was):  # a blank line or a first-line indent
            paragraphs.append([])
        if line.strip():
            paragraphs[-1].append(line)
    return [
        _one_line(" ".join(p))
        for p in paragraphs
        if p and not p[0].lstrip().startswith("[") and all(_prose(line) for line in p)
    ]


def fortune_sentences(root: str | Path | None = None) -> list[str]:
    """Sentences of the fortune files in `root` (default `FORTUNES_DIR`), in file-name order:
    only regular top-level files without extension (no `off/` offensive dir, no `.dat`/`.u8`),
    without ascii-art and the non-English translate-me. Overstrikes and control characters are
    removed, attributions, code, ascii art and editorial notes dropped, whitespace collapsed,
    sentences that start in lower case (fragments) or end with ":" (headings) dropped;
    not filtered by length nor de-duplicated (`english_sentences` does that)."""
    root = FORTUNES_DIR if root is None else Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"no fortune folder {root}: install the Debian package fortunes (or fortunes-min) or "
            "pass fortunes=False"
        )
    out: list[str] = []
    with os.scandir(root) as it:
        files = sorted(e.name for e in it if e.is_file(follow_symlinks=False))
    for name in files:
        if "." in name or name in _SKIP_FORTUNES:
            continue
        text = (root / name).read_text(encoding="utf-8", errors="replace")
        text = _CONTROL.sub("", _OVERSTRIKE.sub("", text.replace("\r", "")))
        for fortune in re.split(r"^%\s*$", text, flags=re.MULTILINE):
            for paragraph in _fortune_paragraphs(fortune.strip("\n")):
                for sentence in split_sentences(paragraph):
                    sentence = _SIGNED.sub("", sentence)
                    if _STARTS.match(sentence) and not sentence.endswith(":"):
                        out.append(sentence)
    return out


@lru_cache(maxsize=4)
def _english(fortunes: bool, wordnet: str, fortune_dir: str) -> tuple[tuple[str, ...], int]:
    pieces = [s for g in wordnet_glosses(wordnet) for s in split_sentences(g)]
    n_wordnet = len(pieces)
    if fortunes:
        pieces += fortune_sentences(fortune_dir)
    seen: set[str] = set()
    out: list[str] = []
    kept_wordnet = 0
    for i, piece in enumerate(pieces):
        s = _one_line(piece)
        if MIN_WORDS <= len(s.split()) <= MAX_WORDS and s not in seen and _prose(s):
            seen.add(s)
            out.append(s)
            kept_wordnet += i < n_wordnet
    return tuple(out), kept_wordnet


def english_sentences(*, fortunes: bool = True) -> list[str]:
    """English sentences, original case, one line each (whitespace collapsed), unique, in a fixed
    order: WordNet gloss clauses and quoted examples (file order), then the fortunes
    (`fortune_sentences`) when `fortunes`. Kept: 3 to 80 words, mostly letters, no code
    symbols. About 198k sentences with the fortunes. Cached per process."""
    check_choice("fortunes", fortunes, [True, False])
    return list(_english(fortunes, str(WORDNET_DIR), str(FORTUNES_DIR))[0])


def _apertium(text: str) -> str:
    """Run `apertium -u eng-spa` on `text` (paragraphs separated by blank lines)."""
    try:
        done = subprocess.run(
            ["apertium", "-u", "eng-spa"], input=text, capture_output=True, text=True, check=False
        )
    except FileNotFoundError as e:
        raise FileNotFoundError(
            "apertium not found: install the Debian packages apertium and apertium-eng-spa"
        ) from e
    if done.returncode != 0:
        raise RuntimeError(f"apertium -u eng-spa failed ({done.returncode}): {done.stderr[-500:]}")
    return done.stdout


def _translate_chunk(sentences: Sequence[str], name: str) -> list[str]:
    """One chunk through Apertium in paragraph mode; raises CorpusError naming `name` when the
    output has another number of paragraphs than the input has sentences."""
    lines = [_one_line(s) for s in sentences]
    empty = [i for i, s in enumerate(lines) if not s]
    if empty:
        raise ValueError(f"{name}: sentence {empty[0]} is empty; apertium would misalign")
    out = _apertium("\n\n".join(lines) + "\n")
    pieces = [_one_line(p) for p in re.split(r"\n[ \t]*\n", out.strip("\n")) if p.strip()]
    if len(pieces) != len(lines):
        raise CorpusError(
            [
                f"{name}: apertium returned {len(pieces)} paragraphs for {len(lines)} sentences "
                "(misaligned output)"
            ]
        )
    # a paragraph split in one place and two merged in another keep the count but shift the
    # pairs between them: their word ratios then scatter (aligned chunks: ~0.02% outside)
    off = sum(
        not 0.5 <= len(t.split()) / max(len(s.split()), 1) <= 2.0
        for s, t in zip(lines, pieces, strict=True)
    )
    if len(lines) >= 20 and off > MAX_OFF_RATIO * len(lines):
        raise CorpusError(
            [
                f"{name}: {off} of {len(lines)} pairs have a target/source word ratio outside "
                f"[0.5, 2] (more than {MAX_OFF_RATIO:.0%}: misaligned output)"
            ]
        )
    return pieces


def _chunks(n: int, chunk: int) -> list[range]:
    return [range(i, min(i + chunk, n)) for i in range(0, n, chunk)]


def _run_parallel(
    run: Callable[[int], None], chunks: Sequence[int], workers: int, progress: bool
) -> None:
    """`run(i)` for every chunk index i of `chunks`, `workers` Apertium calls at a time."""
    if not chunks:
        return
    with ThreadPoolExecutor(max(1, min(workers, len(chunks)))) as pool:
        futures = [pool.submit(run, i) for i in chunks]
        for future in progress_bar(futures, desc="apertium", unit="chunk", enabled=progress):
            future.result()


def translate_apertium(
    sentences: Sequence[str], *, workers: int = 2, chunk: int = 2000, progress: bool = True
) -> list[str]:
    """Spanish translations of English `sentences` (list[str] -> list[str], same length and
    order). Each sentence is made one line and put in its own paragraph (blank-line separated),
    `chunk` sentences per `apertium -u eng-spa` call, `workers` calls at a time. Raises
    CorpusError naming the chunk whose output is misaligned, ValueError for an empty sentence."""
    check_int("workers", workers)
    check_int("chunk", chunk)
    sentences = list(sentences)
    ranges = _chunks(len(sentences), chunk)
    results: list[list[str]] = [[] for _ in ranges]

    def run(i: int) -> None:
        r = ranges[i]
        name = f"chunk {i} ({r.start}-{r.stop - 1})"
        results[i] = _translate_chunk(sentences[r.start : r.stop], name)

    _run_parallel(run, range(len(ranges)), workers, progress)
    return [t for part in results for t in part]
