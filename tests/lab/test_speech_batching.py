"""cape.lab.data.speech.batching: the padding-free pipeline of CAPE app. C.3 and its padded
baseline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cape.lab.data.speech.batching import (
    DurationBatchSampler,
    padded_features,
    padding_free_features,
    padding_free_hops,
    skip_frames,
)
from cape.lab.data.speech.features import log_mel

SR = 16000
WIN = 400  # 25 ms at 16 kHz


def _frames(samples: int, hop: int) -> int:
    return 1 + (samples - WIN) // hop


def _target(durations: list[float]) -> int:
    """Frames of an audio of the mean duration at 10 ms (160 samples)."""
    mean = float(np.mean([round(d * SR) for d in durations]))
    return _frames(round(mean), 160)


# -- hops --------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_hops_give_the_mean_duration_frame_count(seed):
    rng = np.random.default_rng(seed)
    centre = rng.uniform(1.0, 12.0)
    durations = (centre * rng.uniform(0.85, 1.15, size=8)).tolist()  # a sampler-like batch
    hops, seconds = padding_free_hops(torch.tensor(durations))
    target = _target(durations)
    assert hops.dtype == torch.int64
    assert torch.allclose(seconds, hops.float() / SR)
    for d, h in zip(durations, hops.tolist(), strict=True):
        samples = round(d * SR)
        got = abs(_frames(samples, h) - target)
        # brute force over every integer hop: none gets closer to the target count
        every = 1 + (samples - WIN) // np.arange(1, 2 * samples)
        best = int(np.abs(every - target).min())
        assert got == best
        assert got <= max(1, target / (2 * h) + 1)


def test_hops_within_one_frame_for_short_utterances():
    durations = [1.0, 1.1, 1.23, 0.9, 1.05]
    hops, _ = padding_free_hops(durations)
    target = _target(durations)
    for d, h in zip(durations, hops.tolist(), strict=True):
        assert abs(_frames(round(d * SR), h) - target) <= 1


def test_hops_equal_durations_keep_the_base_hop():
    hops, seconds = padding_free_hops(torch.full((4,), 3.7))
    assert hops.tolist() == [160] * 4 and torch.allclose(seconds, torch.full((4,), 0.01))
    hops, _ = padding_free_hops([2.0, 2.0], base_hop_ms=20.0)
    assert hops.tolist() == [320, 320]


def test_hops_edge_cases_and_errors():
    # a very short utterance in a long batch: hop 1 (as many frames as possible)
    hops, _ = padding_free_hops([0.03, 10.0, 10.0])
    assert hops[0].item() == 1
    # the mean gives a single frame: every hop gives 1 frame
    hops, _ = padding_free_hops([0.026, 0.025])
    assert all(
        _frames(round(d * SR), h) == 1 for d, h in zip([0.026, 0.025], hops.tolist(), strict=True)
    )
    with pytest.raises(ValueError, match="durations_s"):
        padding_free_hops([0.01, 1.0])
    with pytest.raises(ValueError, match="durations_s"):
        padding_free_hops(torch.zeros(0))


# -- features ----------------------------------------------------------------------------------
def _waves(durations, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(round(d * SR), generator=g) for d in durations]


def _kept_index(batch, b):
    """Original frame indices from the frame times: t = (f + 0.5) * hop."""
    return torch.round(batch.frame_times[b].double() / batch.hop_seconds[b].double() - 0.5).long()


def test_padding_free_features_shapes_order_and_times():
    durations = [2.0, 2.21, 1.83, 2.4]
    waves = _waves(durations)
    batch = padding_free_features(waves, generator=torch.Generator().manual_seed(0))
    target = _target(durations)
    hops = padding_free_hops(durations)[0]
    assert torch.equal(batch.hops, hops)
    frames = batch.features.shape[1]
    assert batch.features.shape == (4, frames, 80)
    assert torch.equal(batch.lengths, torch.full((4,), frames))
    assert frames == int(batch.n_frames.min())
    assert all(abs(n - target) <= 1 for n in batch.n_frames.tolist())
    for b, (w, h) in enumerate(zip(waves, hops.tolist(), strict=True)):
        full = log_mel(w, SR, hop_ms=1000.0 * h / SR)
        assert full.shape[0] == batch.n_frames[b].item()
        idx = _kept_index(batch, b)
        assert bool((idx[1:] > idx[:-1]).all())  # time order kept, no duplicates
        assert idx.min() >= 0 and idx.max() < full.shape[0]
        assert torch.equal(batch.features[b], full[idx])
        expected = (idx.double() + 0.5) * h / SR
        assert torch.allclose(batch.frame_times[b].double(), expected, atol=1e-6)


def test_frame_times_follow_the_audio():
    """A tone burst at a known time: the loudest kept frame's time is at the burst (independent
    of the frame arithmetic: it goes through the STFT)."""
    durations = [3.0, 3.4, 2.7]
    bursts = [1.2, 2.9, 0.4]
    waves = []
    t = torch.arange(int(0.02 * SR)) / SR
    for d, at in zip(durations, bursts, strict=True):
        w = 1e-3 * torch.randn(round(d * SR), generator=torch.Generator().manual_seed(1))
        start = int(at * SR)
        w[start : start + t.numel()] += torch.sin(2 * np.pi * 1000 * t)
        waves.append(w)
    batch = padding_free_features(
        waves, generator=torch.Generator().manual_seed(0), normalize=False
    )
    assert len(set(batch.hops.tolist())) == 3  # really different hops
    for b, at in enumerate(bursts):
        loudest = batch.features[b].logsumexp(dim=1).argmax()
        centre = at + 0.01  # middle of the 20 ms burst
        assert abs(batch.frame_times[b, loudest].item() - centre) < 0.025


def test_frame_skipping_in_a_batch():
    waves = _waves([0.5, 0.52])
    hops = torch.tensor([160, 150])  # 48 vs 53 frames: 5 dropped from the second
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(5):
        batch = padding_free_features(waves, hops, generator=g)
        assert batch.n_frames.tolist() == [48, 53]
        assert torch.equal(_kept_index(batch, 0), torch.arange(48))  # the shortest is untouched
        seen.add(tuple(_kept_index(batch, 1).tolist()))
    assert len(seen) > 1  # a new random subset each time


def test_skip_frames_is_uniform_and_ordered():
    g = torch.Generator().manual_seed(0)
    dropped = np.zeros(53)
    for _ in range(2000):
        idx = skip_frames(53, 48, generator=g)
        assert idx.numel() == 48 and bool((idx[1:] > idx[:-1]).all())
        mask = np.ones(53, bool)
        mask[idx.numpy()] = False
        dropped += mask
    # Binomial(2000, 5/53) per frame: mean 188.7, sd 13; the first and last frames can go too
    assert dropped.sum() == 10000
    assert dropped.min() > 188.7 - 5 * 13 and dropped.max() < 188.7 + 5 * 13
    assert torch.equal(skip_frames(7, 7), torch.arange(7))
    with pytest.raises(ValueError, match="keep"):
        skip_frames(3, 4)


def test_padded_and_padding_free_agree_for_equal_durations():
    waves = _waves([1.5, 1.5, 1.5], seed=3)
    free = padding_free_features(waves, generator=torch.Generator().manual_seed(0))
    padded = padded_features(waves)
    assert free.hops.tolist() == [160] * 3
    for a, b in zip(free, padded, strict=True):
        assert torch.equal(a, b)
    # independent: the padded features are log_mel of the stacked waves at 10 ms
    assert torch.equal(padded.features, log_mel(torch.stack(waves), SR))
    assert torch.allclose(padded.frame_times[0, :3], torch.tensor([0.005, 0.015, 0.025]))


def test_padded_features_pad_with_zeros():
    durations = [1.0, 0.5, 0.8]
    waves = _waves(durations, seed=4)
    batch = padded_features(waves)
    counts = [_frames(round(d * SR), 160) for d in durations]
    assert batch.lengths.tolist() == counts
    assert batch.features.shape == (3, max(counts), 80)
    for b, n in enumerate(counts):
        assert torch.equal(batch.features[b, :n], log_mel(waves[b], SR))
        assert (batch.features[b, n:] == 0).all() and (batch.frame_times[b, n:] == 0).all()
    # a padded [B, S] tensor with wave lengths gives the same batch
    stacked = torch.nn.utils.rnn.pad_sequence(waves, batch_first=True)
    lengths = torch.tensor([w.numel() for w in waves])
    again = padded_features(stacked, wave_lengths=lengths)
    assert all(torch.equal(a, b) for a, b in zip(batch, again, strict=True))
    free = padding_free_features(
        stacked, wave_lengths=lengths, generator=torch.Generator().manual_seed(0)
    )
    assert free.hops.tolist() == padding_free_hops(durations)[0].tolist()


def test_feature_errors():
    with pytest.raises(TypeError, match="waves"):
        padded_features([])
    with pytest.raises(ValueError, match="hops"):
        padding_free_features(_waves([0.5, 0.5]), torch.tensor([160]))
    with pytest.raises(ValueError, match="wave_lengths"):
        padded_features(torch.zeros(2, 800), wave_lengths=torch.tensor([900, 800]))


def test_ctc_model_accepts_a_padding_free_batch():
    from cape.models.asr import CTCModel

    batch = padding_free_features(_waves([0.6, 0.7]), generator=torch.Generator().manual_seed(0))
    model = CTCModel(29, n_mels=80, dim=16, depth=1, heads=2, ffn_dim=32).eval()
    log_probs, out_lengths = model(batch.features, batch.lengths, hop=batch.hop_seconds)
    assert log_probs.shape[:2] == (2, out_lengths[0].item())


# -- sampler -----------------------------------------------------------------------------------
def _durations(n=203, seed=0):
    return np.random.default_rng(seed).uniform(1.0, 20.0, size=n)


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("mode", [{"batch_size": 8}, {"batch_seconds": 60.0}])
def test_sampler_covers_every_index_once(world_size, mode):
    d = _durations()
    samplers = [
        DurationBatchSampler(d, seed=7, rank=r, world_size=world_size, **mode)
        for r in range(world_size)
    ]
    for epoch in (0, 3):
        seen = []
        counts = set()
        for s in samplers:
            s.set_epoch(epoch)
            batches = list(s)
            counts.add(len(batches))
            assert len(s) == len(batches)
            seen.extend(i for b in batches for i in b)
        assert sorted(seen) == list(range(d.size))
        assert len(counts) == 1  # equal batch counts over ranks
    if "batch_seconds" in mode:
        for b in samplers[0].all_batches():
            assert len(b) == 1 or d[b].sum() <= 60.0


def test_sampler_is_deterministic_and_changes_per_epoch():
    d = _durations()
    a = DurationBatchSampler(d, 8, seed=1)
    b = DurationBatchSampler(d, 8, seed=1)
    assert list(a) == list(b)
    a.set_epoch(1)
    assert list(a) != list(b)
    assert list(DurationBatchSampler(d, 8, seed=2)) != list(b)


def test_sampler_batches_have_similar_durations():
    d = _durations(400, seed=5)
    sampler = DurationBatchSampler(d, 10, seed=0)
    spread = np.mean([d[b].max() / d[b].min() for b in sampler])
    random_spread = np.mean([d[b].max() / d[b].min() for b in np.split(np.arange(400), 40)])
    assert spread < 1.5 < random_spread
    # each batch's durations lie within the perturbation factor's reach of each other
    assert max(d[b].max() / d[b].min() for b in sampler) < (1.15 / 0.85) * 1.3
    # without perturbation or shuffle: exactly sorted
    plain = DurationBatchSampler(d, 10, perturb=None, shuffle=False)
    flat = [i for b in plain for i in b]
    assert flat == np.argsort(d, kind="stable").tolist()


def test_sampler_with_dataloader_and_errors():
    d = _durations(30)
    loader = torch.utils.data.DataLoader(
        list(range(30)), batch_sampler=DurationBatchSampler(d, 4, seed=0)
    )
    assert sorted(int(x) for batch in loader for x in batch) == list(range(30))
    with pytest.raises(ValueError, match="exactly one"):
        DurationBatchSampler(d)
    with pytest.raises(ValueError, match="durations"):
        DurationBatchSampler([1.0, -1.0], 1)
    with pytest.raises(ValueError, match="rank"):
        DurationBatchSampler(d, 4, rank=2, world_size=2)
    with pytest.raises(ValueError, match="perturb"):
        DurationBatchSampler(d, 4, perturb=(1.2, 0.8))
