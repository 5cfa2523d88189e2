"""`cape bench encodings`: fwd+bwd cost and memory of every encoding against adding a table.

For each shape family (text `[32, 1000, 512]` and `[32, 100, 512]`, audio `[16, 333, 768]` at a
30 ms frame hop, ViT `[64, 14, 14, 768]`) and encoding, one process times round-robin
(`time_interleaved`: ratios comparable on a noisy machine) fwd+bwd of `x + table`, `x + enc(x)`,
`enc.add_to(x)` eager and fused (`cape.fusion`), and for CAPE in training the sine alone (its
floor). Rotary rotates q and k (`[B, H, T, d]` views of x): twice the data of a table add.
Memory: what the step keeps for backward beyond x and the parameters (`saved_bytes`), and on
CUDA the allocator's peak above the input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from cape import Augmentation, fusion
from cape._fusion import compiled_calls
from cape.build import build
from cape.functional.alibi import alibi_slopes
from cape.lab.arguments import ArgumentParser, out_folder
from cape.lab.bench.memory import cuda_peak_bytes, saved_bytes
from cape.lab.bench.results import machine, write_results
from cape.lab.timing import time_interleaved
from cape.positions import grid_positions, timestamps, token_positions

__all__ = ["Case", "CASES", "run_case", "main"]

_HEAD_DIM = 64
_AUDIO_HOP = 0.03  # seconds per frame: a 10 ms STFT hop after the stride-3 convolution
_CAPE_AUDIO = dict(preset="audio", max_global_scaling=1.1)
_CAPE_TEXT = dict(preset="text", max_global_scaling=1.1, normalize=True)
# CAPE's image amounts over Sine-2D's (column, row) indices: one index = 2/N of [-1, 1]
_SINE_AUG = Augmentation(max_global_shift=3.5, max_local_shift=0.5, max_global_scaling=1.4)


@dataclass(frozen=True)
class Case:
    """One measurement: `make(D)` builds the module, `inputs(x)` gives (content, keywords)."""

    family: str
    name: str
    shape: tuple[int, ...]  # x: [B, T, D] or [B, H, W, D]
    make: Callable[[int], nn.Module]
    inputs: Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, Any]]] = lambda x: (x, {})
    train: bool = True
    target: float | None = None  # the ratio to the table add the eager add_to must stay within
    rotary: bool = False  # rotates q, k instead of adding an embedding
    bias: bool = False  # an attention bias [B or 1, H, T, T] of the positions (ALiBi, FIRE)
    peer: bool = False  # an encoding people pick instead of the papers' (`--peers`)
    compiled_target: float | None = None  # the fused (compiled) path's ratio asked for
    floor: bool = False  # also time the sine alone (`_floor`): the floor of both targets

    def outputs(self, enc: nn.Module, x: torch.Tensor, add_to: bool = False) -> list[torch.Tensor]:
        """[x + enc(x)], [enc.add_to(x)], rotary's (q, k), or the bias (FIRE's MLP's grads)."""
        content, kw = self.inputs(x)
        if self.bias:
            return [enc(kw["positions"])]
        if self.rotary:
            b, t, d = content.shape
            qk = content.view(b, t, d // _HEAD_DIM, _HEAD_DIM).transpose(1, 2)  # [B, H, T, hd]
            return list(enc(qk, qk, **kw))
        return [enc.add_to(content, **kw) if add_to else content + enc(content, **kw)]


def _with(**kw: Any) -> Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, Any]]]:
    return lambda x: (x, kw)


def _with_positions(
    positions: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, Any]]]:
    """4-D x is flattened to [B, H*W, D]: LFF and rotary read T positions."""
    return lambda x: (x.flatten(1, 2) if x.dim() == 4 else x, {"positions": positions(x)})


def _tokens(x: torch.Tensor) -> torch.Tensor:
    return token_positions(x.shape[0], x.shape[1], device=x.device)


def _seconds(x: torch.Tensor) -> torch.Tensor:
    return timestamps(x.shape[0], x.shape[1], _AUDIO_HOP, device=x.device)


def _grid(x: torch.Tensor) -> torch.Tensor:
    return grid_positions(x.shape[1], x.shape[2], batch=x.shape[0], device=x.device)


