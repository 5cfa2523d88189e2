"""The GPU path: no host syncs, a CUDA-graph-captured training step with CAPE, and bf16.

`cape bench gpu` runs three checks on a CUDA device and writes gpu.md / gpu.csv:

- sync: every encoding, the ViT and the CTC model run forward and backward under
  `torch.cuda.set_sync_debug_mode("error")`, which raises on any device-to-host synchronisation
  (an `.item()`, a value-dependent shape), with `cape.value_checks(False)`: by default cape reads
  a few values at each public boundary (finite positions, phases), as on the CPU.
- graph: one AdamW training step of a Transformer encoder with CAPE1d in train mode (random
  augmentation drawn inside the graph) is captured with `torch.cuda.graph` and replayed; the
  replays must change the parameters, draw new augmentations and match an eager step's loss.
- bf16: the same models under `torch.autocast(dtype=torch.bfloat16)` give finite losses and
  gradients within a relative tolerance of fp32, and CAPE's and rotary's phases stay in
  float32 (their bf16 outputs are exactly the float32 maths cast to bf16).
- fused: the compiled kernels of `cape.fusion` (triton on CUDA) agree with the eager path.

On a machine without CUDA the command stops with exit code 2 and says so.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import cape
from cape._fusion import compiled_calls
from cape.encodings.fourier import LearnableFourierFeatures
from cape.lab.arguments import ArgumentParser, out_folder
from cape.lab.bench.results import machine, write_results

__all__ = [
    "SYNC_CASES",
    "check_sync",
    "check_graph_step",
    "check_bf16",
    "check_phases",
    "check_fused",
    "main",
]

Loss = Callable[[nn.Module], torch.Tensor]
Factory = Callable[[torch.device], tuple[nn.Module, Loss]]  # device -> (module, its loss)


def _sequence(name: str, **kw: Any) -> Factory:
    def make(dev: torch.device) -> tuple[nn.Module, Loss]:
        from cape.build import build

        enc = build(name, 64, **kw).to(dev).train()
        x = torch.randn(4, 50, 64, device=dev, requires_grad=True)
        given = {}
        if isinstance(enc, LearnableFourierFeatures):  # its positions are given: token indices
            given["positions"] = torch.arange(50.0, device=dev)[None, :, None].expand(4, 50, 1)
        return enc, lambda m: m.add_to(x, **given).square().mean()

    return make


def _image(name: str, **kw: Any) -> Factory:
    def make(dev: torch.device) -> tuple[nn.Module, Loss]:
        from cape.models import ViT

        vit = (
            ViT(
                10,
                image_size=32,
                patch=4,
                dim=64,
                depth=2,
                heads=2,
                position=name,
                position_options=kw,
            )
            .to(dev)
            .train()
        )
        x = torch.randn(4, 3, 40, 32, device=dev)
        y = torch.randint(0, 10, (4,), device=dev)
        return vit, lambda m: nn.functional.cross_entropy(m(x), y)

    return make


def _ctc(name: str) -> Factory:
    def make(dev: torch.device) -> tuple[nn.Module, Loss]:
        from cape.models import CTCModel

        net = CTCModel.small(29, position=name, depth=2).to(dev).train()
        feats = torch.randn(3, 120, 80, device=dev)
        lengths = torch.tensor([120, 90, 61], device=dev)

        def loss(m: nn.Module) -> torch.Tensor:
            log_probs, out_lengths = m(feats, lengths, hop=0.01)
            return log_probs.float().logsumexp(-1).mean() + out_lengths.float().mean() * 0

        return net, loss

    return make


SYNC_CASES: dict[str, Factory] = {
    "cape1d train": _sequence("cape1d", preset="text", max_global_scaling=1.1, normalize=True),
    "sinpos": _sequence("sinpos"),
    "abspos": _sequence("abspos", num_positions=64),
    "lff": _sequence("lff", pos_dim=1),
    "vit cape2d train": _image("cape2d", preset="image"),
    "vit abspos2d (resampled)": _image("abspos2d"),
    "vit lff": _image("lff"),
    "ctc cape1d train": _ctc("cape1d"),
    "ctc relpos": _ctc("relpos"),
    "ctc rotary": _ctc("rotary"),
}


def check_sync(name: str, device: torch.device) -> dict[str, Any]:
    """Forward + backward of SYNC_CASES[name] with sync debug mode "error": ok or the error."""
    module, loss_fn = SYNC_CASES[name](device)
    loss_fn(module).backward()  # first call outside: lazy init (cuBLAS handles...) may sync
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with cape.value_checks(False):  # the sync-free path users turn on for speed
            loss_fn(module).backward()
        result = "ok"
    except RuntimeError as err:
        result = f"host sync: {str(err).splitlines()[0]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize(device)
    return dict(check="sync", case=name, result=result, detail="")


def _verdict(check: str, case: str, ok: bool, detail: str) -> dict[str, Any]:
    return dict(check=check, case=case, result="ok" if ok else "FAILED", detail=detail)


def check_graph_step(device: torch.device, replays: int = 5) -> dict[str, Any]:
    """Capture one AdamW step (fwd, bwd, update) of a 2-layer encoder with CAPE1d; replay it."""
    from cape.build import build
    from cape.models import TransformerEncoder

    torch.manual_seed(0)
    net = TransformerEncoder(2, 64, 4, 128, position=build("cape1d", 64, preset="text")).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, capturable=True)
    x = torch.randn(8, 40, 64, device=device)
    target = torch.randn(8, 40, 64, device=device)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=False)
        loss = (net(x) - target).square().mean()
        loss.backward()
        opt.step()
        return loss

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up on a side stream, as capture requires
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step()
    before = [p.detach().clone() for p in net.parameters()]
    losses = []
    for _ in range(replays):
        graph.replay()
        losses.append(static_loss.clone())
    moved = any(not torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))
    values = torch.stack(losses).tolist()  # one sync, after the replays
    eager = step().item()
    distinct = len(set(values)) == len(values)  # new augmentation and weights at every replay
    close = abs(eager - values[-1]) <= 0.5 * abs(values[-1]) + 1e-3
    ok = moved and distinct and close and all(v == v for v in values)
    detail = f"losses {', '.join(f'{v:.4f}' for v in values)}; eager after: {eager:.4f}"
    return _verdict("graph", "encoder cape1d AdamW step", ok, detail)


def check_bf16(name: str, device: torch.device, rtol: float = 0.05) -> dict[str, Any]:
    """Loss and gradient norm of SYNC_CASES[name] under bf16 autocast vs fp32 (same weights)."""
    out = []
    for dtype in (None, torch.bfloat16):
        torch.manual_seed(0)
        module, loss_fn = SYNC_CASES[name](device)
        module.eval()  # the same positions for both precisions: no augmentation draw
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(module)
        loss.float().backward()
        grads = [p.grad.float().square().sum() for p in module.parameters() if p.grad is not None]
        out.append((loss.float().item(), float(sum(grads, torch.zeros(())).sqrt())))
    (l32, g32), (l16, g16) = out
    finite = all(v == v and abs(v) != float("inf") for v in (l16, g16))
    ok = finite and abs(l16 - l32) <= rtol * abs(l32) + 1e-3 and abs(g16 - g32) <= rtol * g32 + 1e-3
    return _verdict(
        "bf16", name, ok, f"loss {l32:.4f} -> {l16:.4f}, grad norm {g32:.4f} -> {g16:.4f}"
    )


def check_phases(device: torch.device) -> dict[str, Any]:
    """Under bf16 autocast, CAPE1d's embedding and rotary's rotation at positions up to 1e4
    are exactly the float32 maths cast to bf16: their phases stay in float32. The
    detail gives what bf16 phases would be off by (the check's sensitivity)."""
    pos = torch.linspace(0, 10000, 64, device=device)[None]  # [1, 64] token positions
    enc = cape.build("cape1d", 64).to(device).eval()
    rot = cape.build("rotary", 16).to(device).eval()
    x = torch.randn(1, 64, 64, device=device).to(torch.bfloat16)
    q = torch.randn(1, 2, 64, 16, device=device).to(torch.bfloat16)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        emb, (qr, _) = enc(x, positions=pos), rot(q, q, positions=pos)
    want_emb = enc(x.float(), positions=pos).to(torch.bfloat16)
    want_q = rot(q.float(), q.float(), positions=pos)[0].to(torch.bfloat16)
    same = emb.dtype == qr.dtype == torch.bfloat16
    ok = same and torch.equal(emb, want_emb) and torch.equal(qr, want_q)
    omega = enc.frequencies[0].to(device)
    bf16_phase = (pos[0, :, None].bfloat16() * omega.bfloat16()).float()
    off = (torch.sin(bf16_phase) - torch.sin(pos[0, :, None] * omega)).abs().max()
    detail = f"bf16 phases would be off by up to {float(off):.2f} in sin"
    return _verdict("bf16 phases", "cape1d, rotary at positions to 1e4", ok, detail)


def check_fused(device: torch.device) -> dict[str, Any]:
    """The fused path (`cape.fusion(True)`: inductor, triton on CUDA) against the eager one:
    CAPE1d's add_to in training and rotary's rotation, values and gradients, same draws."""
    torch.manual_seed(0)
    enc = cape.build("cape1d", 256, preset="text").to(device).train()
    rot = cape.build("rotary", 64, augmentation=cape.Augmentation(max_global_shift=4.0))
    rot = rot.to(device).train()
    outs, calls = [], []
    for mode in (False, True):
        before = compiled_calls()
        x = torch.linspace(-1, 1, 8 * 200 * 256, device=device).reshape(8, 200, 256)
        x.requires_grad_(True)
        q = x.view(8, 200, 4, 64).transpose(1, 2)
        with cape.fusion(mode):
            y = enc.add_to(x, generator=torch.Generator(device).manual_seed(1))
            qr, kr = rot(q, q, generator=torch.Generator(device).manual_seed(2))
        (y.square().sum() + (qr * kr).sum()).backward()
        outs.append((y.detach(), qr.detach(), x.grad))
        calls.append(compiled_calls() - before)
    close = all(torch.allclose(f, e, atol=2e-4, rtol=1e-4) for e, f in zip(*outs, strict=True))
    compiled = calls[0] == 0 and calls[1] >= 4  # eager: none; fused: 1 add + 2 rotations + bwd
    err = max(float((f - e).abs().max()) for e, f in zip(*outs, strict=True))
    detail = f"compiled: {compiled}; max |fused - eager| {err:.2e}"
    return _verdict(
        "fused", "cape1d add_to, rotary (compiled vs eager)", close and compiled, detail
    )


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="cape bench gpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", default="cuda", help="a CUDA device, e.g. cuda or cuda:1")
    p.add_argument("--out", type=out_folder, default=None, help="folder for gpu.md / gpu.csv")
    args = p.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        p.error(f"--device must be cuda[:N], got {args.device!r}")
    if device.type != "cuda":
        p.error(f"--device must be cuda[:N], got {args.device!r}")
    if not torch.cuda.is_available():
        p.error("cape bench gpu needs a CUDA device; none is available on this machine")
    rows = [check_sync(name, device) for name in SYNC_CASES]
    rows.append(check_graph_step(device))
    rows += [check_bf16(name, device) for name in SYNC_CASES]
    rows += [check_phases(device), check_fused(device)]
    title = "The GPU path: host syncs, CUDA graphs, bf16"
    write_results(args.out, "gpu", rows, title=title, meta=machine(device))
    return 0 if all(r["result"] == "ok" for r in rows) else 1
