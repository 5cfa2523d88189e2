"""cape.lab.apps.transcribe: loading trained runs, reading users' audio, transcribing and
scoring."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from cape.lab.apps.transcribe import (
    evaluate_folder,
    load_asr_model,
    load_audio,
    read_transcripts,
    transcribe,
)
from cape.lab.apps.transcribe_cli import main as transcribe_main
from cape.lab.data.speech.features import hop_samples, log_mel
from cape.lab.data.speech.synth import DURATION_BINS
from cape.lab.data.speech.tokens import (
    BLANK,
    VOCAB_SIZE,
    ctc_beam_decode,
    ctc_greedy_decode,
    encode,
)
from cape.lab.metrics import cer, wer
from cape.lab.train.checkpoint import save_checkpoint
from cape.models import CTCModel

SR = 16000
MODEL_KW = dict(
    vocab_size=VOCAB_SIZE, n_mels=80, dim=32, depth=1, heads=2, ffn_dim=64, position="sinpos"
)
FEATURES = {"sample_rate": SR, "n_mels": 80, "win_ms": 25.0, "hop_ms": 10.0}


def _tiny(seed: int) -> CTCModel:
    torch.manual_seed(seed)
    return CTCModel(**MODEL_KW)


def _make_run(root: Path, *, best: bool = True) -> tuple[Path, CTCModel, CTCModel]:
    """RUN with best/ = model seed 0 (when `best`) and step_00000010 = model seed 1."""
    run = root / "run"
    best_model, step_model = _tiny(0), _tiny(1)
    if best:
        save_checkpoint(run / "checkpoints", 5, best_model, name="best")
    save_checkpoint(run / "checkpoints", 10, step_model)
    (run / "model.json").write_text(json.dumps({"model": MODEL_KW, "features": FEATURES}))
    return run, best_model, step_model


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _noise(seconds: float, seed: int = 0, sr: int = SR) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * sr)) / sr
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * rng.standard_normal(t.size)).astype(
        np.float32
    )


# -- load_asr_model ----------------------------------------------------------------------------
def test_load_run_and_checkpoint_folders(tmp_path: Path) -> None:
    run, best_model, step_model = _make_run(tmp_path)
    model, spec = load_asr_model(run)
    assert not model.training
    assert _same_weights(model, best_model) and not _same_weights(model, step_model)
    assert spec["features"] == FEATURES and spec["model"] == MODEL_KW
    assert Path(spec["checkpoint"]) == run / "checkpoints" / "best"
    for kwargs in ({"checkpoint": "latest"}, {"checkpoint": "step_00000010"}):
        assert _same_weights(load_asr_model(run, **kwargs)[0], step_model)
    # a checkpoint folder: model.json two levels up, its own weights
    assert _same_weights(load_asr_model(run / "checkpoints" / "best")[0], best_model)
    assert _same_weights(load_asr_model(run / "checkpoints" / "step_00000010")[0], step_model)


def test_best_falls_back_to_latest(tmp_path: Path) -> None:
    run, _, step_model = _make_run(tmp_path, best=False)
    model, spec = load_asr_model(run, checkpoint="best")
    assert _same_weights(model, step_model)
    assert Path(spec["checkpoint"]).name == "step_00000010"


def test_load_errors_name_the_path(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="model.json") as e:
        load_asr_model(empty)
    assert str(empty) in str(e.value)
    run, _, _ = _make_run(tmp_path)
    (run / "model.json").unlink()
    with pytest.raises(FileNotFoundError, match="model.json") as e:
        load_asr_model(run / "checkpoints" / "best")
    assert str(run / "model.json") in str(e.value)

    untrained = tmp_path / "untrained"
    untrained.mkdir()
    (untrained / "model.json").write_text(json.dumps({"model": MODEL_KW, "features": FEATURES}))
    with pytest.raises(FileNotFoundError, match="train it first") as e:
        load_asr_model(untrained)
    assert str(untrained / "checkpoints") in str(e.value)


def test_load_errors_for_bad_spec_and_names(tmp_path: Path) -> None:
    run, _, _ = _make_run(tmp_path)
    spec_file = run / "model.json"
    with pytest.raises(FileNotFoundError, match="step_00000010"):  # lists what exists
        load_asr_model(run, checkpoint="step_99")
    with pytest.raises(ValueError, match="checkpoint"):
        load_asr_model(run, checkpoint="../other")
    spec_file.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_asr_model(run)
    spec_file.write_text(json.dumps({"model": MODEL_KW, "features": {"sample_rate": SR}}))
    with pytest.raises(ValueError, match="hop_ms") as e:
        load_asr_model(run)
    assert str(spec_file) in str(e.value)
    spec_file.write_text(json.dumps({"model": {**MODEL_KW, "depht": 2}, "features": FEATURES}))
    with pytest.raises(ValueError, match="CTCModel"):
        load_asr_model(run)
    spec_file.write_text(json.dumps({"model": {**MODEL_KW, "dim": 64}, "features": FEATURES}))
    with pytest.raises(ValueError, match="do not fit"):
        load_asr_model(run)


# -- transcribe --------------------------------------------------------------------------------
def test_transcribe_matches_an_independent_forward() -> None:
    model = _tiny(3).eval()
    spec = {"model": MODEL_KW, "features": FEATURES}
    waves = [torch.from_numpy(_noise(0.5, seed=1)), torch.from_numpy(_noise(0.8, seed=2))]
    expect_greedy, expect_beam = [], []
    with torch.no_grad():
        for w in waves:
            feats = log_mel(w, SR, hop_ms=10.0, win_ms=25.0, n_mels=80)[None]
            lp, n = model(feats, hop=0.01)
            expect_greedy += ctc_greedy_decode(lp, n)
            expect_beam += ctc_beam_decode(lp, n, beam_width=3)
    assert all(expect_greedy)  # a random head is rarely all blank: the comparison means something
    model.train()  # dropout on: transcribe must decode in eval mode and give the mode back
    assert transcribe(model, spec, waves) == expect_greedy
    assert model.training
    assert transcribe(model.eval(), spec, waves, beam=3) == expect_beam
    with pytest.raises(TypeError, match="list"):
        transcribe(model, spec, waves[0])
    with pytest.raises(ValueError, match=r"waves\[1\]"):
        transcribe(model, spec, [waves[0], torch.zeros(100)])


@pytest.mark.parametrize("hop_ms", [10.0, 20.0, 12.5])
def test_hop_override_changes_frames(hop_ms: float) -> None:
    model = _tiny(4).eval()
    spec = {"model": MODEL_KW, "features": FEATURES}
    wave = torch.from_numpy(_noise(1.0, seed=3))
    seen: list[tuple[int, float]] = []
    forward = model.forward

    def spy(features, lengths=None, *, hop=0.01, generator=None):
        seen.append((features.shape[1], hop))
        return forward(features, lengths, hop=hop, generator=generator)

    model.forward = spy
    text = transcribe(model, spec, [wave], hop_ms=hop_ms)
    hop = hop_samples(hop_ms, SR)
    win = round(0.025 * SR)
    assert seen == [(1 + (len(wave) - win) // hop, hop / SR)]
    assert seen[0][0] == log_mel(wave, SR, hop_ms=hop_ms).shape[0]
    with torch.no_grad():
        lp, n = forward(log_mel(wave, SR, hop_ms=hop_ms)[None], hop=hop / SR)
    assert text == ctc_greedy_decode(lp, n)


# -- audio and transcripts ---------------------------------------------------------------------
def test_load_audio_mono_stereo_and_errors(tmp_path: Path) -> None:
    sf = pytest.importorskip("soundfile")
    from cape.lab.data.speech.audio import write_wav

    left, right = _noise(0.5, seed=5), 0.5 * _noise(0.5, seed=6)
    write_wav(tmp_path / "mono.wav", left, SR)
    mono = load_audio(tmp_path / "mono.wav", SR)
    assert mono.dtype == torch.float32 and mono.shape == (len(left),)
    np.testing.assert_allclose(mono.numpy(), left, atol=1 / 32768 + 1e-6)  # 16-bit rounding
    sf.write(tmp_path / "stereo.wav", np.stack([left, right], 1), SR, subtype="PCM_16")
    stereo = load_audio(tmp_path / "stereo.wav", SR)
    np.testing.assert_allclose(stereo.numpy(), (left + right) / 2, atol=1 / 32768 + 1e-6)
    sf.write(tmp_path / "cd.wav", np.stack([left, right], 1), 44100, subtype="PCM_16")
    assert load_audio(tmp_path / "cd.wav", SR).shape == (math.ceil(len(left) * SR / 44100),)

    write_wav(tmp_path / "short.wav", left[:300], SR)  # < 400 samples = one 25 ms window
    with pytest.raises(ValueError, match="short.wav.*too short"):
        load_audio(tmp_path / "short.wav", SR)
    (tmp_path / "junk.wav").write_bytes(b"not a wav file at all")
    with pytest.raises(ValueError, match="junk.wav"):
        load_audio(tmp_path / "junk.wav", SR)
    with pytest.raises(FileNotFoundError, match="nothere.wav"):
        load_audio(tmp_path / "nothere.wav", SR)


def test_read_transcripts(tmp_path: Path) -> None:
    tsv = tmp_path / "t.tsv"
    tsv.write_text("# name\ttext\n\na.wav\tHello, World 42\n  \nsub/b\tIt's 3 o'clock\n")
    assert read_transcripts(tsv) == {"a": "hello world forty two", "sub/b": "it's three o'clock"}
    for body, line, what in [
        ("a\tx\nb has no tab\n", 2, "no tab"),
        ("# c\n\n\tempty name\n", 3, "empty name"),
        ("a\tx\nb\ty\na.wav\tz\n", 3, "duplicate"),
        ("../up\tx\n", 1, "relative"),
    ]:
        tsv.write_text(body)
        with pytest.raises(ValueError, match=f"line {line}: .*{what}") as e:
            read_transcripts(tsv)
        assert str(tsv) in str(e.value)
    with pytest.raises(ValueError, match="first on line 1"):
        tsv.write_text("a\tx\na\ty\n")
        read_transcripts(tsv)
    with pytest.raises(FileNotFoundError, match="missing.tsv"):
        read_transcripts(tmp_path / "missing.tsv")


# -- evaluate_folder with a rigged model -------------------------------------------------------
SHORT, LONG = "the cat", "a dog ran"  # what the rigged model says below / above 6 s


def _rigged(frames_for_6s: int) -> CTCModel:
    """A model whose forward spells SHORT for inputs under 6 s and LONG from 6 s, one token per
    two frames with blanks between and after."""
    model = _tiny(7).eval()

    def forward(features, lengths=None, *, hop=0.01, generator=None):
        frames = features.shape[1]
        ids = encode(LONG if frames >= frames_for_6s else SHORT).tolist()
        path = torch.full((frames,), BLANK)
        path[: 2 * len(ids) : 2] = torch.tensor(ids)
        log_probs = torch.full((1, frames, VOCAB_SIZE), -30.0)
        log_probs[0, torch.arange(frames), path] = 0.0
        return log_probs.log_softmax(-1), torch.tensor([frames])

    model.forward = forward
    return model


def test_evaluate_folder_scores_known_transcripts(tmp_path: Path) -> None:
    sf = pytest.importorskip("soundfile")
    from cape.lab.data.speech.audio import write_wav

    folder = tmp_path / "wavs"
    folder.mkdir()
    durations = {"s1": 1.0, "s2": 2.5, "l1": 6.5}
    for i, (name, sec) in enumerate(durations.items()):
        write_wav(folder / f"{name}.wav", _noise(sec, seed=i), SR)
    stereo = np.stack([_noise(7.0, seed=9, sr=44100), _noise(7.0, seed=10, sr=44100)], 1)
    sf.write(folder / "l2.wav", stereo, 44100, subtype="PCM_16")
    durations["l2"] = 7.0
    write_wav(folder / "extra.wav", _noise(0.5), SR)  # not listed: ignored, counted
    refs = {"s1": "the cat", "s2": "the hat sat", "l1": "a dog ran", "l2": "a dig"}
    tsv = tmp_path / "t.tsv"
    tsv.write_text("".join(f"{n}.wav\t{t.upper()}!\n" for n, t in refs.items()))

    frames_for_6s = 1 + (6 * SR - 400) // 160
    model = _rigged(frames_for_6s)
    spec = {"model": MODEL_KW, "features": FEATURES}
    result = evaluate_folder(model, spec, folder, tsv)

    hyps = {n: (LONG if durations[n] >= 6 else SHORT) for n in refs}
    assert [it["name"] for it in result["items"]] == list(refs)
    assert {it["name"]: it["hyp"] for it in result["items"]} == hyps
    assert {it["name"]: it["ref"] for it in result["items"]} == refs
    for it in result["items"]:  # the 44.1 kHz stereo file keeps its length within one window
        assert abs(it["duration"] - durations[it["name"]]) < 0.025
    assert result["utterances"] == 4 and result["unlisted"] == 1
    assert result["seconds"] == pytest.approx(sum(durations.values()), abs=0.05)
    names = list(refs)
    assert result["wer"] == pytest.approx(wer([refs[n] for n in names], [hyps[n] for n in names]))
    assert result["cer"] == pytest.approx(cer([refs[n] for n in names], [hyps[n] for n in names]))
    assert 0 < result["wer"] < 1
    assert [b["count"] for b in result["bins"]] == [2, 2, 0, 0, 0, 0]
    assert [(b["low"], b["high"]) for b in result["bins"]] == [
        tuple(map(float, b)) for b in DURATION_BINS
    ]
    short, long = ["s1", "s2"], ["l1", "l2"]
    assert result["bins"][0]["wer"] == pytest.approx(wer([refs[n] for n in short], [SHORT] * 2))
    assert result["bins"][1]["wer"] == pytest.approx(wer([refs[n] for n in long], [LONG] * 2))
    assert math.isnan(result["bins"][2]["wer"])

    tsv.write_text(tsv.read_text() + "gone1\tx\nsub/gone2.wav\ty\n")
    with pytest.raises(FileNotFoundError, match="2 WAV") as e:
        evaluate_folder(model, spec, folder, tsv)
    assert "gone1.wav" in str(e.value) and str(Path("sub") / "gone2.wav") in str(e.value)


# -- command line ------------------------------------------------------------------------------
def test_transcribe_main_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("soundfile")
    from cape.lab.data.speech.audio import write_wav

    run, best_model, _ = _make_run(tmp_path)
    folder = tmp_path / "wavs"
    folder.mkdir()
    waves = {"b": _noise(0.6, seed=1), "a": _noise(0.9, seed=2)}
    for name, w in waves.items():
        write_wav(folder / f"{name}.wav", w, SR)
    solo = tmp_path / "solo.wav"
    write_wav(solo, _noise(0.4, seed=3), SR)

    assert transcribe_main([str(run), str(folder), str(solo), "--beam", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    files = [folder / "a.wav", folder / "b.wav", solo]  # folders give their *.wav sorted
    assert [line.split("\t")[0] for line in lines] == [str(f) for f in files]
    spec = {"model": MODEL_KW, "features": FEATURES}
    expect = transcribe(best_model.eval(), spec, [load_audio(f, SR) for f in files], beam=2)
    assert [line.split("\t", 1)[1] for line in lines] == expect

    tsv = tmp_path / "t.tsv"
    tsv.write_text("a\thello there\nb.wav\tgood day\n")
    out = tmp_path / "res" / "scores.json"
    argv = [str(run), str(folder), "--transcripts", str(tsv), "--out", str(out)]
    assert transcribe_main([*argv, "--checkpoint", "latest"]) == 0
    printed = capsys.readouterr().out
    assert "WER" in printed and "| 0-6 | 2 |" in printed and "| all" in printed
    text = out.read_text()
    assert "NaN" not in text  # empty bins are null: strict JSON
    saved = json.loads(text)
    assert saved["utterances"] == 2 and saved["unlisted"] == 0
    assert saved["settings"]["beam"] == 0 and saved["settings"]["checkpoint"].endswith(
        "step_00000010"
    )
    assert saved["bins"][2]["wer"] is None
    refs = [it["ref"] for it in saved["items"]]
    hyps = [it["hyp"] for it in saved["items"]]
    assert refs == ["hello there", "good day"]
    assert saved["wer"] == pytest.approx(wer(refs, hyps))


def test_transcribe_main_bad_usage(tmp_path: Path) -> None:
    run, _, _ = _make_run(tmp_path)
    folder = tmp_path / "wavs"
    folder.mkdir()
    tsv = tmp_path / "t.tsv"
    tsv.write_text("a\tx\n")
    for argv, what in [
        ([str(run), str(folder), "--out", "x.json"], "--out needs --transcripts"),
        ([str(run), str(folder), str(folder), "--transcripts", str(tsv)], "one folder"),
        ([str(run / "checkpoints" / "best"), str(folder), "--checkpoint", "latest"], "run folder"),
        ([str(run), str(folder), "--beam", "-1"], "--beam"),
        ([str(run), str(folder), "--hop-ms", "0"], "--hop-ms"),
        ([str(run), str(folder)], "holds no .wav"),
    ]:
        with pytest.raises(ValueError, match=what):
            transcribe_main(argv)
    with pytest.raises(FileNotFoundError, match="nope"):
        transcribe_main([str(run), str(tmp_path / "nope.wav")])
