"""Data of the speech experiment: the corpus in memory, training batches, test utterances.

positions -> augmentation -> encoding happen in the model; this module turns waves into what
it reads: log-mel features with their hops and frame times (`cape.lab.data.speech.batching`) and
letter targets (`cape.lab.data.speech.tokens`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from cape.lab.data.speech.audio import read_wav
from cape.lab.data.speech.batching import (
    DurationBatchSampler,
    padded_features,
    padding_free_features,
)
from cape.lab.data.speech.corpus import load_manifest, make_speech_corpus, verify_corpus
from cape.lab.data.speech.synth import SAMPLE_RATE, SNR_DB
from cape.lab.data.speech.tokens import encode
from cape.lab.experiments.asr.config import AsrConfig, DataConfig, FeatureConfig
from cape.lab.train import distributed as D

__all__ = ["AsrData", "Utterance", "collate_fn"]


class Utterance:
    """One utterance in memory: wave [S] int16 (half the memory of float32), its text, duration
    in seconds, duration bin and name."""

    __slots__ = ("wave", "text", "duration", "bin", "name")

    def __init__(self, wave: np.ndarray, text: str, duration: float, bin: str | None, name: str):
        self.wave, self.text, self.duration, self.bin, self.name = wave, text, duration, bin, name

    def float_wave(self) -> torch.Tensor:
        """[S] float32 in [-1, 1)."""
        return torch.from_numpy(self.wave.astype(np.float32) / 32768.0)


def _load(root: Path, split: str, limit: int = 0) -> list[Utterance]:
    records = load_manifest(root, split)
    if limit:
        records = records[:limit]
    out = []
    for r in records:
        wave, sr = read_wav(root / r["path"])
        if sr != SAMPLE_RATE:
            raise ValueError(f"{root / r['path']}: expected {SAMPLE_RATE} Hz audio, got {sr} Hz")
        pcm = np.clip(np.round(wave * 32768.0), -32768, 32767).astype(np.int16)
        out.append(Utterance(pcm, r["text"], float(r["duration"]), r.get("bin"), r["name"]))
    return out


def ensure_corpus(cfg: DataConfig) -> Path:
    """Make (or finish) the corpus the config names, on rank 0, then verify it everywhere."""
    root = Path(cfg.root)
    if D.get_rank() == 0:
        sizes = {k: getattr(cfg, k) for k in ("train", "val", "test_per_bin", "seed", "workers")}
        snr_db = SNR_DB if cfg.noise else None
        make_speech_corpus(root, snr_db=snr_db, text=cfg.text, progress=True, **sizes)
        verify_corpus(root, progress=False)
    D.barrier()
    return root


def collate_fn(features: FeatureConfig, batching: str):
    """items (Utterance list) -> dict of tensors for the loss: features [B, T, n_mels], lengths
    [B], hop [B] seconds, frame_times [B, T] seconds, targets [sum N_b] and target_lengths [B].

    "padded": one hop for all (features.hop_ms), zero padding; "padding-free": per-sample hops
    and uniform random frame skipping (draws from the global torch RNG, which the engine
    checkpoints when the loader runs in the main process)."""

    def collate(items: list[Utterance]) -> dict[str, torch.Tensor]:
        waves = [u.float_wave() for u in items]
        common = dict(win_ms=features.win_ms, n_mels=features.n_mels)
        if batching == "padded":
            b = padded_features(waves, hop_ms=features.hop_ms, **common)
        else:
            b = padding_free_features(waves, base_hop_ms=features.hop_ms, **common)
        targets = [encode(u.text) for u in items]
        return {
            "features": b.features,
            "lengths": b.lengths,
            "hop": b.hop_seconds,
            "frame_times": b.frame_times,
            "targets": torch.cat(targets),
            "target_lengths": torch.tensor([len(t) for t in targets], dtype=torch.int64),
        }

    return collate


class AsrData:
    """The corpus of a config: `train`/`val` utterances in memory, the test splits loaded on
    demand (`test(split)`), and `batches(seed)`: the epoch-wise duration batches."""

    def __init__(self, cfg: AsrConfig) -> None:
        self.cfg = cfg
        self.root = ensure_corpus(cfg.data)
        self.train = _load(self.root, "train", cfg.data.train)
        self.val = _load(self.root, "val", cfg.eval.val_limit or cfg.data.val)
        self._tests: dict[str, list[Utterance]] = {}

    def test(self, split: str) -> list[Utterance]:
        if split not in self._tests:
            self._tests[split] = _load(self.root, split)
        return self._tests[split]

    def batches(self, seed: int) -> DurationBatchSampler:
        """Batches of `train.batch_size` utterances of similar (perturbed) duration, per epoch."""
        return DurationBatchSampler(
            [u.duration for u in self.train],
            self.cfg.train.batch_size,
            seed=seed,
            rank=D.get_rank(),
            world_size=D.get_world_size(),
        )

    def summary(self) -> dict[str, Any]:
        """Sizes and hours of what was loaded, for the report."""
        out = {}
        for name, utts in (("train", self.train), ("val", self.val)):
            out[name] = {"utterances": len(utts), "hours": sum(u.duration for u in utts) / 3600}
        for split in self.cfg.eval.splits:
            utts = self.test(split)
            out[split] = {"utterances": len(utts), "hours": sum(u.duration for u in utts) / 3600}
        return out
