"""Waveform utilities for the speech corpus: a polyphase windowed-sinc resampler, noise at a
given SNR, optional sox effects, and 16-bit WAV reading/writing through `soundfile`.

Waves are 1-D float arrays in [-1, 1] (`[N]`); sample rates are in Hz.
"""

from __future__ import annotations

import math
import shutil
import struct
import subprocess
from functools import lru_cache
from pathlib import Path

import numpy as np

from cape._checks import check_choice, check_float, check_int

__all__ = [
    "NOISE_KINDS",
    "add_noise",
    "add_noise_floor",
    "colored_noise",
    "read_wav",
    "resample",
    "sox_effects",
    "wav_truncation",
    "write_wav",
]

NOISE_KINDS = ("white", "pink")
_ZEROS = 16  # zero crossings of the sinc kernel on each side (at the lower of the two rates)
_ROLLOFF = 0.94  # cutoff as a fraction of the lower Nyquist frequency
_KAISER_BETA = 8.6  # Kaiser window: ~-80 dB side lobes


def _as_wave(name: str, x: object) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D wave [N], got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{name} must be a floating-point array, got {a.dtype}")
    return a


@lru_cache(maxsize=8)
def _polyphase(up: int, down: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Polyphase filter for the rate ratio up/down: taps [2 * half, up] float32, offsets k_r [up]
    and `half`.

    Output sample n = q * up + r sits at input time t = n * down / up = k + p / up, with
    k = q * down + k_r, k_r = (r * down) // up and phase p = (r * down) % up. Its value is
    sum_j x[k - half + 1 + j] * taps[j, r], a Kaiser-windowed sinc low-pass at `_ROLLOFF` times
    the lower Nyquist frequency, each phase normalised to unit DC gain.
    """
    cutoff = 0.5 * min(1.0, up / down) * _ROLLOFF  # cycles per input sample
    half = math.ceil(_ZEROS / (2 * cutoff))  # kernel half-width in input samples
    k_r, p = np.divmod(np.arange(up) * down, up)
    j = np.arange(2 * half)
    d = p[None, :] / up + (half - 1) - j[:, None]  # t - (input sample index), in input samples
    window = np.i0(_KAISER_BETA * np.sqrt(np.clip(1 - (d / half) ** 2, 0, None)))
    taps = np.sinc(2 * cutoff * d) * window
    taps /= taps.sum(axis=0, keepdims=True)
    return taps.astype(np.float32), k_r, half


def resample(x: np.ndarray, orig_sr: int, new_sr: int) -> np.ndarray:
    """Resample a wave [N] from `orig_sr` to `new_sr` Hz -> [ceil(N * new_sr / orig_sr)], float32.

    Polyphase filtering with a Kaiser-windowed sinc (16 zero crossings each side, cutoff 0.94 of
    the lower Nyquist frequency, ~80 dB stop band): frequencies below 0.4 * min(orig_sr, new_sr)
    keep their amplitude and phase (output n is the band-limited input at time n / new_sr), those
    above the lower Nyquist frequency are removed; samples beyond the ends count as zeros.
    Element-wise float32 arithmetic only (no BLAS threads): fast in busy worker processes and
    bit-identical from run to run. The reduced ratio up/down must have up <= 4096.
    """
    x = _as_wave("x", x)
    check_int("orig_sr", orig_sr)
    check_int("new_sr", new_sr)
    g = math.gcd(orig_sr, new_sr)
    up, down = new_sr // g, orig_sr // g
    if up == down:
        return x.astype(np.float32, copy=True)
    if up > 4096:
        raise ValueError(f"new_sr/orig_sr = {up}/{down} in lowest terms needs up <= 4096")
    taps, k_r, half = _polyphase(up, down)
    n_out = -(-len(x) * up // down)
    blocks = -(-n_out // up)
    padded = np.zeros((blocks - 1) * down + down + 2 * half, dtype=np.float32)
    padded[half : half + len(x)] = x
    # x[k - half + 1 + j] is padded[k + 1 + j] = padded[j:][index] with index = k + 1
    index = np.arange(blocks)[:, None] * down + (k_r + 1)[None, :]
    out = np.zeros((blocks, up), dtype=np.float32)
    term = np.empty_like(out)
    for j in range(2 * half):
        np.take(padded[j:], index, out=term, mode="clip")  # every index is in range
        term *= taps[j]
        out += term
    return out.reshape(-1)[:n_out]


def colored_noise(n: int, rng: np.random.Generator, kind: str = "white") -> np.ndarray:
    """Gaussian noise [n] float64 of unit mean power: "white" (flat spectrum) or "pink" (power
    falling as 1/f, shaped in the frequency domain; the DC bin is zero)."""
    check_int("n", n)
    check_choice("kind", kind, NOISE_KINDS)
    if kind == "white":
        noise = rng.standard_normal(n)
    else:  # shape a power-of-two block (fast FFT), keep its first n samples
        m = 1 << max(n - 1, 1).bit_length()
        spec = np.fft.rfft(rng.standard_normal(m))
        f = np.arange(len(spec), dtype=np.float64)
        f[0] = np.inf  # no DC
        noise = np.fft.irfft(spec / np.sqrt(f), m)[:n]
    return noise / max(math.sqrt(float(np.mean(noise**2))), 1e-12)


def add_noise_floor(
    x: np.ndarray, rng: np.random.Generator, *, level_db: float = -80.0
) -> np.ndarray:
    """x + white Gaussian noise of RMS 10**(level_db / 20) (full scale = 1): espeak leaves exact
    digital silence, which no microphone records. Returns float32 [N]."""
    x = _as_wave("x", x)
    if not math.isfinite(level_db) or level_db > 0:
        raise ValueError(f"level_db must be a finite number <= 0 dB, got {level_db}")
    floor = 10 ** (level_db / 20) * rng.standard_normal(len(x))
    return (x + floor).astype(np.float32)


def add_noise(
    x: np.ndarray, snr_db: float, rng: np.random.Generator, *, kind: str = "white"
) -> np.ndarray:
    """x + noise scaled so that 10 log10(sum x^2 / sum noise^2) == snr_db exactly (power over the
    whole clip). `kind` is one of `NOISE_KINDS`. Returns float32 [N]; an all-zero x is returned
    unchanged (its SNR is undefined)."""
    x = _as_wave("x", x)
    if (
        isinstance(snr_db, bool)
        or not isinstance(snr_db, (int, float))
        or not math.isfinite(snr_db)
    ):
        raise ValueError(f"snr_db must be a finite number of dB, got {snr_db!r}")
    check_choice("kind", kind, NOISE_KINDS)
    xd = x.astype(np.float64)
    power = float(np.sum(xd**2))
    if len(x) == 0 or power == 0.0:
        return x.astype(np.float32, copy=True)
    noise = colored_noise(len(x), rng, kind)
    noise *= math.sqrt(power / float(np.sum(noise**2)) / 10 ** (snr_db / 10))
    return (xd + noise).astype(np.float32)


def sox_effects(
    x: np.ndarray, sample_rate: int, *, reverb: float | None = None, tempo: float | None = None
) -> np.ndarray:
    """Run the wave [N] through the `sox` program: `reverb` (reverberance 0-100) and/or `tempo`
    (speed factor, pitch kept, e.g. 0.9 or 1.1). Returns float32 [M]; M ~ N / tempo."""
    x = _as_wave("x", x)
    check_int("sample_rate", sample_rate)
    effects: list[str] = []
    if reverb is not None:
        check_float("reverb", reverb)
        if reverb > 100:
            raise ValueError(f"reverb must be a reverberance in [0, 100], got {reverb}")
        effects += ["reverb", f"{reverb:g}"]
    if tempo is not None:
        check_float("tempo", tempo, minimum=0.1)
        effects += ["tempo", "-s", f"{tempo:g}"]
    if not effects:
        return x.astype(np.float32, copy=True)
    sox = shutil.which("sox")
    if sox is None:
        raise FileNotFoundError("the sox program is not installed (Debian package sox)")
    fmt = ["-t", "f32", "-e", "floating-point", "-r", str(sample_rate), "-c", "1"]
    cmd = [sox, "-q", "-V1", *fmt, "-", *fmt, "-", *effects]
    data = np.ascontiguousarray(x, dtype="<f4").tobytes()
    result = subprocess.run(cmd, input=data, capture_output=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"sox {' '.join(effects)} failed: {result.stderr.decode(errors='replace')}"
        )
    return np.frombuffer(result.stdout, dtype="<f4").astype(np.float32)


def _soundfile():
    try:
        import soundfile
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "reading and writing WAV files needs the soundfile package: pip install soundfile "
            "(cape's 'speech' extra) and the Debian package libsndfile1"
        ) from e
    return soundfile


def write_wav(path: str | Path, x: np.ndarray, sample_rate: int) -> None:
    """Write a wave [N] in [-1, 1] as mono 16-bit PCM WAV (values outside are clipped). Not atomic
    by itself: pass it to `cape.lab.io.atomic_write`."""
    x = _as_wave("x", x)
    check_int("sample_rate", sample_rate)
    _soundfile().write(
        str(path), np.clip(x, -1.0, 1.0), sample_rate, subtype="PCM_16", format="WAV"
    )


def read_wav(path: str | Path, *, mix: bool = False) -> tuple[np.ndarray, int]:
    """Read a mono WAV file -> (wave float32 [N] in [-1, 1], sample rate in Hz). Raises
    FileNotFoundError naming a missing file and ValueError naming an unreadable one, or a
    multi-channel one unless `mix`, which averages the channels (users' stereo recordings)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such WAV file: {path}")
    cut = wav_truncation(path)
    if cut is not None:
        raise ValueError(f"WAV file {path} is truncated: {cut}")
    sf = _soundfile()
    try:
        data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as e:  # soundfile raises LibsndfileError, RuntimeError, ...
        raise ValueError(f"cannot read WAV file {path}: {e}") from e
    if data.shape[1] != 1:
        if not mix:
            raise ValueError(f"{path} must be mono, got {data.shape[1]} channels")
        return data.mean(axis=1, dtype=np.float32), int(sr)
    return np.ascontiguousarray(data[:, 0]), int(sr)


_STREAMED = (0, 0xFFFFFFFF)  # a data size a streaming writer leaves: unknown, not checked


def _chunks(head: bytes) -> dict[bytes, tuple[int, int]]:
    """The RIFF chunks in `head` (a WAV file's first bytes): {id: (offset of data, size)}."""
    chunks, pos = {}, 12
    while pos + 8 <= len(head):
        cid, size = head[pos : pos + 4], struct.unpack("<I", head[pos + 4 : pos + 8])[0]
        chunks.setdefault(cid, (pos + 8, size))
        if cid == b"data":
            break
        pos += 8 + size + (size & 1)
    return chunks


def wav_truncation(path: str | Path) -> str | None:
    """What is missing from a RIFF WAV file cut short (its header's data size against the bytes
    present): "its header says 7.40 s (118400 frames), the file holds 2.47 s"; None for a whole
    file, a file that is not RIFF WAV (soundfile judges it) or a streamed one of unknown size."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    chunks = _chunks(head)
    if b"data" not in chunks or b"fmt " not in chunks:
        return None
    start, declared = chunks[b"data"]
    fmt_at = chunks[b"fmt "][0]
    if declared in _STREAMED or fmt_at + 16 > len(head):
        return None
    rate, _, align = struct.unpack("<IIH", head[fmt_at + 4 : fmt_at + 14])
    present = path.stat().st_size - start
    if present >= declared or align == 0 or rate == 0:
        return None
    frames, held = declared // align, max(present, 0) // align
    return (
        f"its header says {frames / rate:.2f} s ({frames} frames), the file holds "
        f"{held / rate:.2f} s ({held} frames)"
    )
