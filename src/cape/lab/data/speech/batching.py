"""Padding-free ASR batches with a per-utterance STFT hop (CAPE sec. 5.2.2, app. C.3, slides).

The paper: "For each audio in the batch short-time Fourier Transform (STFT) hop distance H is set
in a way that output number of frames is the same (except rounding) as for hypothetical audio
which has duration equal to the mean over batch and is processed with H = 10ms. Because the hop
distance is an integer number, number of frames after STFT is matched only approximately within a
batch, so we reduce the number of frames in each sample to match the shortest sample in the batch
by randomly and uniformly skipping frames." Batches come from an epoch-wise shuffle: "i) compute
perturbed sample duration by multiplying original sample duration by a random number from
U(0.85, 1.15); ii) sort samples by their perturbed duration; iii) batches are formed by grouping
sequential samples." "CAPE embeddings remain tied to the original timestamp of the audio."

Pieces:

- `DurationBatchSampler`: that epoch-wise shuffle (plus a shuffled batch order), by a number of
  utterances or a budget of seconds, split over DDP ranks.
- `padding_free_hops`: the integer hop of every utterance (see its docstring for the rule).
- `padding_free_features`: per-utterance log-mel with its own hop, then random uniform frame
  skipping down to the shortest; returns the kept frames' original times for CAPE.
- `padded_features`: the classical baseline, a fixed 10 ms hop and zero padding.

Frame times follow `cape.positions.timestamps`: frame f of a sample with hop h seconds is
placed at `(f + offset) * h` (offset 0.5, the middle of the frame's hop interval). The centre of
its STFT window is `f * h + win / 2` seconds: a constant shift of `win / 2 - offset * h`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch

from cape._checks import check_float, check_int, check_tensor
from cape.lab.data.speech.features import _samples, hop_samples, log_mel

__all__ = [
    "DurationBatchSampler",
    "SpeechBatch",
    "padding_free_hops",
    "padding_free_features",
    "padded_features",
    "skip_frames",
]


# --------------------------------------------------------------------------------------------
# batch sampler
# --------------------------------------------------------------------------------------------
class DurationBatchSampler:
    """Epoch-wise batches of similar duration (CAPE app. C.3): a `batch_sampler` for DataLoader.

    durations: [N] seconds (> 0). Exactly one of batch_size (utterances per batch) or
    batch_seconds (a batch takes consecutive utterances while their summed duration stays
    <= batch_seconds; an utterance longer than that is a batch alone). Each epoch, with a
    generator seeded by (seed, epoch):

    1. perturbed = durations * U(perturb[0], perturb[1]) (perturb=None: no noise);
    2. indices sorted by perturbed duration (stable), cut into consecutive batches;
    3. batch order shuffled (shuffle=True), else kept in ascending duration;
    4. DDP: while the batch count is not a multiple of world_size, the largest batch (most
       utterances; ties: the first) is split in two halves; rank r gets batches r, r + W, ...

    So every index appears exactly once per epoch over all ranks, every rank has the same
    number of batches, and all ranks agree (same seed) without communication. Call
    `set_epoch(epoch)` before each epoch. Iteration yields lists of int indices.
    """

    def __init__(
        self,
        durations: Sequence[float] | np.ndarray | torch.Tensor,
        batch_size: int | None = None,
        *,
        batch_seconds: float | None = None,
        perturb: tuple[float, float] | None = (0.85, 1.15),
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if isinstance(durations, torch.Tensor):
            durations = durations.detach().cpu().numpy()
        d = np.asarray(durations, dtype=np.float64)
        if d.ndim != 1 or d.size == 0:
            raise ValueError(f"durations must be a non-empty 1-D sequence, got shape {d.shape}")
        if not np.all(np.isfinite(d)) or np.any(d <= 0):
            raise ValueError("durations must be finite and > 0 seconds")
        if (batch_size is None) == (batch_seconds is None):
            raise ValueError("give exactly one of batch_size and batch_seconds")
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size)
        self.batch_seconds = (
            None
            if batch_seconds is None
            else check_float("batch_seconds", batch_seconds, strict=True)
        )
        if perturb is not None:
            if not isinstance(perturb, (tuple, list)) or len(perturb) != 2:
                raise TypeError(f"perturb must be a (low, high) pair or None, got {perturb!r}")
            lo = check_float("perturb[0]", perturb[0], strict=True)
            hi = check_float("perturb[1]", perturb[1], strict=True)
            if lo > hi:
                raise ValueError(f"perturb must have low <= high, got {tuple(perturb)}")
            perturb = (lo, hi)
        self.perturb = perturb
        self.seed = check_int("seed", seed, minimum=0)
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {type(shuffle).__name__}")
        self.shuffle = shuffle
        self.world_size = check_int("world_size", world_size)
        self.rank = check_int("rank", rank, minimum=0)
        if rank >= world_size:
            raise ValueError(f"rank must be < world_size = {world_size}, got {rank}")
        if d.size < world_size:
            raise ValueError(f"need at least world_size = {world_size} utterances, got {d.size}")
        self.durations = d
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose batches the next iteration gives (as DistributedSampler)."""
        self.epoch = check_int("epoch", epoch, minimum=0)

    def _cut(self, order: np.ndarray) -> list[list[int]]:
        if self.batch_size is not None:
            return [
                order[i : i + self.batch_size].tolist()
                for i in range(0, order.size, self.batch_size)
            ]
        batches: list[list[int]] = []
        current: list[int] = []
        total = 0.0
        for i in order.tolist():
            d = float(self.durations[i])
            if current and total + d > self.batch_seconds:
                batches.append(current)
                current, total = [], 0.0
            current.append(i)
            total += d
        if current:
            batches.append(current)
        return batches

    def all_batches(self, epoch: int | None = None) -> list[list[int]]:
        """Every rank's batches of an epoch (default: the current one), in iteration order."""
        epoch = self.epoch if epoch is None else check_int("epoch", epoch, minimum=0)
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        rng = np.random.default_rng([self.seed, epoch])
        keys = self.durations
        if self.perturb is not None:
            keys = keys * rng.uniform(self.perturb[0], self.perturb[1], size=keys.size)
        batches = self._cut(np.argsort(keys, kind="stable"))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        while len(batches) % self.world_size:
            j = max(range(len(batches)), key=lambda k: (len(batches[k]), -k))
            big = batches[j]  # len >= 2 here: N >= world_size
            batches[j : j + 1] = [big[: len(big) // 2], big[len(big) // 2 :]]
        self._cache = (epoch, batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.all_batches()[self.rank :: self.world_size]

    def __len__(self) -> int:
        return len(self.all_batches()) // self.world_size


# --------------------------------------------------------------------------------------------
# hops and features
# --------------------------------------------------------------------------------------------
def padding_free_hops(
    durations_s: torch.Tensor | Sequence[float],
    *,
    base_hop_ms: float = 10.0,
    sample_rate: int = 16000,
    win_ms: float = 25.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-utterance STFT hops for a padding-free batch: durations [B] s -> (hops [B] int64
    samples, hops [B] float32 seconds).

    With S_b = round(duration_b * sample_rate) samples, win and base hop in samples as
    `log_mel` rounds them, the target is the frame count of an audio of the batch's mean
    duration at the base hop: target = 1 + (round(mean S) - win) // base. The hop of b is an
    integer h giving 1 + (S_b - win) // h == target when one exists, the one closest to the
    ideal base * S_b / mean S among those; else the integer whose count is closest to target
    (hops are integers, so long utterances can miss it by up to about target / (2 h) frames).
    Vectorised tensor code on durations' device (no host syncs for a tensor input).
    """
    if not isinstance(durations_s, torch.Tensor):
        durations_s = torch.as_tensor(durations_s, dtype=torch.float64)
    check_tensor("durations_s", durations_s, ndims=(1,), floating=True)
    if durations_s.shape[0] == 0:
        raise ValueError("durations_s must hold at least one duration")
    check_int("sample_rate", sample_rate)
    base = hop_samples(base_hop_ms, sample_rate)
    win = _samples("win_ms", win_ms, sample_rate)
    samples = torch.round(durations_s.to(torch.float64) * sample_rate)  # [B]
    if durations_s.device.type == "cpu" and bool((samples < win).any()):
        raise ValueError(f"durations_s must be >= win_ms = {win_ms} ms, got {durations_s.tolist()}")
    mean = samples.mean()
    target = 1.0 + torch.floor((torch.round(mean) - win) / base)  # frames at the mean, [] float
    span = samples - win  # x_b: frames = 1 + floor(x / h)
    ideal = base * samples / mean
    # floor(x / h) == target - 1  <=>  x / target < h <= x / (target - 1)
    lo = torch.floor(span / target) + 1.0
    hi = torch.where(
        target > 1.0, torch.floor(span / (target - 1.0).clamp_min(1.0)), span + ideal + 1.0
    )
    exact = torch.clamp(torch.round(ideal), min=lo, max=hi)
    # no integer in [lo, hi]: hi gives more than target frames, lo fewer; take the closer
    over = 1.0 + torch.floor(span / hi.clamp_min(1.0)) - target
    under = target - 1.0 - torch.floor(span / lo)
    near = torch.where((over < under) & (hi >= 1.0), hi, lo)
    hop = torch.where(lo <= hi, exact, near).clamp_min(1.0).to(torch.int64)
    return hop, (hop.to(torch.float64) / sample_rate).to(torch.float32)


class SpeechBatch(NamedTuple):
    """Features of a speech batch; B utterances, T frames, n_mels bands.

    features [B, T, n_mels] float32 (zero past lengths); lengths [B] int64 frames;
    hop_seconds [B] float32: each sample's STFT hop (`CTCModel(..., hop=hop_seconds)`);
    frame_times [B, T] float32: each kept frame's original time in seconds, (f + offset) * hop
    for its original index f (0 past lengths); hops [B] int64: the hop in samples;
    n_frames [B] int64: frames before skipping (== lengths when nothing was skipped).
    The kept frames of b span its whole audio, so their mean spacing is about
    hop_seconds * n_frames / lengths; frame_times give the exact original times.
    """

    features: torch.Tensor
    lengths: torch.Tensor
    hop_seconds: torch.Tensor
    frame_times: torch.Tensor
    hops: torch.Tensor
    n_frames: torch.Tensor


def _wave_list(
    waves: Sequence[torch.Tensor] | torch.Tensor, wave_lengths: torch.Tensor | None
) -> list[torch.Tensor]:
    """A list of [S_b] waves, or [B, S] padded + wave_lengths [B] -> list of 1-D float tensors."""
    if isinstance(waves, torch.Tensor):
        check_tensor("waves", waves, ndims=(2,), floating=True)
        if wave_lengths is None:
            return list(waves.unbind(0))
        check_tensor("wave_lengths", wave_lengths, ndims=(1,))
        if wave_lengths.shape[0] != waves.shape[0]:
            raise ValueError(
                f"wave_lengths must have shape [{waves.shape[0]}], got {tuple(wave_lengths.shape)}"
            )
        sizes = wave_lengths.tolist()  # one host copy: shapes are needed on the host
        if any(not 0 < s <= waves.shape[1] for s in sizes):
            raise ValueError(f"wave_lengths must lie in [1, {waves.shape[1]}], got {sizes}")
        return [waves[b, : int(s)] for b, s in enumerate(sizes)]
    if wave_lengths is not None:
        raise ValueError("wave_lengths is only for a padded [B, S] waves tensor")
    if not isinstance(waves, (list, tuple)) or not waves:
        raise TypeError("waves must be a non-empty list of 1-D tensors or a [B, S] tensor")
    for b, w in enumerate(waves):
        check_tensor(f"waves[{b}]", w, ndims=(1,), floating=True)
    return list(waves)


def _frame_times(index: torch.Tensor, hop_s: torch.Tensor, offset: float) -> torch.Tensor:
    """Original frame indices [B, T] and hops [B] seconds -> (index + offset) * hop [B, T]."""
    return ((index.to(torch.float64) + offset) * hop_s.to(torch.float64)[:, None]).to(torch.float32)


def skip_frames(n: int, keep: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Indices of `keep` of n frames [keep] int64, increasing: a uniformly random subset (every
    subset of that size equally likely; all n frames when keep == n, drawing nothing)."""
    check_int("n", n, minimum=0)
    check_int("keep", keep, minimum=0)
    if keep > n:
        raise ValueError(f"keep must be <= n = {n}, got {keep}")
    if keep == n:
        return torch.arange(n)
    return torch.randperm(n, generator=generator)[:keep].sort().values


def padding_free_features(
    waves: Sequence[torch.Tensor] | torch.Tensor,
    hops: torch.Tensor | Sequence[int] | None = None,
    *,
    wave_lengths: torch.Tensor | None = None,
    sample_rate: int = 16000,
    base_hop_ms: float = 10.0,
    win_ms: float = 25.0,
    n_mels: int = 80,
    normalize: bool = True,
    offset: float = 0.5,
    generator: torch.Generator | None = None,
) -> SpeechBatch:
    """Padding-free log-mel batch (CAPE app. C.3): every sample has its own hop, no padding.

    waves: B 1-D tensors, or a padded [B, S] tensor with wave_lengths [B] samples. hops: [B]
    integer hops in samples (default: `padding_free_hops` of the waves' durations). Sample b
    gets `log_mel(wave_b, hop_ms=1000 * hops[b] / sample_rate, ...)` (n_b frames, normalised
    per sequence over all its frames); then T = min n_b frames are kept per sample: a uniformly
    random subset of its frames, kept in time order (generator: the random source, CPU). Its
    `frame_times` are the kept frames' original times (`offset`: see the module docstring),
    so CAPE can follow the original timestamps. Returns a `SpeechBatch` with lengths == T.
    """
    items = _wave_list(waves, wave_lengths)
    batch = len(items)
    check_int("sample_rate", sample_rate)
    check_float("offset", offset)
    if hops is None:
        sizes = torch.tensor([w.shape[0] for w in items], dtype=torch.float64)
        hops = padding_free_hops(
            sizes / sample_rate, base_hop_ms=base_hop_ms, sample_rate=sample_rate, win_ms=win_ms
        )[0]
    hops_t = torch.as_tensor(hops).cpu()
    if hops_t.dim() != 1 or hops_t.shape[0] != batch or hops_t.is_floating_point():
        raise ValueError(f"hops must be [B] = [{batch}] integers (samples), got {hops!r}")
    hop_list = [int(h) for h in hops_t.tolist()]
    if min(hop_list) < 1:
        raise ValueError(f"hops must be >= 1 sample, got {hop_list}")

    feats = [
        log_mel(
            w,
            sample_rate,
            hop_ms=1000.0 * h / sample_rate,
            win_ms=win_ms,
            n_mels=n_mels,
            normalize=normalize,
        )
        for w, h in zip(items, hop_list, strict=True)
    ]  # [n_b, n_mels] each; hop_samples(1000 h / sr) == h for integer h
    counts = [f.shape[0] for f in feats]
    frames = min(counts)
    device = feats[0].device
    kept_feats, kept_index = [], []
    for f, n in zip(feats, counts, strict=True):
        idx = skip_frames(n, frames, generator=generator)
        kept_index.append(idx)
        kept_feats.append(f[idx.to(device)])
    index = torch.stack(kept_index)  # [B, T]
    hop_s = (hops_t.to(torch.float64) / sample_rate).to(torch.float32)
    return SpeechBatch(
        features=torch.stack(kept_feats),
        lengths=torch.full((batch,), frames, dtype=torch.int64),
        hop_seconds=hop_s,
        frame_times=_frame_times(index, hop_s, offset),
        hops=hops_t.to(torch.int64),
        n_frames=torch.tensor(counts, dtype=torch.int64),
    )


def padded_features(
    waves: Sequence[torch.Tensor] | torch.Tensor,
    *,
    wave_lengths: torch.Tensor | None = None,
    sample_rate: int = 16000,
    hop_ms: float = 10.0,
    win_ms: float = 25.0,
    n_mels: int = 80,
    normalize: bool = True,
    offset: float = 0.5,
) -> SpeechBatch:
    """The classical padded batch: one hop (10 ms) for all, zero padding up to the longest.

    Sample b gets `log_mel(wave_b, hop_ms=hop_ms, ...)` (normalised over its own frames only),
    n_b frames; features [B, max n_b, n_mels] are 0 past lengths = n_b; frame_times 0 there.
    """
    items = _wave_list(waves, wave_lengths)
    batch = len(items)
    check_float("offset", offset)
    hop = hop_samples(hop_ms, sample_rate)
    feats = [
        log_mel(w, sample_rate, hop_ms=hop_ms, win_ms=win_ms, n_mels=n_mels, normalize=normalize)
        for w in items
    ]
    counts = torch.tensor([f.shape[0] for f in feats], dtype=torch.int64)
    frames = int(counts.max())
    out = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)  # 0 past each length
    hop_s = torch.full((batch,), hop / sample_rate, dtype=torch.float32)
    index = torch.arange(frames)[None].expand(batch, frames)
    times = _frame_times(index, hop_s, offset)
    times = torch.where(index < counts[:, None], times, 0.0)
    return SpeechBatch(
        features=out,
        lengths=counts,
        hop_seconds=hop_s,
        frame_times=times,
        hops=torch.full((batch,), hop, dtype=torch.int64),
        n_frames=counts.clone(),
    )
