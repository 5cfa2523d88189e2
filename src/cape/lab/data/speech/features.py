"""Log-mel spectrograms for CAPE's ASR models, with a variable STFT hop (CAPE sec. 5.2, app. C).

The paper: "80 log-mel spectrogram features for a 25ms sliding window, strided by 10ms (unless we
explicitly vary STFT hop distance). All features are normalized to have zero mean and unit
variance per input sequence."

Conventions chosen here:

- window: a *periodic* Hann window of `win` samples (`torch.hann_window`'s default, the usual
  STFT convention), `win = round(win_ms * sample_rate / 1000)`.
- each frame is `win` samples long and zero-padded *at the end* to `n_fft` (the next power of
  two >= win), as Kaldi-style front ends do; no centring (`center=False`), so a wave of T samples
  gives `F = 1 + (T - win) // hop` frames and frame f starts at sample `f * hop`.
- the hop is a whole number of samples: `hop_samples` rounds `hop_ms`, and `frame_hop_seconds`
  gives the hop that was really used (what CAPE's timestamps must be built from).
- mel scale: HTK, `mel = 2595 log10(1 + f / 700)`; triangular filters of peak 1 (no area
  normalisation); log(mel energy + 1e-6).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from cape._checks import check_float, check_int, check_tensor

__all__ = ["mel_filterbank", "hop_samples", "frame_hop_seconds", "log_mel"]

_LOG_EPS = 1e-6  # added to the mel energies before the log (silence stays finite)
_STD_EPS = 1e-5  # added to the per-sequence std before dividing

# (n_mels, n_fft, win, sample_rate, device) -> (window [n_fft], filterbank [n_fft//2+1, n_mels]).
# Bounded: a few (hop-independent) front-end settings per process is the normal case.
_CACHE: dict[tuple[int, int, int, int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
_CACHE_SIZE = 16


def _hz_to_mel(f: np.ndarray | float) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (np.asarray(m, dtype=np.float64) / 2595.0) - 1.0)


def mel_filterbank(
    n_mels: int,
    n_fft: int,
    sample_rate: int,
    f_min: float = 0.0,
    f_max: float | None = None,
) -> torch.Tensor:
    """Triangular HTK-mel filters -> [n_fft // 2 + 1, n_mels] float32 (power @ filters = mel).

    n_mels + 2 points equally spaced on the mel scale (`2595 log10(1 + f/700)`) between f_min and
    f_max (default sample_rate / 2); filter m rises linearly from point m to 1 at point m + 1 and
    falls to 0 at point m + 2, evaluated at the FFT bin frequencies k * sample_rate / n_fft.
    Peak 1, no area (Slaney) normalisation. A filter narrower than the bin spacing may be all 0.
    """
    check_int("n_mels", n_mels)
    check_int("n_fft", n_fft, minimum=2)
    check_int("sample_rate", sample_rate)
    nyquist = sample_rate / 2.0
    f_min = check_float("f_min", f_min)
    f_max = nyquist if f_max is None else check_float("f_max", f_max, strict=True)
    if f_max > nyquist:
        raise ValueError(f"f_max must be <= sample_rate / 2 = {nyquist}, got {f_max}")
    if f_min >= f_max:
        raise ValueError(f"f_min must be < f_max ({f_max}), got {f_min}")
    points = _mel_to_hz(np.linspace(_hz_to_mel(f_min), _hz_to_mel(f_max), n_mels + 2))
    freqs = np.arange(n_fft // 2 + 1, dtype=np.float64) * sample_rate / n_fft  # [K]
    left, centre, right = points[:-2], points[1:-1], points[2:]  # [n_mels] each
    rising = (freqs[:, None] - left) / (centre - left)  # [K, n_mels]
    falling = (right - freqs[:, None]) / (right - centre)
    filters = np.clip(np.minimum(rising, falling), 0.0, None)
    return torch.from_numpy(filters).to(torch.float32)


def _samples(name: str, ms: float, sample_rate: int) -> int:
    ms = check_float(name, ms, strict=True)
    check_int("sample_rate", sample_rate)
    n = math.floor(ms * sample_rate / 1000.0 + 0.5)  # round half up: predictable at .5
    if n < 1:
        raise ValueError(
            f"{name} must be at least half a sample ({500.0 / sample_rate} ms at "
            f"{sample_rate} Hz), got {ms}"
        )
    return n


def hop_samples(hop_ms: float, sample_rate: int) -> int:
    """The STFT hop in samples: hop_ms * sample_rate / 1000 rounded (half up), >= 1.

    Raises ValueError when hop_ms <= 0 or rounds to 0 samples.
    """
    return _samples("hop_ms", hop_ms, sample_rate)


def frame_hop_seconds(hop_ms: float, sample_rate: int) -> float:
    """The hop actually used, in seconds: hop_samples(hop_ms, sample_rate) / sample_rate.

    This (not hop_ms / 1000) is the spacing of the frames' timestamps for CAPE.
    """
    return hop_samples(hop_ms, sample_rate) / sample_rate


def _front_end(
    n_mels: int, n_fft: int, win: int, sample_rate: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached window (Hann of `win` samples, zero-padded at the end to n_fft) and filters."""
    key = (n_mels, n_fft, win, sample_rate, device)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    window = torch.zeros(n_fft, dtype=torch.float32)
    window[:win] = torch.hann_window(win, periodic=True, dtype=torch.float32)
    filters = mel_filterbank(n_mels, n_fft, sample_rate)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))  # oldest first
    _CACHE[key] = (window.to(device), filters.to(device))
    return _CACHE[key]


