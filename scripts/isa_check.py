"""Is a vision training run bit-reproducible, and does the CPU's vector unit change it?

Trains the quick preset's CAPE ViT for 30 steps on 512 rendered characters in a fresh process per
ATen CPU capability (the vector kernels torch picks for this CPU, or forced to another level) and
prints a checksum of the weights. Equal checksums for equal settings show the run is
bit-reproducible on one machine; different ones for different capabilities show why a run on
another CPU (e.g. with AVX-512) takes another floating-point path and ends ~1 point apart.

    .venv/bin/python scripts/isa_check.py            # default, default again, avx2, default ISA
"""

from __future__ import annotations

import os
import subprocess
import sys

STEPS, BATCH = 30, 128


def train_checksum() -> str:
    import torch

    from cape.lab.experiments import EXPERIMENTS, resolve_config
    from cape.lab.experiments.vision.data import VisionData
    from cape.lab.experiments.vision.model import classify_loss, make_model
    from cape.lab.train import seed_everything

    exp = EXPERIMENTS["vision"]
    cfg, _ = resolve_config(
        exp.config_cls,
        exp.presets,
        "quick",
        [],
        ["data.root=data/isa-check", "data.train=512", "data.val=16", "data.test=16"],
    )
    x, y = VisionData(cfg.data).tensors("train", 32)
    seed_everything(0)
    model = make_model(cfg, cfg.rows[-1], 36)  # CAPE
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    loss_fn = classify_loss([])
    for step in range(STEPS):
        i = step * BATCH % (len(y) - BATCH)
        loss, _ = loss_fn(model, (x[i : i + BATCH], y[i : i + BATCH]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    total = sum(p.double().sum().item() for p in model.parameters())
    return f"{torch.backends.cpu.get_cpu_capability():8s} weights sum {total:.12f}"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(train_checksum())
        sys.exit(0)
    for cap in ("", "", "avx2", "default"):
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        if cap:
            env["ATEN_CPU_CAPABILITY"] = cap
        out = (
            subprocess.run(
                [sys.executable, __file__, "--child"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        print(f"ATEN_CPU_CAPABILITY={cap or '(unset)':8s} {out}")
