"""One utterance of the synthetic speech corpus: voices, per-utterance parameters, and the
text -> espeak-ng -> 16 kHz -> noise pipeline.

Everything about utterance `index` of `split` is drawn from `np.random.default_rng((seed,
split id, bin id, index))`, so it does not depend on which process makes it, in which order, or on
how many utterances the corpus has. espeak-ng is made reproducible by `cape.lab.data.speech.espeak`.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from cape._checks import check_choice, check_int
from cape.lab.data.speech.audio import (
    NOISE_KINDS,
    add_noise,
    add_noise_floor,
    resample,
    sox_effects,
)
from cape.lab.data.speech.espeak import get_espeak
from cape.lab.data.text.sentences import TEXT_SOURCES, source_sentences

__all__ = [
    "DURATION_BINS",
    "HELDOUT_VOICES",
    "MAX_TRAIN_SECONDS",
    "SAMPLE_RATE",
    "SPEECH_SPLITS",
    "TRAIN_VOICES",
    "UtteranceParams",
    "bin_label",
    "synthesize_utterance",
    "text_pool",
    "utterance_params",
]

SAMPLE_RATE = 16000
"""Sample rate of the corpus' WAV files, Hz."""
MAX_TRAIN_SECONDS = 6.0
"""Longest training/validation utterance, seconds."""
DURATION_BINS: tuple[tuple[float, float], ...] = (
    (0, 6),
    (6, 10),
    (10, 15),
    (15, 20),
    (20, 30),
    (30, 45),
)
"""Test utterances fall in [lo, hi) seconds of one of these bins."""
SPEECH_SPLITS = ("train", "val", "test", "test_unseen_voices")
"""Corpus splits; the two test splits hold `test_per_bin` utterances in every duration bin."""