def log_mel(
    wave: torch.Tensor,
    sample_rate: int = 16000,
    *,
    hop_ms: float = 10.0,
    win_ms: float = 25.0,
    n_mels: int = 80,
    normalize: bool = True,
) -> torch.Tensor:
    """wave: [T] or [B, T] float -> log-mel features [F, n_mels] or [B, F, n_mels] float32.

    F = 1 + (T - win) // hop with win = round(win_ms * sample_rate / 1000) and
    hop = `hop_samples(hop_ms, sample_rate)`. normalize: zero mean, unit variance per sequence,
    over all frames and mel bins of that sequence ((x - mean) / (std + 1e-5), population std).
    Computed in float32 whatever wave's dtype; on CUDA without host syncs (shape logic only).
    """
    check_tensor("wave", wave, ndims=(1, 2), floating=True)
    check_int("sample_rate", sample_rate)
    hop = hop_samples(hop_ms, sample_rate)
    win = _samples("win_ms", win_ms, sample_rate)
    if win < 2:
        raise ValueError(f"win_ms must span at least 2 samples, got {win_ms} ms = {win} sample(s)")
    check_int("n_mels", n_mels)
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__} {normalize!r}")
    length = wave.shape[-1]
    if length < win:
        raise ValueError(f"wave must have at least win = {win} samples ({win_ms} ms), got {length}")
    n_fft = 1 << (win - 1).bit_length()  # next power of two >= win
    window, filters = _front_end(n_mels, n_fft, win, sample_rate, wave.device)

    batch = wave.reshape(-1, length).to(torch.float32)  # [B, T]
    # frames of n_fft samples whose window is 0 past `win`: pad the end so that the last full
    # `win` frame still fits, giving F = 1 + (T - win) // hop frames of `win` real samples
    batch = torch.nn.functional.pad(batch, (0, n_fft - win))
    spec = torch.stft(
        batch,
        n_fft,
        hop_length=hop,
        win_length=n_fft,
        window=window,
        center=False,
        return_complex=True,
    )  # [B, n_fft // 2 + 1, F]
    power = spec.real.square() + spec.imag.square()
    feats = torch.log(power.transpose(1, 2) @ filters + _LOG_EPS)  # [B, F, n_mels]
    if normalize:
        std, mean = torch.std_mean(feats, dim=(1, 2), correction=0, keepdim=True)
        feats = (feats - mean) / (std + _STD_EPS)
    return feats[0] if wave.dim() == 1 else feats
