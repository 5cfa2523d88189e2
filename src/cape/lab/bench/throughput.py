"""`cape bench throughput`: inference throughput vs input size (CAPE Figure 4 and Figure 17).

- `vit`: images/s of a ViT at each test resolution (UniViT's adjustable throughput, Figure 4),
  for one model per encoding (cape2d, sinpos2d, abspos2d resampled bicubically off its training
  grid, lff), timed round-robin per resolution. The paper passes the largest batch that fits a
  16 GB V100 and averages 30 runs; here the batch is fixed (`--batch`) and the median is kept.
- `asr`: seconds of audio per second for the CTC model of the speech experiment, features
  included (log-mel at STFT hop H, then the model) for each hop H (Figure 17: a larger hop
  gives fewer frames, hence more throughput, for a CAPE model whose positions are in seconds).

Both write a markdown table and CSV (`--out`) and, with matplotlib, a PNG of throughput vs size.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from cape.lab.arguments import ArgumentParser, out_folder
from cape.lab.bench.results import machine, write_results
from cape.lab.timing import time_models

__all__ = ["VIT_MODELS", "vit_throughput", "asr_throughput", "main"]

# ViT's keywords (image_size: of the training images) of the vision experiment's CPU model,
# DeiT-Ti and DeiT-S (the paper's '-Ti' and '-S')
VIT_MODELS: dict[str, dict[str, Any]] = {
    "experiment": dict(dim=96, depth=4, heads=4, mlp_ratio=2.0, patch=4, image_size=32),
    "tiny": dict(dim=192, depth=12, heads=3, mlp_ratio=4.0, patch=16, image_size=224),
    "small": dict(dim=384, depth=12, heads=6, mlp_ratio=4.0, patch=16, image_size=224),
}
VIT_POSITIONS = ("cape2d", "sinpos2d", "abspos2d", "lff")


def _per_second(count: float, ms: float) -> float:
    return count / (ms / 1e3)


def vit_throughput(
    model: str,
    sizes: Sequence[int],
    *,
    positions: Sequence[str] = VIT_POSITIONS,
    batch: int = 64,
    runs: int = 10,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """Images/s of `VIT_MODELS[model]` at each size in `sizes` (multiples of its patch)."""
    from cape.models import ViT

    patch = VIT_MODELS[model]["patch"]
    bad = [s for s in sizes if s % patch or s < patch]
    if bad:
        raise ValueError(
            f"sizes must be multiples of the patch {patch} (model {model!r}), got {bad}"
        )
    dev = torch.device(device)
    nets = {}
    for name in positions:
        torch.manual_seed(0)
        nets[name] = ViT(1000, position=name, **VIT_MODELS[model]).to(dev).eval()
    batches = ((size, torch.randn(batch, 3, size, size, device=dev)) for size in sizes)
    timed = time_models(nets, batches, runs=runs, warmup=2, device=dev)
    return [
        dict(
            model=model,
            position=name,
            size=size,
            tokens=(size // patch) ** 2,
            batch=batch,
            median_ms=t.median_ms,
            iqr_ms=t.iqr_ms,
            images_per_s=_per_second(batch, t.median_ms),
        )
        for size, name, t in timed
    ]


def asr_throughput(
    hops_ms: Sequence[float],
    *,
    seconds: float = 10.0,
    batch: int = 8,
    runs: int = 10,
    device: str = "cpu",
    positions: Sequence[str] = ("cape1d", "relpos"),
) -> list[dict[str, Any]]:
    """Audio seconds per second of log-mel features + `CTCModel.small` at each STFT hop."""
    from cape.lab.data.speech.features import frame_hop_seconds, log_mel
    from cape.models.asr import CTCModel

    bad = [h for h in hops_ms if not h > 0]
    if bad:
        raise ValueError(f"hops_ms must be > 0 ms, got {bad}")
    dev = torch.device(device)
    sample_rate = 16000
    torch.manual_seed(0)
    wave = torch.randn(batch, int(seconds * sample_rate), device=dev) * 0.1
    nets = {}
    for name in positions:
        torch.manual_seed(0)
        nets[name] = CTCModel.small(29, position=name).to(dev).eval()

    def features_then(net: CTCModel) -> Callable[[float], object]:
        """The model at an STFT hop (ms), features included."""
        return lambda hop: net(log_mel(wave, sample_rate, hop_ms=hop),
                               hop=frame_hop_seconds(hop, sample_rate))  # fmt: skip

    models = {name: features_then(net) for name, net in nets.items()}
    timed = time_models(models, ((h, h) for h in hops_ms), runs=runs, warmup=2, device=dev)
    rows = []
    for hop, name, t in timed:
        frames = log_mel(wave[:1], sample_rate, hop_ms=hop).shape[1]
        rows.append(
            dict(
                position=name,
                hop_ms=hop,
                frames=frames,
                model_frames=nets[name].output_length(frames),
                batch=batch,
                median_ms=t.median_ms,
                iqr_ms=t.iqr_ms,
                audio_s_per_s=_per_second(batch * seconds, t.median_ms),
            )
        )
    return rows


# the plot of each family: its x and y columns and their labels
_AXES = {
    "vit": ("size", "images_per_s", "image size (px)", "images / s"),
    "asr": ("hop_ms", "audio_s_per_s", "STFT hop (ms)", "audio seconds / s"),
}


def _plot(
    rows: list[dict[str, Any]], out: Path, title: str, x: str, y: str, xlabel: str, ylabel: str
) -> None:
    try:
        from cape.lab.viz import plot_curves
    except ImportError:  # matplotlib is the optional "plot" extra
        return
    cells = [{"series": r["position"], "x": r[x], "mean": r[y], "std": 0.0, "n": 1} for r in rows]
    plot_curves(cells, out, x="x", series="series", title=title, x_label=xlabel, y_label=ylabel)


def _numbers(p: argparse.ArgumentParser, flag: str, text: str, kind: type) -> list[Any]:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        p.error(f"{flag} must be a comma list of numbers, got {text!r}")
    if not values or any(v <= 0 for v in values):
        p.error(f"{flag} must list positive numbers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="cape bench throughput", description=__doc__)
    p.add_argument("what", choices=list(_AXES), help="which model family")
    p.add_argument("--model", default="experiment", choices=sorted(VIT_MODELS), help="vit: size")
    p.add_argument("--sizes", default=None, help="vit: comma list of resolutions in px")
    p.add_argument("--hops", default="5,7.5,10,12.5,15,20,25,30", help="asr: STFT hops in ms")
    p.add_argument("--seconds", type=float, default=10.0, help="asr: utterance length in s")
    p.add_argument(
        "--batch", type=int, default=None, help="images (vit, 64) or utterances (asr, 8)"
    )
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=out_folder, default=None, help="folder for the .md, .csv and .png")
    args = p.parse_args(argv)
    if args.runs < 1 or (args.batch is not None and args.batch < 1):
        p.error("--runs and --batch must be >= 1")
    meta = {**machine(args.device), "dtype": "fp32", "runs": args.runs, "mode": "inference"}
    if args.what == "vit":
        patch = VIT_MODELS[args.model]["patch"]
        default = ",".join(str(patch * n) for n in (4, 6, 8, 12, 16, 24) if patch * n <= 384)
        sizes = _numbers(p, "--sizes", args.sizes or default, int)
        rows = vit_throughput(
            args.model, sizes, batch=args.batch or 64, runs=args.runs, device=args.device
        )
        name = f"throughput-vit-{args.model}"
        title = f"ViT-{args.model} inference throughput vs resolution"
    else:
        if args.seconds <= 0:
            p.error(f"--seconds must be > 0, got {args.seconds}")
        hops = _numbers(p, "--hops", args.hops, float)
        rows = asr_throughput(
            hops, seconds=args.seconds, batch=args.batch or 8, runs=args.runs, device=args.device
        )
        name, title = "throughput-asr", "CTC model throughput vs STFT hop (features + model)"
    write_results(args.out, name, rows, title=title, meta=meta)  # every key of a row: a column
    if args.out is not None:
        _plot(rows, Path(args.out) / f"{name}.png", title, *_AXES[args.what])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
