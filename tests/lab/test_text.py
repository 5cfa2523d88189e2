"""Text for the speech corpus: number words, normalisation, sentence splitting, WordNet parsing."""

from __future__ import annotations

import pytest

from cape.lab.data import (
    ALPHABET,
    WORDNET_DIR,
    decimal_words,
    integer_words,
    normalize_text,
    ordinal_words,
    split_sentences,
    wordnet_glosses,
    wordnet_sentences,
    year_words,
)
from cape.lab.data.text import sentences as text_module


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"),
        (7, "seven"),
        (13, "thirteen"),
        (20, "twenty"),
        (21, "twenty one"),
        (100, "one hundred"),
        (101, "one hundred one"),
        (999, "nine hundred ninety nine"),
        (1005, "one thousand five"),
        (12345, "twelve thousand three hundred forty five"),
        (2_000_017, "two million seventeen"),
        (-42, "minus forty two"),
    ],
)
def test_integer_words(n, words):
    assert integer_words(n) == words


def test_ordinals_years_decimals():
    assert [ordinal_words(n) for n in (1, 2, 3, 4, 11, 12, 20, 21, 100)] == [
        "first",
        "second",
        "third",
        "fourth",
        "eleventh",
        "twelfth",
        "twentieth",
        "twenty first",
        "one hundredth",
    ]
    assert year_words(1984) == "nineteen eighty four"
    assert year_words(1905) == "nineteen oh five"
    assert year_words(1900) == "nineteen hundred"
    assert year_words(2005) == "two thousand five"
    assert year_words(2019) == "twenty nineteen"
    assert decimal_words("3.14") == "three point one four"
    assert decimal_words(".5") == "point five"
    with pytest.raises(ValueError, match="text"):
        decimal_words("1.2.3")
    with pytest.raises(TypeError, match="n must be an int"):
        integer_words(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("Hello, World!", "hello world"),
        ("He paid $5 for 3/4 of it.", "he paid five dollars for three quarters of it"),
        (
            "In 1984 there were 1,200 of them",
            "in nineteen eighty four there were one thousand two hundred of them",
        ),
        ("the 21st century; the 1920s", "the twenty first century the nineteen twenties"),
        ("pi is 3.14", "pi is three point one four"),
        ("50% off & more", "fifty percent off and more"),
        ("-5 degrees", "minus five degrees"),
        ("agent 007", "agent zero zero seven"),
        ("don't say 'hello' to the boys' dog", "don't say hello to the boys dog"),
        ("Café déjà vu", "cafe deja vu"),
        ("mp3 x=y+2", "mp three x equals y plus two"),
        ("  many   spaces\tand\nlines ", "many spaces and lines"),
        ("it’s “curly”", "it's curly"),
        ("1/2 and 2/3", "one half and two thirds"),
        ("...", ""),
    ],
)
def test_normalize_text_closed_examples(raw, normal):
    assert normalize_text(raw) == normal


def test_normalize_text_alphabet_and_idempotence():
    samples = ["A-b_c (d) [e] {f} #1 @home 3rd; x/y \\ z", "Ünïcödé ß ø", "4.5e3 1,000,000th"]
    for s in samples:
        out = normalize_text(s)
        assert set(out) <= set(ALPHABET), out
        assert "  " not in out and out == out.strip()
        assert normalize_text(out) == out
    with pytest.raises(TypeError, match="text must be a str"):
        normalize_text(3)  # type: ignore[arg-type]


def test_split_sentences():
    assert split_sentences("He left. Mr. Smith came! Then what? 3 more.") == [
        "He left.",
        "Mr. Smith came!",
        "Then what?",
        "3 more.",
    ]
    assert split_sentences("no split after e.g. this one") == ["no split after e.g. this one"]
    assert split_sentences("   ") == []


def _fake_wordnet(folder):
    folder.mkdir()
    licence = "  1 This software and database is being provided to you\n"
    lines = {
        "data.noun": [
            "00001 03 n 01 dog 0 000 | a domesticated canid; kept as a pet; "
            '"the dog barked all night"',
            '00002 03 n 01 cat 0 000 | a small feline; "the cat sat. It purred 2 times"',
            "00003 03 n 01 dup 0 000 | a domesticated canid",
        ],
        "data.verb": [
            "00004 29 v 01 run 0 000 | move fast by using one's feet; \"Don't run!\"- Mom"
        ],
        "data.adj": ["00005 00 a 01 big 0 000 | above average in size"],
        "data.adv": ["00006 02 r 01 up 0 000 | toward the top"],
    }
    for name, body in lines.items():
        (folder / name).write_text(licence + "\n".join(body) + "\n")
    return folder


def test_wordnet_parsing_and_corpus(tmp_path):
    root = _fake_wordnet(tmp_path / "wn")
    glosses = wordnet_glosses(root)
    assert glosses[:3] == ["a domesticated canid", "kept as a pet", "the dog barked all night"]
    assert "Don't run!" in glosses and not any("Mom" in g for g in glosses)
    text_module._MEMORY.clear()
    sentences = wordnet_sentences(root, min_words=2, cache_dir=tmp_path / "cache")
    assert sentences == [
        "a domesticated canid",
        "kept as a pet",
        "the dog barked all night",
        "a small feline",
        "the cat sat",
        "it purred two times",
        "move fast by using one's feet",
        "don't run",
        "above average in size",
        "toward the top",
    ]  # de-duplicated, in file order: noun, verb, adj, adv
    assert wordnet_sentences(root, min_words=3, max_words=3) == [
        "a domesticated canid",
        "a small feline",
        "the cat sat",
        "toward the top",
    ]
    # the disk cache is used once the in-memory one is gone, and rebuilt when the files change
    cache = tmp_path / "cache" / "wordnet_sentences.txt"
    assert cache.is_file()
    text_module._MEMORY.clear()
    cache.write_text(cache.read_text().replace("toward the top", "from the cache"))
    assert (
        wordnet_sentences(root, min_words=2, cache_dir=tmp_path / "cache")[-1] == "from the cache"
    )
    text_module._MEMORY.clear()
    with open(root / "data.adv", "a") as f:
        f.write("00007 02 r 01 down 0 000 | toward the bottom\n")
    assert (
        wordnet_sentences(root, min_words=2, cache_dir=tmp_path / "cache")[-1]
        == "toward the bottom"
    )


def test_wordnet_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="wordnet-base"):
        wordnet_glosses(tmp_path)
    with pytest.raises(ValueError, match="max_words"):
        wordnet_sentences(tmp_path, min_words=5, max_words=2)


@pytest.mark.skipif(not (WORDNET_DIR / "data.noun").is_file(), reason="wordnet-base not installed")
def test_real_wordnet_corpus():
    sentences = wordnet_sentences()
    assert len(sentences) > 100_000
    assert len(set(sentences)) == len(sentences)
    assert all(set(s) <= set(ALPHABET) for s in sentences[:5000])
    assert wordnet_sentences()[:100] == sentences[:100]
