"""cape.lab.data.speech.features: the mel filterbank and log-mel front end against NumPy
references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cape.lab.data.speech.features import frame_hop_seconds, hop_samples, log_mel, mel_filterbank


def _np_filterbank(
    n_mels: int, n_fft: int, sr: int, f_min: float = 0.0, f_max: float | None = None
):
    """A loop over filters and bins with the triangle formula (independent of the module)."""
    f_max = sr / 2 if f_max is None else f_max
    to_mel = lambda f: 2595.0 * math.log10(1.0 + f / 700.0)  # noqa: E731
    to_hz = lambda m: 700.0 * (10.0 ** (m / 2595.0) - 1.0)  # noqa: E731
    lo, hi = to_mel(f_min), to_mel(f_max)
    pts = [to_hz(lo + (hi - lo) * i / (n_mels + 1)) for i in range(n_mels + 2)]
    out = np.zeros((n_fft // 2 + 1, n_mels))
    for m in range(n_mels):
        left, centre, right = pts[m], pts[m + 1], pts[m + 2]
        for k in range(n_fft // 2 + 1):
            f = k * sr / n_fft
            if left < f <= centre:
                out[k, m] = (f - left) / (centre - left)
            elif centre < f < right:
                out[k, m] = (right - f) / (right - centre)
    return out, pts


def _np_log_mel(wave: np.ndarray, sr: int, hop_ms: float, win_ms: float, n_mels: int) -> np.ndarray:
    """Explicit framing, periodic Hann, rfft zero-padded to a power of two, power, mel, log."""
    win = int(round(win_ms * sr / 1000))
    hop = int(round(hop_ms * sr / 1000))
    n_fft = 1
    while n_fft < win:
        n_fft *= 2
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / win)
    fb, _ = _np_filterbank(n_mels, n_fft, sr)
    frames = []
    for start in range(0, len(wave) - win + 1, hop):
        spec = np.fft.rfft(wave[start : start + win] * hann, n=n_fft)
        frames.append(np.log(np.abs(spec) ** 2 @ fb + 1e-6))
    return np.stack(frames)


# -- filterbank ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_mels", "n_fft", "sr"), [(80, 512, 16000), (40, 256, 8000), (10, 1024, 22050)]
)
def test_filterbank_matches_loop(n_mels: int, n_fft: int, sr: int) -> None:
    fb = mel_filterbank(n_mels, n_fft, sr)
    assert fb.shape == (n_fft // 2 + 1, n_mels) and fb.dtype == torch.float32
    ref, _ = _np_filterbank(n_mels, n_fft, sr)
    np.testing.assert_allclose(fb.numpy(), ref, atol=1e-5)
    assert (fb >= 0).all()
    assert (fb.sum(0) > 0).all()  # every filter sees at least one bin at these sizes


def test_filterbank_band_limits() -> None:
    fb = mel_filterbank(20, 512, 16000, f_min=300.0, f_max=4000.0)
    ref, _ = _np_filterbank(20, 512, 16000, 300.0, 4000.0)
    np.testing.assert_allclose(fb.numpy(), ref, atol=1e-5)
    freqs = torch.arange(257) * 16000 / 512
    assert (fb[(freqs <= 300) | (freqs >= 4000)] == 0).all()


def test_filterbank_peak_is_one_at_centres() -> None:
    # sr = n_fft: bins at every integer Hz; centres at integer Hz only by luck, so compare the
    # filter value at the bin nearest each centre to the triangle's value there
    n_fft = sr = 8000
    fb = mel_filterbank(12, n_fft, sr)
    _, pts = _np_filterbank(12, n_fft, sr)
    for m in range(12):
        k = round(pts[m + 1])
        assert fb[k, m] == pytest.approx(1.0, abs=(1.0 / (pts[m + 1] - pts[m])) + 1e-6)
        assert fb[:, m].max() <= 1.0 + 1e-6


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(f_max=8001.0), "f_max"),
        (dict(f_min=9000.0), "f_min"),
    ],
)
def test_filterbank_rejects_bad_band(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        mel_filterbank(80, 512, 16000, **kwargs)


def test_filterbank_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="n_mels"):
        mel_filterbank(0, 512, 16000)
    with pytest.raises(ValueError, match="n_fft"):
        mel_filterbank(10, 1, 16000)


# -- hop -------------------------------------------------------------------------------------


def test_hop_rounding() -> None:
    assert hop_samples(10.0, 16000) == 160
    assert hop_samples(12.5, 16000) == 200
    assert hop_samples(10.0, 22050) == 221  # 220.5 rounds half up
    assert frame_hop_seconds(10.0, 22050) == pytest.approx(221 / 22050)
    assert frame_hop_seconds(10.0, 16000) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="hop_ms"):
        hop_samples(0.01, 16000)  # 0.16 samples
    with pytest.raises(ValueError, match="hop_ms"):
        hop_samples(0.0, 16000)


# -- log_mel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("hop_ms", [10.0, 12.5])
def test_log_mel_matches_numpy(hop_ms: float) -> None:
    rng = np.random.default_rng(0)
    wave = rng.standard_normal(4000).astype(np.float32) * 0.1
    got = log_mel(torch.from_numpy(wave), 16000, hop_ms=hop_ms, normalize=False)
    ref = _np_log_mel(wave.astype(np.float64), 16000, hop_ms, 25.0, 80)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-3, rtol=1e-4)


def test_log_mel_normalized_per_sequence() -> None:
    torch.manual_seed(0)
    waves = torch.randn(3, 8000) * torch.tensor([[0.01], [1.0], [30.0]])
    feats = log_mel(waves, 16000)
    assert feats.shape == (3, 1 + (8000 - 400) // 160, 80)
    flat = feats.flatten(1).double()
    torch.testing.assert_close(flat.mean(1), torch.zeros(3, dtype=torch.float64), atol=1e-5, rtol=0)
    torch.testing.assert_close(
        flat.std(1, correction=0), torch.ones(3, dtype=torch.float64), atol=1e-4, rtol=0
    )
    # normalising is the affine map of the raw features, per sequence
    raw = log_mel(waves, 16000, normalize=False)
    for b in range(3):
        z = (raw[b] - raw[b].mean()) / raw[b].std(correction=0)
        torch.testing.assert_close(feats[b], z, atol=1e-4, rtol=0)


@pytest.mark.parametrize(("hop_ms", "hop"), [(5.0, 80), (10.0, 160), (12.5, 200)])
@pytest.mark.parametrize("length", [400, 401, 5000, 16000])
def test_frame_count(hop_ms: float, hop: int, length: int) -> None:
    feats = log_mel(torch.randn(length), 16000, hop_ms=hop_ms)
    assert feats.shape == (1 + (length - 400) // hop, 80)


def test_sine_energy_in_nearest_mel_bin() -> None:
    sr, n_mels = 16000, 80
    t = torch.arange(sr, dtype=torch.float64) / sr
    wave = torch.sin(2 * math.pi * 1000.0 * t)
    feats = log_mel(wave, sr, n_mels=n_mels, normalize=False)
    _, pts = _np_filterbank(n_mels, 512, sr)
    nearest = int(np.argmin(np.abs(np.array(pts[1:-1]) - 1000.0)))
    assert int(feats.mean(0).argmax()) == nearest
    # far from 1 kHz there is (almost) nothing: leakage of a Hann window falls off fast
    assert feats.mean(0)[nearest] - feats.mean(0)[nearest + 15] > 8.0


def test_batch_equals_single_calls() -> None:
    torch.manual_seed(1)
    waves = torch.randn(2, 3000)
    for normalize in (False, True):
        both = log_mel(waves, 16000, hop_ms=7.0, normalize=normalize)
        for b in range(2):
            torch.testing.assert_close(
                both[b], log_mel(waves[b], 16000, hop_ms=7.0, normalize=normalize)
            )


def test_dtypes_and_cache() -> None:
    wave = torch.randn(2000, dtype=torch.float64)
    a = log_mel(wave, 16000)
    b = log_mel(wave.to(torch.bfloat16).to(torch.float64), 16000)  # any float dtype accepted
    assert a.dtype == b.dtype == torch.float32
    assert log_mel(wave.half(), 16000).dtype == torch.float32
    from cape.lab.data.speech import features

    keys = len(features._CACHE)
    log_mel(wave, 16000)
    assert len(features._CACHE) == keys  # no rebuild for the same settings


@pytest.mark.parametrize(
    ("args", "kwargs", "name", "error"),
    [
        ((torch.randn(1000),), dict(hop_ms=0.0), "hop_ms", ValueError),
        ((torch.randn(1000),), dict(hop_ms=-5.0), "hop_ms", ValueError),
        ((torch.randn(1000),), dict(n_mels=0), "n_mels", ValueError),
        ((torch.randn(1000),), dict(win_ms=0.0), "win_ms", ValueError),
        ((torch.randn(1, 2, 1000),), {}, "wave", ValueError),
        ((torch.randn(399),), {}, "wave", ValueError),
        ((torch.ones(1000, dtype=torch.long),), {}, "wave", TypeError),
        ((torch.randn(1000), 0), {}, "sample_rate", ValueError),
        ((torch.randn(1000),), dict(normalize=1), "normalize", TypeError),
    ],
)
def test_log_mel_rejects(args: tuple, kwargs: dict, name: str, error: type) -> None:
    with pytest.raises(error, match=name):
        log_mel(*args, **kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_log_mel_cuda_matches_cpu() -> None:
    wave = torch.randn(2, 4000)
    torch.testing.assert_close(
        log_mel(wave.cuda(), 16000).cpu(), log_mel(wave, 16000), atol=1e-4, rtol=1e-4
    )