def _cape_cases(
    family: str,
    name: str,
    shape: tuple[int, ...],
    make: Callable[[int], nn.Module],
    inputs: Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, Any]]],
    targets: tuple[float | None, float | None, float | None] = (2.2, 1.3, 1.8),
) -> list[Case]:
    """CAPE measured twice: in training (every augmentation drawn) and in evaluation (none);
    `targets`: the ratios asked of training's eager path, evaluation's, training's fused path
    (the default one for these sizes where a compiler is present)."""
    train = Case(family, f"{name} train, all aug", shape, make, inputs, True, targets[0])
    return [
        replace(train, compiled_target=targets[2], floor=True),
        Case(family, f"{name} eval", shape, make, inputs, False, targets[1]),
    ]


def _sequence_cases(family: str, shape: tuple[int, ...], audio: bool) -> list[Case]:
    given = _with(hop=_AUDIO_HOP) if audio else _with()
    pos = _with_positions(_seconds if audio else _tokens)
    # positions shared by the batch ([1, T]), as a model passes them without padding: one bias
    shared = _with_positions(lambda x: (_seconds if audio else _tokens)(x)[:1])
    cape = _CAPE_AUDIO if audio else _CAPE_TEXT
    freq = {"freq_scale": 30.0} if audio else {}  # seconds: CAPE's audio frequencies
    long = shape[1] >= 1000
    text = not audio
    return [
        *_cape_cases(
            family,
            "cape1d",
            shape,
            lambda d: build("cape1d", d, **cape),
            given,
            (
                (2.2 if long else 2.5) if text else None,
                1.3 if long and text else None,
                (1.8 if long else 2.5) if text else None,
            ),
        ),
        Case(family, "sinpos", shape, lambda d: build("sinpos", d, **freq), given),
        Case(family, "abspos", shape, lambda d: build("abspos", d, num_positions=shape[1])),
        Case(family, "lff + mlp", shape, lambda d: build("lff", d, pos_dim=1), pos),
        Case(
            family,
            "rotary",
            shape,
            lambda d: build("rotary", _HEAD_DIM, **freq),
            pos if audio else _with(),
            rotary=True,
            compiled_target=1.8 if long and text else None,
        ),
        *[
            Case(family, name, shape, make, shared, bias=True, peer=True)
            for name, make in (  # per head; over seconds, the CTC model's per-frame slopes
                ("alibi", lambda d: build("alibi", d // _HEAD_DIM, **_alibi(d, audio))),
                ("fire", lambda d: build("fire", d // _HEAD_DIM, **_fire(audio))),
            )
        ],
    ]


def _alibi(dim: int, audio: bool) -> dict[str, Any]:
    slopes = alibi_slopes(dim // _HEAD_DIM) / (_AUDIO_HOP if audio else 1.0)
    return {"slopes": slopes.tolist()}


def _fire(audio: bool) -> dict[str, Any]:
    step = _AUDIO_HOP if audio else 1.0  # FIRE's per-token c and L, counted in frames
    return {"c": 0.1 / step, "threshold": 512.0 * step}


def _vit_cases(shape: tuple[int, ...]) -> list[Case]:
    grid = tuple(shape[1:3])
    half = (grid[0] // 2, grid[1] // 2)
    pos = _with_positions(_grid)
    return [
        *_cape_cases("vit", "cape2d", shape, lambda d: build("cape2d", d, preset="image"), _with()),
        Case("vit", "sinpos2d", shape, lambda d: build("sinpos2d", d)),
        Case("vit", "abspos2d", shape, lambda d: build("abspos2d", d, grid=grid)),
        Case(
            "vit",
            f"abspos2d resampled from {half[0]}x{half[1]}",
            shape,
            lambda d: build("abspos2d", d, grid=half),
        ),
        Case(
            "vit",
            "sine-2d train, all aug",
            shape,
            lambda d: build("sine-2d", d, augmentation=_SINE_AUG),
            compiled_target=1.8,
            floor=True,
        ),
        Case("vit", "lff + mlp (2d)", shape, lambda d: build("lff", d, pos_dim=2), pos),
        Case(
            "vit",
            "rotary (2d)",
            shape,
            lambda d: build("rotary", _HEAD_DIM, pos_dim=2),
            pos,
            rotary=True,
            compiled_target=1.8,
        ),
        Case(
            "vit",
            "rope-axial (2d)",
            shape,
            lambda d: build("rope-axial", _HEAD_DIM, fit_grid=grid),
            pos,
            rotary=True,
            peer=True,
        ),
        Case(
            "vit",
            "rope-mixed (2d)",
            shape,
            lambda d: build("rope-mixed", _HEAD_DIM, heads=d // _HEAD_DIM, fit_grid=grid),
            pos,
            rotary=True,
            peer=True,
        ),
    ]


CASES: list[Case] = [
    *_sequence_cases("text", (32, 1000, 512), audio=False),
    *_sequence_cases("text", (32, 100, 512), audio=False),
    *_sequence_cases("audio", (16, 333, 768), audio=True),
    *_vit_cases((64, 14, 14, 768)),
]


def _backward(outs: list[torch.Tensor]) -> None:
    outs = [o for o in outs if o.requires_grad]  # ALiBi's bias has no parameters: forward only
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


def run_case(
    case: Case,
    *,
    runs: int = 20,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    scale: float = 1.0,
) -> dict[str, Any]:
    """Time and measure one case. scale: shrinks B (tests); shapes keep T, H, W and D."""
    dev = torch.device(device)
    shape = (max(1, int(case.shape[0] * scale)), *case.shape[1:])
    torch.manual_seed(0)
    x = torch.randn(shape, device=dev, dtype=dtype, requires_grad=True)
    table = torch.randn(shape[1:], device=dev, dtype=dtype)
    enc = case.make(shape[-1]).to(dev).train(case.train)
    params = list(enc.parameters())

    def step(fused: bool, add_to: bool) -> Callable[[], None]:
        def run() -> None:
            with fusion(fused):
                _backward(case.outputs(enc, x, add_to))

        return run

    def baseline() -> None:
        _backward([x + table])

    encoded, eager, compiled = step(False, False), step(False, True), step(True, True)
    floors = _floor(case, enc, x) if case.floor else []
    before = compiled_calls()
    with fusion(True):  # does a compiled kernel run for this case? (a compiler, a kernel)
        case.outputs(enc, x, True)
    fuses = compiled_calls() > before
    fns = [baseline, encoded, eager] + ([compiled] if fuses else [])
    timings = time_interleaved(fns + floors, runs=runs, device=dev)
    nan = float("nan")
    ms = [t.median_ms for t in timings[: len(fns)]] + [nan]  # ms[3]: NaN without a fused path
    base = ms[0]
    floor = [t.median_ms / base for t in timings[len(fns) :]] + [nan, nan]
    with fusion(False):
        saved = saved_bytes(lambda: case.outputs(enc, x), exclude=[x, *params])
        peak = cuda_peak_bytes(encoded, dev)
    return dict(
        family=case.family,
        case=case.name,
        shape="x".join(map(str, shape)),
        table_ms=base,
        table_iqr_ms=timings[0].iqr_ms,
        encoding_ms=ms[1],
        encoding_iqr_ms=timings[1].iqr_ms,
        ratio=ms[1] / base,
        eager_ms=ms[2],
        eager_ratio=ms[2] / base,
        compiled_ms=ms[3],
        compiled_iqr_ms=timings[3].iqr_ms if fuses else nan,
        compiled_ratio=ms[3] / base,
        saved_mib=saved / 2**20,
        peak_mib=nan if peak is None else peak / 2**20,
        floor_ratio=floor[0],
        compiled_floor_ratio=floor[1] if fuses else nan,
        target=_verdict(ms[2] / base, case.target, floor[0]),
        compiled_target=_verdict(ms[3] / base, case.compiled_target, floor[1]),
    )


def _floor(case: Case, enc: nn.Module, x: torch.Tensor) -> list[Callable[[], None]]:
    """The sine alone, eager then fused: the embedding of the positions the call starts from,
    each sample's own as drawn ones are (a batch-broadcast view compiles to a faster kernel),
    added to the content (`finish`); none built, checked or drawn: the floor of its targets."""
    content, kw = case.inputs(x)
    b, t = content.shape[:2]
    if content.dim() == 4:  # [B, H, W, D]: the grid's positions in its shape
        pos = enc.grid_positions(t, content.shape[2], batch=b, device=x.device)
    else:
        pos = enc.sequence_positions(b, t, hop=kw.get("hop"), device=x.device)
    pos = pos.reshape(*content.shape[:-1], -1).contiguous()

    def sine(fused_path: bool) -> None:
        with fusion(fused_path):
            _backward([enc.finish(pos, None, None, content)])

    return [lambda: sine(False), lambda: sine(True)]


def _verdict(row_ratio: float, target: float | None, floor: float = float("nan")) -> str:
    """'<= 2.2 ok' / '<= 2.2 MISSED' (NaN: not run), '' without a target; a ratio within 1.2x
    of its floor (the sine alone on the same path, same run) meets the target."""
    if target is None:
        return ""
    if target < row_ratio <= 1.2 * floor:
        return f"<= {target} ok: {row_ratio / floor:.2f}x its floor"
    return f"<= {target} " + ("ok" if row_ratio <= target else "MISSED")


COLUMNS = (
    "family case shape table_ms encoding_ms encoding_iqr_ms ratio eager_ms eager_ratio "
    "compiled_ms compiled_iqr_ms compiled_ratio saved_mib peak_mib floor_ratio "
    "compiled_floor_ratio target compiled_target"
).split()


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="cape bench encodings", description=__doc__)
    p.add_argument("--runs", type=int, default=20, help="timed runs per measurement (>= 1)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--families", default="text,audio,vit", help="comma list of text, audio, vit")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of each batch size (tests)")
    p.add_argument(
        "--peers",
        action="store_true",
        help="time the encodings people pick instead (ALiBi, FIRE, RoPE-ViT's axial and mixed) "
        "instead of the papers'",
    )
    p.add_argument(
        "--out", type=out_folder, default=None, help="folder for encodings.md / encodings.csv"
    )
    args = p.parse_args(argv)
    families = p.names("--families", args.families, list(dict.fromkeys(c.family for c in CASES)))
    p.at_least(("--runs", args.runs, 1))
    if not 0 < args.scale <= 1:
        p.error(f"--scale must lie in (0, 1], got {args.scale}")
    rows = [
        run_case(c, runs=args.runs, device=args.device, scale=args.scale)
        for c in CASES
        if c.family in families and c.peer == args.peers
    ]
    meta = {
        **machine(args.device),
        "dtype": "fp32",
        "runs": args.runs,
        "times": "median ms of fwd+bwd; IQR = inter-quartile range; ratio = / table add, same run",
    }
    notes = (
        "`encoding_ms`: x + enc(x); `eager_ms`: enc.add_to(x) eager (the embedding takes x in "
        "its own buffer; rotary: enc(q, k)); `compiled_ms`: the same call on the fused path "
        "(`cape.fusion(True)`: one compiled kernel; NaN where the case has none: tables, "
        "biases, LFF's MLP, or no compiler). `target`: asked of eager_ratio; "
        "`compiled_target`: of compiled_ratio. "
        "`saved_mib`: memory kept for the backward beyond x and the parameters; `peak_mib`: "
        "CUDA allocator peak above the input (NaN on CPU). Rotary rotates q and k: 2x the data. "
        "ALiBi and FIRE make an attention bias [B or 1, H, T, T] of the positions (H = D / 64), "
        "which no table add has: their ratio is what the bias costs next to adding a table. "
        "`floor_ratio` / `compiled_floor_ratio` (CAPE in training): the sine alone, eager / "
        "fused, the embedding of the unaugmented positions added to x with no position "
        "built, checked or drawn; a path within 1.2x of its floor meets its target. The fused "
        "path is the default one at these sizes where a compiler is present (`cape.fusion`)."
    )
    write_results(
        args.out,
        "encodings",
        rows,
        title="Cost of each encoding against adding a table",
        columns=COLUMNS,
        meta=meta,
        notes=notes,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