# espeak-ng voices are "<language>+<variant>". British English is "en" (espeak has no "en-gb").
TRAIN_ACCENTS = ("en-us", "en", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-gb-x-gbclan")
TRAIN_VARIANTS = ("m1", "m2", "m3", "m4", "m6", "f1", "f2", "f3", "f5", "klatt")
HELDOUT_ACCENTS = ("en-us-nyc", "en-gb-x-gbcwmd")
HELDOUT_VARIANTS = ("m5", "m7", "f4", "linda")
TRAIN_VOICES = tuple(f"{a}+{v}" for a in TRAIN_ACCENTS for v in TRAIN_VARIANTS)
"""The 60 voices of train, val and test: 6 accents x 10 voice variants."""
HELDOUT_VOICES = tuple(f"{a}+{v}" for a in HELDOUT_ACCENTS for v in HELDOUT_VARIANTS)
"""The 8 voices of `test_unseen_voices`: accents and variants that no training voice uses."""

RATE_WPM = (130, 210)  # espeak words per minute (175 is its default)
PITCH = (30, 70)  # espeak base pitch 0-100
PITCH_RANGE = (30, 80)  # espeak pitch range 0-100
PEAK = (0.3, 0.9)  # speech peak level before noise, full scale 1
SNR_DB = (10.0, 40.0)
NOISE_FLOOR_DB = -80.0
_SPLIT_ID = {name: i for i, name in enumerate(SPEECH_SPLITS)}
_CHARS_PER_SECOND = 18.0  # espeak at 175 wpm, measured over WordNet sentences
_ATTEMPTS = 12


def bin_label(lo: float, hi: float) -> str:
    """Label of a duration bin: (6, 10) -> "06-10"."""
    return f"{int(lo):02d}-{int(hi):02d}"


@dataclass(frozen=True)
class UtteranceParams:
    """Everything drawn for one utterance before its text: where it goes and how it sounds."""

    split: str
    name: str  # file stem inside the split's folder
    bin: str | None  # duration bin label for the test splits, else None
    lo: float  # the duration must lie in [lo, hi) seconds
    hi: float
    voice: str
    rate: int
    pitch: int
    range: int
    peak: float
    snr_db: float | None  # None: no additive noise (the noise floor stays)
    noise: str
    reverb: float | None  # sox reverberance, None: no reverb
    tempo: float | None  # sox tempo factor, None: unchanged
    seed: int  # seeds espeak's breath noise and the utterance's own generator
    source: str = "wordnet"  # what is said: one of `cape.lab.data.text.sentences.TEXT_SOURCES`

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def utterance_params(
    seed: int,
    split: str,
    index: int,
    *,
    bin_index: int | None = None,
    snr_db: tuple[float, float] | None = SNR_DB,
    sox: bool = False,
    source: str = "wordnet",
) -> UtteranceParams:
    """Draw utterance `index` (>= 0) of `split` (one of `SPEECH_SPLITS`). The test splits need
    `bin_index` into `DURATION_BINS`; train/val are limited to `MAX_TRAIN_SECONDS`. `snr_db` is the
    (low, high) range of the additive noise's SNR or None for none; `sox` turns on the optional
    sox reverb/tempo augmentation (each with probability 1/2); `source` is the text source (one of
    `TEXT_SOURCES`; the voice and sound draws do not depend on it)."""
    check_int("seed", seed, minimum=0)
    check_choice("split", split, SPEECH_SPLITS)
    check_choice("source", source, TEXT_SOURCES)
    check_int("index", index, minimum=0)
    testing = split.startswith("test")
    if testing:
        check_choice("bin_index", bin_index, list(range(len(DURATION_BINS))))
        assert bin_index is not None
        lo, hi = (float(v) for v in DURATION_BINS[bin_index])
        label: str | None = bin_label(lo, hi)
        name = f"{label}_{index:05d}"
    else:
        if bin_index is not None:
            raise ValueError(f"bin_index must be None for split {split!r}, got {bin_index!r}")
        lo, hi, label, name = 0.0, MAX_TRAIN_SECONDS, None, f"{index:06d}"
    bin_id = len(DURATION_BINS) if bin_index is None else bin_index
    rng = np.random.default_rng([seed, _SPLIT_ID[split], bin_id, index])
    voices = HELDOUT_VOICES if split == "test_unseen_voices" else TRAIN_VOICES
    snr = None if snr_db is None else round(float(rng.uniform(*snr_db)), 2)
    noise = NOISE_KINDS[int(rng.integers(len(NOISE_KINDS)))]
    reverb = round(float(rng.uniform(10, 60)), 1) if sox and rng.random() < 0.5 else None
    tempo = round(float(rng.uniform(0.9, 1.1)), 3) if sox and rng.random() < 0.5 else None
    return UtteranceParams(
        split=split,
        name=name,
        bin=label,
        lo=lo,
        hi=hi,
        voice=voices[int(rng.integers(len(voices)))],
        rate=int(rng.integers(RATE_WPM[0], RATE_WPM[1] + 1)),
        pitch=int(rng.integers(PITCH[0], PITCH[1] + 1)),
        range=int(rng.integers(PITCH_RANGE[0], PITCH_RANGE[1] + 1)),
        peak=round(float(rng.uniform(*PEAK)), 3),
        snr_db=snr,
        noise=noise,
        reverb=reverb,
        tempo=tempo,
        seed=int(rng.integers(2**31)),
        source=source,
    )


_POOLS: dict[tuple[str, str, str | None], list[str]] = {}


def text_pool(
    split: str, cache_dir: str | Path | None = None, source: str = "wordnet"
) -> list[str]:
    """The sentences of `source` (`cape.lab.data.text.sentences.source_sentences`: WordNet
    sentences or digit strings) that `split` draws from: a fixed partition by CRC-32 of the
    sentence, 85% train, 5% val, 10% test (both test splits), so no sentence is in two of them."""
    check_choice("split", split, SPEECH_SPLITS)
    part = "test" if split.startswith("test") else split
    key = (source, part, None if cache_dir is None else str(cache_dir))
    if key not in _POOLS:
        buckets = {"val": range(0, 5), "test": range(5, 15), "train": range(15, 100)}[part]
        _POOLS[key] = [
            s
            for s in source_sentences(source, cache_dir)
            if zlib.crc32(s.encode()) % 100 in buckets
        ]
    return _POOLS[key]


def _pick_text(
    pool: list[str], rng: np.random.Generator, target: float | None, hi: float, cps: float
) -> list[str]:
    """Sentences whose estimated duration (chars / cps) reaches `target` but stays below `hi`;
    with `target` None, one sentence below `hi`."""
    chosen: list[str] = []
    chars = 0
    for _ in range(10_000):
        cand = pool[int(rng.integers(len(pool)))]
        total = chars + len(cand) + (2 if chosen else 0)
        if total / cps < 0.95 * hi:
            chosen.append(cand)
            chars = total
            if target is None or chars / cps >= target:
                return chosen
        elif chosen and chars / cps >= 0.8 * target:
            return chosen
    if not chosen:
        raise RuntimeError(f"no sentence short enough for {hi} s at {cps:.1f} characters/s")
    return chosen


def _render(params: UtteranceParams, spoken: str) -> tuple[np.ndarray, list[float | None]]:
    """espeak -> float 16 kHz (-> sox): the clean speech [N] and word start times."""
    synth = get_espeak().synthesize(
        spoken,
        voice=params.voice,
        rate=params.rate,
        pitch=params.pitch,
        range_=params.range,
        seed=params.seed,
    )
    wave = resample(synth.samples.astype(np.float32) / 32768.0, synth.sample_rate, SAMPLE_RATE)
    starts = synth.word_starts
    if params.reverb is not None or params.tempo is not None:
        wave = sox_effects(wave, SAMPLE_RATE, reverb=params.reverb, tempo=params.tempo)
        if params.tempo is not None:
            starts = [None if s is None else s / params.tempo for s in starts]
    return wave, starts


def synthesize_utterance(
    params: UtteranceParams, *, cache_dir: str | Path | None = None
) -> tuple[np.ndarray, dict]:
    """Make one utterance: (wave float32 [N] at `SAMPLE_RATE`, in [-1, 1]; record dict).

    Sentences from the split's `text_pool` (of `params.source`) are joined (". " between them,
    for espeak's pauses) until the estimated duration reaches a target drawn in the utterance's
    [lo, hi) range; after synthesis the real duration is measured and, outside the range, the
    text is drawn again with the speaking speed re-estimated (up to 12 times, then RuntimeError
    naming the utterance).
    The speech is scaled to its peak level, gets a noise floor, then white/pink noise at
    `snr_db`. The record holds the label text (normalised, sentences joined by spaces), the
    duration, the word start times (seconds, None where espeak gave none) and `params`.
    """
    rng = np.random.default_rng([params.seed, 1])
    pool = text_pool(params.split, cache_dir, params.source)
    cps = _CHARS_PER_SECOND * params.rate / 175 * (params.tempo or 1.0)
    lo, hi = params.lo, params.hi
    width = hi - lo
    for _attempt in range(_ATTEMPTS):
        if params.bin is None:  # train/val: one sentence
            sentences = _pick_text(pool, rng, None, hi, cps)
        else:
            target = float(rng.uniform(max(lo + 0.15 * width, 1.0), hi - 0.15 * width))
            sentences = _pick_text(pool, rng, target, hi, cps)
        spoken = ". ".join(sentences) + "."
        clean, starts = _render(params, spoken)
        duration = len(clean) / SAMPLE_RATE
        if lo <= duration < hi:
            break
        cps = len(spoken) / max(duration, 0.1)  # what this voice and rate really gave
    else:
        raise RuntimeError(
            f"{params.split}/{params.name}: no text gave a duration in [{lo}, {hi}) s "
            f"in {_ATTEMPTS} attempts"
        )
    peak = float(np.max(np.abs(clean))) if len(clean) else 0.0
    if peak > 0:
        clean = clean * (params.peak / peak)
    noise_rng = np.random.default_rng([params.seed, 2])
    wave = add_noise_floor(clean, noise_rng, level_db=NOISE_FLOOR_DB)
    if params.snr_db is not None:
        wave = add_noise(wave, params.snr_db, noise_rng, kind=params.noise)
    top = float(np.max(np.abs(wave))) if len(wave) else 0.0
    if top > 0.99:
        wave = wave * (0.99 / top)  # no clipping; the SNR is unchanged
    text = " ".join(sentences)
    record = {
        "name": params.name,
        "path": f"{params.split}/{params.name}.wav",
        "duration": round(len(wave) / SAMPLE_RATE, 4),
        "num_samples": len(wave),
        "sample_rate": SAMPLE_RATE,
        "text": text,
        "word_starts": [None if s is None else round(s, 3) for s in starts],
        **{k: v for k, v in params.to_dict().items() if k not in ("name", "lo", "hi")},
    }
    return wave.astype(np.float32), record
