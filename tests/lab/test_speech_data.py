"""The offline speech corpus: resampler, noise, espeak-ng, duration bins, determinism, resuming,
verification. Corpora here are tiny (a few utterances) so the file runs in seconds."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from cape.lab.data import (
    ALPHABET,
    DURATION_BINS,
    HELDOUT_VOICES,
    MAX_TRAIN_SECONDS,
    SPEECH_SPLITS,
    TRAIN_VOICES,
    CorpusError,
    add_noise,
    add_noise_floor,
    bin_label,
    colored_noise,
    espeak_available,
    get_espeak,
    load_manifest,
    make_speech_corpus,
    read_wav,
    resample,
    speech_main,
    utterance_params,
    verify_corpus,
    write_wav,
)

needs_espeak = pytest.mark.skipif(not espeak_available(), reason="libespeak-ng is not installed")


# --- resampler and noise: no espeak needed ---------------------------------------------------


@pytest.mark.parametrize(
    ("orig", "new"), [(22050, 16000), (16000, 22050), (16000, 8000), (44100, 48000)]
)
@pytest.mark.parametrize("freq", [220.0, 1000.0, 3100.0])
def test_resampled_sine_keeps_frequency_amplitude_and_phase(orig, new, freq):
    t = np.arange(orig) / orig  # one second
    y = resample(np.sin(2 * np.pi * freq * t + 0.3), orig, new)
    assert y.dtype == np.float32 and y.shape == (-(-orig * new // orig),)
    expected = np.sin(
        2 * np.pi * freq * np.arange(len(y)) / new + 0.3
    )  # closed form at the new rate
    inner = slice(new // 20, -new // 20)  # away from the zero-padded ends
    assert np.max(np.abs(y[inner] - expected[inner])) < 1e-3
    spectrum = np.abs(np.fft.rfft(y[inner] * np.hanning(len(y[inner]))))
    peak_hz = np.argmax(spectrum) * new / len(y[inner])
    assert abs(peak_hz - freq) < 2.0


def test_resampler_removes_what_the_new_rate_cannot_hold():
    t = np.arange(22050) / 22050
    y = resample(np.sin(2 * np.pi * 9500 * t), 22050, 16000)  # above the new Nyquist (8 kHz)
    assert np.max(np.abs(y[800:-800])) < 1e-3
    assert np.array_equal(resample(np.ones(5), 16000, 16000), np.ones(5, np.float32))
    assert resample(np.zeros(0), 22050, 16000).shape == (0,)
    with pytest.raises(ValueError, match="1-D"):
        resample(np.zeros((2, 3)), 22050, 16000)
    with pytest.raises(ValueError, match="new_sr"):
        resample(np.zeros(3), 22050, 0)


@pytest.mark.parametrize("kind", ["white", "pink"])
@pytest.mark.parametrize("snr", [10.0, 23.5, 40.0])
def test_added_noise_has_the_requested_snr(kind, snr):
    rng = np.random.default_rng(0)
    clean = (0.3 * np.sin(np.arange(32000) * 0.05) * (np.arange(32000) > 8000)).astype(np.float32)
    noisy = add_noise(clean, snr, rng, kind=kind)
    noise = noisy.astype(np.float64) - clean.astype(np.float64)
    measured = 10 * np.log10(np.sum(clean.astype(np.float64) ** 2) / np.sum(noise**2))
    assert abs(measured - snr) < 0.01
    assert not np.array_equal(add_noise(clean, snr, rng, kind=kind), noisy)  # fresh noise


def test_pink_noise_falls_3db_per_octave_and_floor_fills_silence():
    rng = np.random.default_rng(1)
    power = np.abs(np.fft.rfft(colored_noise(1 << 16, rng, "pink"))) ** 2
    band = lambda lo: power[lo : 2 * lo].mean()  # noqa: E731 - one octave starting at bin lo
    octaves_db = [10 * np.log10(band(lo) / band(2 * lo)) for lo in (64, 256, 1024)]
    assert all(2.0 < d < 4.0 for d in octaves_db), octaves_db
    white = np.abs(np.fft.rfft(colored_noise(1 << 16, rng, "white"))) ** 2
    assert abs(10 * np.log10(white[64:128].mean() / white[4096:8192].mean())) < 1.0
    floored = add_noise_floor(np.zeros(16000, np.float32), rng, level_db=-80)
    assert np.all(floored != 0) and abs(np.sqrt(np.mean(floored**2.0)) - 1e-4) < 1e-5
    with pytest.raises(ValueError, match="kind must be one of"):
        add_noise(floored, 10.0, rng, kind="brown")
    with pytest.raises(ValueError, match="snr_db"):
        add_noise(floored, float("nan"), rng)


def test_wav_round_trip_and_errors_name_the_file(tmp_path):
    pytest.importorskip("soundfile")
    x = (0.5 * np.sin(np.arange(1600) * 0.1)).astype(np.float32)
    write_wav(tmp_path / "a.wav", x, 16000)
    y, sr = read_wav(tmp_path / "a.wav")
    assert sr == 16000 and y.dtype == np.float32 and y.shape == (1600,)
    assert np.max(np.abs(y - x)) < 1 / 32768 + 1e-7  # 16-bit PCM
    with pytest.raises(FileNotFoundError, match="b.wav"):
        read_wav(tmp_path / "b.wav")
    (tmp_path / "c.wav").write_bytes(b"RIFF garbage")
    with pytest.raises(ValueError, match="c.wav"):
        read_wav(tmp_path / "c.wav")
    # stereo: refused by default, averaged with mix=True
    import soundfile

    stereo = np.stack([x, -0.5 * x], axis=1)
    soundfile.write(str(tmp_path / "s.wav"), stereo, 8000, subtype="FLOAT")
    with pytest.raises(ValueError, match="s.wav must be mono, got 2 channels"):
        read_wav(tmp_path / "s.wav")
    mixed, sr = read_wav(tmp_path / "s.wav", mix=True)
    assert sr == 8000 and mixed.dtype == np.float32
    np.testing.assert_allclose(mixed, 0.25 * x, atol=1e-7)


# --- voices and espeak-ng ----------------------------------------------------------------------


def test_heldout_voices_share_nothing_with_training_voices():
    assert not set(TRAIN_VOICES) & set(HELDOUT_VOICES)
    accents = lambda voices: {v.split("+")[0] for v in voices}  # noqa: E731
    variants = lambda voices: {v.split("+")[1] for v in voices}  # noqa: E731
    assert not accents(TRAIN_VOICES) & accents(HELDOUT_VOICES)
    assert not variants(TRAIN_VOICES) & variants(HELDOUT_VOICES)
    assert len(accents(TRAIN_VOICES)) >= 6 and len(TRAIN_VOICES) >= 40
    for i in range(30):
        assert utterance_params(0, "test_unseen_voices", i, bin_index=0).voice in HELDOUT_VOICES
        assert utterance_params(0, "train", i).voice in TRAIN_VOICES


def test_utterance_params_are_a_function_of_seed_split_index():
    a = utterance_params(3, "train", 17)
    assert a == utterance_params(3, "train", 17)
    assert a != utterance_params(4, "train", 17) and a != utterance_params(3, "val", 17)
    assert 10 <= a.snr_db <= 40 and a.bin is None and a.hi == MAX_TRAIN_SECONDS
    t = utterance_params(3, "test", 2, bin_index=4)
    assert (t.lo, t.hi, t.bin, t.name) == (20.0, 30.0, "20-30", "20-30_00002")
    with pytest.raises(ValueError, match="split must be one of"):
        utterance_params(0, "dev", 0)
    with pytest.raises(ValueError, match="bin_index must be one of"):
        utterance_params(0, "test", 0)
    with pytest.raises(ValueError, match="index must be an int >= 0"):
        utterance_params(0, "train", -1)


@needs_espeak
def test_every_voice_exists():
    engine = get_espeak()
    for voice in TRAIN_VOICES + HELDOUT_VOICES:
        engine.set_voice(voice)
    with pytest.raises(ValueError, match="no voice"):
        engine.set_voice("xx-nowhere+m1")


@needs_espeak
def test_espeak_is_reproducible_whatever_was_said_before():
    engine = get_espeak()
    text = "the quick brown fox jumps over the lazy dog"
    first = engine.synthesize(text, voice="en-us+m3", rate=160, pitch=40, range_=60, seed=5)
    engine.synthesize("something else entirely", voice="en-gb-x-rp+f3", rate=200)
    again = engine.synthesize(text, voice="en-us+m3", rate=160, pitch=40, range_=60, seed=5)
    assert np.array_equal(first.samples, again.samples) and first.sample_rate == 22050
    assert 1.5 < first.duration < 5.0
    starts = first.word_starts
    assert len(starts) == len(text.split()) and starts[0] == 0.0
    known = [s for s in starts if s is not None]
    assert len(known) >= 7 and known == sorted(known) and known[-1] < first.duration
    slower = engine.synthesize(text, voice="en-us+m3", rate=100, seed=5)
    assert slower.duration > 1.3 * first.duration
    with pytest.raises(ValueError, match="rate must be"):
        engine.synthesize(text, rate=1000)


# --- the corpus --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    if not espeak_available():
        pytest.skip("libespeak-ng is not installed")
    pytest.importorskip("soundfile")
    root = tmp_path_factory.mktemp("speech")
    summary = make_speech_corpus(
        root, train=3, val=1, test_per_bin=1, seed=7, workers=1, progress=False
    )
    return root, summary


def test_corpus_layout_and_manifests(corpus):
    root, summary = corpus
    assert summary["train"] == {"made": 3, "kept": 0, "repaired": 0}
    for split in SPEECH_SPLITS:
        records = load_manifest(root, split)
        assert len(records) == {"train": 3, "val": 1}.get(split, len(DURATION_BINS))
        for r in records:
            wave, sr = read_wav(root / r["path"])
            assert sr == 16000 and len(wave) == r["num_samples"]
            assert abs(r["duration"] - len(wave) / sr) < 1e-3
            assert np.all(np.isfinite(wave)) and 0 < np.max(np.abs(wave)) <= 1.0
            assert r["text"] and set(r["text"]) <= set(ALPHABET)
            assert len(r["word_starts"]) == len(r["text"].split())
            assert 10 <= r["snr_db"] <= 40 and r["noise"] in ("white", "pink")
            voices = HELDOUT_VOICES if split == "test_unseen_voices" else TRAIN_VOICES
            assert r["voice"] in voices
    info = verify_corpus(root)
    assert info["train"]["utterances"] == 3 and info["test"]["seconds"] >= sum(
        lo for lo, _ in DURATION_BINS
    )


def test_durations_fall_in_their_bins(corpus):
    root, _ = corpus
    for split in ("train", "val"):
        assert all(0 < r["duration"] <= MAX_TRAIN_SECONDS for r in load_manifest(root, split))
    for split in ("test", "test_unseen_voices"):
        records = load_manifest(root, split)
        assert [r["bin"] for r in records] == [bin_label(*b) for b in DURATION_BINS]
        for r, (lo, hi) in zip(records, DURATION_BINS, strict=True):
            assert lo <= r["duration"] < hi, r
        assert len(load_manifest(root, split, bin="30-45")) == 1
        long = load_manifest(root, split, bin="30-45")[0]
        assert len(long["text"].split()) > 60  # sentences were joined


def test_same_seed_same_audio_in_any_process(corpus, tmp_path):
    root, _ = corpus
    # two worker processes, another order, fewer utterances: the same bytes
    make_speech_corpus(
        tmp_path / "b", train=3, val=0, test_per_bin=0, seed=7, workers=2, progress=False
    )
    for a, b in zip(
        load_manifest(root, "train"), load_manifest(tmp_path / "b", "train"), strict=True
    ):
        assert a == b
        assert (root / a["path"]).read_bytes() == (tmp_path / "b" / b["path"]).read_bytes()
    make_speech_corpus(
        tmp_path / "c", train=2, val=0, test_per_bin=0, seed=8, workers=1, progress=False
    )
    other = load_manifest(tmp_path / "c", "train")
    assert [r["text"] for r in other] != [r["text"] for r in load_manifest(root, "train")[:2]]
    with pytest.raises(ValueError, match="seed"):
        make_speech_corpus(tmp_path / "c", train=2, val=0, test_per_bin=0, seed=9, progress=False)


def test_resume_remakes_only_what_is_missing(corpus, tmp_path):
    root, _ = corpus
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    records = load_manifest(copy, "train")
    victim = copy / records[1]["path"]
    original = victim.read_bytes()
    victim.unlink()
    (copy / "train.jsonl").unlink()
    mtimes = {p: p.stat().st_mtime_ns for p in copy.rglob("*.wav")}
    summary = make_speech_corpus(
        copy, train=3, val=1, test_per_bin=1, seed=7, workers=1, progress=False
    )
    assert summary["train"] == {"made": 1, "kept": 2, "repaired": 1}
    assert all(summary[s]["made"] == 0 for s in ("val", "test", "test_unseen_voices"))
    assert victim.read_bytes() == original  # the same utterance again
    assert all(p.stat().st_mtime_ns == t for p, t in mtimes.items())  # nothing else rewritten
    assert load_manifest(copy, "train") == records
    # a larger corpus keeps every utterance it already has
    bigger = make_speech_corpus(
        copy, train=4, val=1, test_per_bin=1, seed=7, workers=1, progress=False
    )
    assert bigger["train"] == {"made": 1, "kept": 3, "repaired": 0}


def test_verify_names_every_missing_or_corrupt_file(corpus, tmp_path, capsys):
    root, _ = corpus
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    assert speech_main(["--root", str(copy), "--verify"]) == 0
    train = load_manifest(copy, "train")
    corrupt, missing = copy / train[0]["path"], copy / train[2]["path"]
    data = bytearray(corrupt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    missing.unlink()
    (copy / "val.jsonl").unlink()
    with pytest.raises(CorpusError) as info:
        verify_corpus(copy)
    message = str(info.value)
    assert corrupt.name in message and "corrupt" in message
    assert missing.name in message and "missing" in message
    assert "val.jsonl" in message and len(info.value.problems) == 3
    capsys.readouterr()
    assert speech_main(["--root", str(copy), "--verify"]) == 1
    assert corrupt.name in capsys.readouterr().err
    # a rerun repairs both files, by name, and the corpus verifies again
    summary = make_speech_corpus(
        copy, train=3, val=1, test_per_bin=1, seed=7, workers=1, progress=False
    )
    assert summary["train"]["repaired"] == 2
    assert verify_corpus(copy)["train"]["utterances"] == 3
    assert json.loads((copy / "corpus.json").read_text())["seed"] == 7


def test_argument_checks_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="train must be an int >= 0"):
        make_speech_corpus(tmp_path, train=-1)
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        make_speech_corpus(tmp_path, workers=0)
    with pytest.raises(ValueError, match="snr_db"):
        make_speech_corpus(tmp_path, snr_db=(30, 10))
    with pytest.raises(ValueError, match="split must be one of"):
        load_manifest(tmp_path, "dev")
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        load_manifest(tmp_path, "train")


# --- spoken digit strings (the small-vocabulary text source) ------------------------------------


def test_digit_sentences_are_unique_spelled_digit_strings():
    from cape.lab.data.text.sentences import digit_sentences

    words = "zero one two three four five six seven eight nine".split()
    got = digit_sentences(2000, min_digits=2, max_digits=6, seed=3)
    assert len(got) == len(set(got)) == 2000
    for s in got:
        # read back as digits with an independent table: every word is a digit
        digits = "".join(str(words.index(w)) for w in s.split())
        assert 2 <= len(digits) <= 6
    lengths = {len(s.split()) for s in got}
    assert lengths == {2, 3, 4, 5, 6}  # every length drawn
    assert digit_sentences(2000, min_digits=2, max_digits=6, seed=3) == got
    assert digit_sentences(2000, min_digits=2, max_digits=6, seed=4) != got
    with pytest.raises(ValueError, match="count must be <= 10\\*\\*max_digits"):
        digit_sentences(101, min_digits=1, max_digits=2)
    with pytest.raises(ValueError, match="max_digits must be an int >= 5"):
        digit_sentences(10, min_digits=5, max_digits=4)


def test_text_pools_partition_each_source():
    from cape.lab.data import text_pool

    pools = {s: set(text_pool(s, source="digits")) for s in ("train", "val", "test")}
    assert text_pool("test_unseen_voices", source="digits") == text_pool("test", source="digits")
    assert not (
        pools["train"] & pools["val"]
        or pools["train"] & pools["test"]
        or pools["val"] & pools["test"]
    )
    total = sum(len(p) for p in pools.values())
    assert 0.8 < len(pools["train"]) / total < 0.9  # 85% by CRC-32
    assert all(set(s) <= set("abcdefghijklmnopqrstuvwxyz ") for s in pools["val"])
    with pytest.raises(ValueError, match="source must be one of"):
        text_pool("train", source="klingon")


@needs_espeak
def test_digits_corpus_says_digits_and_keeps_its_text_setting(tmp_path):
    pytest.importorskip("soundfile")
    words = set("zero one two three four five six seven eight nine".split())
    make_speech_corpus(
        tmp_path, train=2, val=0, test_per_bin=0, seed=7, workers=1, text="digits", progress=False
    )
    records = load_manifest(tmp_path, "train")
    assert all(set(r["text"].split()) <= words and r["source"] == "digits" for r in records)
    assert json.loads((tmp_path / "corpus.json").read_text())["text"] == "digits"
    # the same voices and sound draws as a WordNet corpus of the same seed: only the words differ
    wordnet = utterance_params(7, "train", 0)
    assert utterance_params(7, "train", 0, source="digits").voice == wordnet.voice
    with pytest.raises(ValueError, match="text='digits'.*text='wordnet'"):
        make_speech_corpus(tmp_path, train=2, val=0, test_per_bin=0, seed=7, progress=False)
    with pytest.raises(ValueError, match="text must be one of"):
        make_speech_corpus(tmp_path / "x", text="numbers")
