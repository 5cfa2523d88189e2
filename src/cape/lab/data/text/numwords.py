"""English words for numbers, as a speech corpus needs them: cardinals, ordinals, years, decimals.

American style without "and": 123 -> "one hundred twenty three". Words are separated by single
spaces (no hyphens: "twenty one"), so the result is already in `normalize_text`'s alphabet.
"""

from __future__ import annotations

import re

__all__ = ["decimal_words", "integer_words", "ordinal_words", "plural_words", "year_words"]

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (10**3, "thousand"))
_DIGITS = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"[0-9]*(?:\.[0-9]*)?")
_MAX = 10**15  # integer_words spells 0 .. _MAX - 1 as a number; larger ones digit by digit
# last word of a cardinal -> its ordinal; words not listed take "th" ("seven" -> "seventh")
_ORDINAL = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}


def _below_thousand(n: int) -> list[str]:
    words: list[str] = []
    if n >= 100:
        words += [_ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        words.append(_TENS[n // 10])
        n %= 10
        if n:
            words.append(_ONES[n])
    elif n or not words:
        words.append(_ONES[n])
    return words


def integer_words(n: int) -> str:
    """Cardinal words of an integer: -42 -> "minus forty two"; 1005 -> "one thousand five".

    |n| >= 10**15 is read digit by digit ("one two three ...").
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__} {n!r}")
    if n < 0:
        return "minus " + integer_words(-n)
    if n >= _MAX:
        return digit_words(str(n))
    if n < 1000:
        return " ".join(_below_thousand(n))
    words: list[str] = []
    for scale, name in _SCALES:
        if n >= scale:
            words += _below_thousand(n // scale) + [name]
            n %= scale
    if n:
        words += _below_thousand(n)
    return " ".join(words)


def digit_words(digits: str) -> str:
    """Each digit as a word: "007" -> "zero zero seven"."""
    if not _DIGITS.fullmatch(digits):
        raise ValueError(f"digits must be a string of decimal digits, got {digits!r}")
    return " ".join(_ONES[int(d)] for d in digits)


def ordinal_words(n: int) -> str:
    """Ordinal words: 1 -> "first", 22 -> "twenty second", 100 -> "one hundredth"."""
    head, _, last = integer_words(n).rpartition(" ")
    if last in _ORDINAL:
        last = _ORDINAL[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return f"{head} {last}" if head else last


def year_words(n: int) -> str:
    """A year read as people say it: 1984 -> "nineteen eighty four", 1905 -> "nineteen oh five",
    1900 -> "nineteen hundred", 2005 -> "two thousand five", 2019 -> "twenty nineteen".

    Years outside 1000..9999 and multiples of 1000 are read as cardinals.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__} {n!r}")
    if not 1000 <= n <= 9999 or n % 1000 == 0 or ((n // 100) % 10 == 0 and n % 100 < 10):
        return integer_words(n)  # 1000, 2000, 2005: "two thousand five"
    century, rest = divmod(n, 100)
    first = integer_words(century)
    if rest == 0:
        return f"{first} hundred"
    if rest < 10:
        return f"{first} oh {_ONES[rest]}"
    return f"{first} {integer_words(rest)}"


def decimal_words(text: str) -> str:
    """A decimal number written with a point: "3.14" -> "three point one four",
    ".5" -> "point five", "2." -> "two"."""
    whole, dot, frac = text.partition(".")
    if not _DECIMAL.fullmatch(text) or not (whole + frac):
        raise ValueError(f"text must look like 12.34, got {text!r}")
    words = [integer_words(int(whole))] if whole else []
    if dot and frac:
        words += ["point", digit_words(frac)]
    return " ".join(words)


def plural_words(words: str) -> str:
    """Plural of the last word, for decades and the like: "nineteen twenty" -> "nineteen twenties",
    "eighteen hundred" -> "eighteen hundreds", "six" -> "sixes"."""
    head, _, last = words.rpartition(" ")
    if last.endswith("y"):
        last = last[:-1] + "ies"
    elif last.endswith(("x", "s")):
        last += "es"
    else:
        last += "s"
    return f"{head} {last}" if head else last
