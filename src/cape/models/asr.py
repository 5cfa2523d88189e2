"""CAPE's CTC acoustic model for speech recognition (CAPE sec. 5.2, appendix C.2).

"The AM encoder is composed of a 1D convolution (kernel 7, stride 3) with a GLU activation,
positional embedding and 36 4-heads Transformer blocks, finally followed by a linear layer which
outputs a score for each target token", with "dropout 0.3 after the convolution layer".

log-mel features [B, F, n_mels] -> Conv1d(n_mels, 2D, kernel, stride, padding=kernel // 2) ->
GLU over channels -> dropout -> pre-norm Transformer encoder (+ positions) -> final LayerNorm ->
Linear(D, vocab) -> float32 log_softmax. Token 0 is the CTC blank.

Positions are the time in seconds of each output frame: after the strided convolution a frame
spans `stride * hop` seconds, so frame i sits at `(i + 0.5) * stride * hop`
(`cape.positions.timestamps`). `hop` (the STFT hop) may differ per sample ([B] tensor), for
batches that mix hops. Any 1-D encoding of `cape.build`, fed as it declares (`units`): a time
encoding gets `hop=` (or the frames' times), a table (`units = "index"`) counts frames, an
in-attention encoding (`kind = "attention"`) is built per layer over the seconds, its CAPE
augmentation drawn once per forward for all layers (`cape.models.plan`; `position_options=
{"draw": "per_layer"}` draws it in each layer instead). The paper's
defaults per name (`position_options` override them):

- "nopos": nothing.
- "sinpos": fixed sinusoid of the seconds, frequencies x30 (`freq_scale=30`, CAPE sec. 3).
- "cape1d": CAPE over the seconds; default options = the paper's "audio" preset (global shift
  60 s, local shift 15 ms, scaling 1.1, mean-normalised, freq_scale 30).
- "abspos": a learned table over output-frame *indices* (a table cannot take seconds); default
  1024 rows, longer inputs wrap (E(t mod N), CAPE sec. 5.2).
- "relpos": learned relative positions in every layer, over the seconds; buckets of
  `step = stride * 0.01` s (one output frame at the default 10 ms hop) up to the paper's 26.8 s
  either side. Other hops keep seconds as the unit: at a 20 ms hop one frame is 2 buckets.
- "rotary": rotary embeddings of the seconds in every layer, `freq_scale=30`; with `xpos=True`
  its decay length `xpos_scale_base` is the authors' 512 tokens counted in output frames
  (512 x step seconds, as FIRE's L).
- "alibi": ALiBi's per-head linear bias on the distance in seconds in every layer; its slopes
  are the paper's per-token ones counted in output frames (m_h / step s^-1, as for FIRE;
  `slopes=` sets others).
- "fire": FIRE's learned bias on the distance in seconds in every layer; its scale c and
  threshold L are the authors' per-token values counted in output frames (c = 0.1 / step s^-1,
  L = 512 steps, step = stride x hop).

`position_options` override these defaults (keywords of `cape.build` for that name).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._checks import (
    check_content,
    check_finite,
    check_float,
    check_int,
    check_lengths,
    check_rate,
    check_tensor,
)
from ..build import encoding_class
from ..functional.alibi import alibi_slopes
from ..positions import lengths_to_mask, timestamps
from .plan import PositionPlan, position_plan, resolve_options
from .transformer import TransformerEncoder

__all__ = ["CTCModel", "output_times"]

_TIME = "time needs 1-D"
_DEFAULT_HOP = 0.01  # seconds: the paper's 10 ms STFT hop, used for relpos's default bucket
_RELPOS_MAX_SECONDS = 26.8  # CAPE's relpos context, "26.8s to the left/right"
_ABSPOS_ROWS = 1024  # ~30 s of output frames at a 10 ms hop and stride 3


def _defaults(frame_step: float) -> dict[str, dict[str, Any]]:
    """The paper's speech options per `cape.build` name (module docstring)."""
    return {
        "sinpos": {"freq_scale": 30.0},
        "cape1d": {"preset": "audio"},
        "abspos": {"num_positions": _ABSPOS_ROWS},
        "relpos": {"step": frame_step, "max_distance": _RELPOS_MAX_SECONDS},
        "rotary": {"freq_scale": 30.0},
        "fire": {"c": 0.1 / frame_step, "threshold": 512.0 * frame_step},
    }


def _feed(plan: PositionPlan) -> str:
    """How the plan's positions are fed: "none", "index" (frame indices: a table), "hop"
    (`hop=` seconds per frame, or the frames' times as `positions=`, to the input encoding) or
    "seconds" (the frames' times, to the layers)."""
    if plan.in_attention:
        return "seconds"
    if plan.absolute is None:
        return "none"
    return "index" if plan.units == "index" else "hop"


def _plan(
    position: str | nn.Module, options: dict[str, Any], dim: int, heads: int, frame_step: float
) -> PositionPlan:
    """The speech model's position plan: the paper's defaults per name, counted in frames."""
    if isinstance(position, nn.Module) and getattr(position, "kind", None) == "attention":
        raise TypeError(
            "position must be a name or an absolute encoding module; relpos/rotary need one "
            "module per layer: pass position='relpos' or 'rotary' with position_options"
        )
    if isinstance(position, str):
        name = position.lower()
        if encoding_class(name, key="position").kind == "none" and options:
            raise ValueError(f"{name} takes no position_options, got {sorted(options)}")
        options = resolve_options(name, options, _defaults(frame_step))
        if name == "alibi" and "slopes" not in options:  # per output frame, as per token
            options["slopes"] = (alibi_slopes(heads) / frame_step).tolist()
        if name == "rotary" and options.get("xpos") and "xpos_scale_base" not in options:
            options["xpos_scale_base"] = 512.0 * frame_step  # xPos's 512 tokens, as frames
    elif not isinstance(position, nn.Module):
        raise TypeError(f"position must be a str or nn.Module, got {type(position).__name__}")
    return position_plan(position, dim=dim, heads=heads, options=options, pos_dim=1, what=_TIME)


def output_times(
    frame_times: torch.Tensor, lengths: torch.Tensor | None, stride: int, steps: int
) -> torch.Tensor:
    """Input frame times [B, F] seconds -> output frame times [B, steps] seconds.

    Output frame i stands for input frames [i * stride, (i + 1) * stride): its time is the mean
    of those frames' times. Frames at or past a sample's length (the convolution's end padding)
    are extrapolated from its last two frames, so evenly spaced frames (f + 0.5) * hop give
    (i + 0.5) * stride * hop for every i, exactly the `timestamps` the model uses with `hop=`.
    lengths: [B] real input frames (None = all F). Outputs past a sample's frames are 0.
    """
    check_tensor("frame_times", frame_times, ndims=(2,), floating=True)
    batch, frames = frame_times.shape
    t = frame_times.float()
    if lengths is None:
        lengths = torch.full((batch,), frames, dtype=torch.int64, device=t.device)
    last = (lengths.to(t.device).to(torch.int64) - 1).clamp(0, max(frames - 1, 0))[
        :, None
    ]  # [B, 1]
    prev = (last - 1).clamp_min(0)
    spacing = t.gather(1, last) - t.gather(1, prev)  # [B, 1]; 0 for a one-frame sample
    k = torch.arange(steps * stride, device=t.device)[None].expand(batch, -1)  # [B, steps * stride]
    inside = torch.minimum(k, last)
    times = t.gather(1, inside) + (k - inside).float() * spacing
    times = times.reshape(batch, steps, stride).mean(-1)
    # outputs whose window starts past the real frames are padding
    out_len = torch.div(lengths.to(t.device) + stride - 1, stride, rounding_mode="floor")
    return torch.where(torch.arange(steps, device=t.device)[None] < out_len[:, None], times, 0.0)


class CTCModel(nn.Module):
    """CTC acoustic model: `CTCModel(vocab, position="cape1d")` (the paper's 36-layer size).

    vocab_size: output tokens *including* the CTC blank, which is index 0. n_mels: input
    features per frame. dim, depth, heads, ffn_dim: the Transformer (D = 768, 36 layers, 4 heads,
    FFN 3072 in the paper). kernel, stride: the front convolution (7, 3); it pads kernel // 2
    frames on each side, so odd kernels give ceil(F / stride) output frames (`output_length`).
    position: a 1-D `cape.build` name or an absolute encoding module of width dim (a time
    encoding gets `hop=` seconds, a table (units "index") frame indices).
    position_options: keywords for `cape.build` (see the module docstring for defaults).
    conv_dropout: after the GLU. dropout, layer_drop: inside the Transformer. relative_layers:
    "all" or "first" (relpos/rotary in the first layer only, the paper's relpos ablation).
    `spec`: the constructor's keywords (JSON-able with a position name): `CTCModel(**spec)`.

    forward(features [B, F, n_mels], lengths [B] | None, *, hop, generator) ->
    (log_probs [B, T', vocab_size] float32, out_lengths [B] int64).
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        n_mels: int = 80,
        dim: int = 768,
        depth: int = 36,
        heads: int = 4,
        ffn_dim: int = 3072,
        kernel: int = 7,
        stride: int = 3,
        position: str | nn.Module = "cape1d",
        position_options: dict[str, Any] | None = None,
        conv_dropout: float = 0.3,
        dropout: float = 0.1,
        layer_drop: float = 0.0,
        relative_layers: str = "all",
    ) -> None:
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=2)  # blank + >= 1 token
        self.n_mels = check_int("n_mels", n_mels)
        self.dim = check_int("dim", dim)
        check_int("depth", depth)
        check_int("heads", heads)
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        self.kernel = check_int("kernel", kernel)
        self.stride = check_int("stride", stride)
        self.padding = kernel // 2
        if position_options is not None and not isinstance(position_options, dict):
            raise TypeError(
                f"position_options must be a dict or None, got {type(position_options).__name__}"
            )
        # the constructor's keywords: with a position *name* they rebuild the model (model.json)
        self.spec: dict[str, Any] = dict(
            vocab_size=vocab_size,
            n_mels=n_mels,
            dim=dim,
            depth=depth,
            heads=heads,
            ffn_dim=ffn_dim,
            kernel=kernel,
            stride=stride,
            position=position,
            position_options=dict(position_options or {}),
            conv_dropout=conv_dropout,
            dropout=dropout,
            layer_drop=layer_drop,
            relative_layers=relative_layers,
        )
        self.plan = _plan(position, dict(position_options or {}), dim, heads, stride * _DEFAULT_HOP)
        self.feed = _feed(self.plan)
        self.position_name = (
            position.lower() if isinstance(position, str) else type(position).__name__
        )

        self.conv = nn.Conv1d(n_mels, 2 * dim, kernel, stride=stride, padding=self.padding)
        self.glu = nn.GLU(dim=1)  # over channels: 2D -> D
        self.conv_dropout = nn.Dropout(check_rate("conv_dropout", conv_dropout))
        self.encoder = TransformerEncoder(
            depth,
            dim,
            heads,
            ffn_dim,
            position=self.plan,
            dropout=dropout,
            layer_drop=layer_drop,
            norm_first=True,
            final_norm=True,
            relative_layers=relative_layers,
        )
        self.head = nn.Linear(dim, vocab_size)

    @classmethod
    def small(cls, vocab_size: int, position: str | nn.Module = "cape1d", **kw: Any) -> CTCModel:
        """A CPU-sized model: D 256, 6 layers, 4 heads, FFN 1024 (keywords override)."""
        options: dict[str, Any] = dict(dim=256, depth=6, heads=4, ffn_dim=1024)
        return cls(vocab_size, position=position, **{**options, **kw})

    # -- lengths ---------------------------------------------------------------------------
    def output_length(self, n: int) -> int:
        """Frames after the convolution for n input frames: (n + 2p - kernel) // stride + 1,
        >= 0."""
        check_int("n", n, minimum=0)
        return max(0, (n + 2 * self.padding - self.kernel) // self.stride + 1)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """lengths [B] input frames -> [B] int64 output frames (as `output_length`, on device)."""
        check_tensor("lengths", lengths, ndims=(1,))
        if lengths.is_floating_point() or lengths.dtype == torch.bool:
            raise TypeError(f"lengths must be an integer tensor, got {lengths.dtype}")
        span = lengths.to(torch.int64) + (2 * self.padding - self.kernel)
        return (torch.div(span, self.stride, rounding_mode="floor") + 1).clamp_min(0)

    # -- forward ---------------------------------------------------------------------------
    def _frame_hop(self, hop: float | torch.Tensor, batch: int, device: torch.device):
        """STFT hop (float or [B] seconds) -> seconds per output frame, stride * hop."""
        if isinstance(hop, torch.Tensor):
            check_tensor("hop", hop, ndims=(1,), floating=True)
            if hop.shape[0] != batch:
                raise ValueError(
                    f"hop must be a float or a [B] = [{batch}] tensor, got {tuple(hop.shape)}"
                )
            return hop.to(device) * self.stride
        return check_float("hop", hop, strict=True) * self.stride

    def forward(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor | None = None,
        *,
        hop: float | torch.Tensor = _DEFAULT_HOP,
        frame_times: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """features: [B, F, n_mels], lengths: [B] real frames (None = all F) ->
        (log_probs [B, T', vocab_size] float32, out_lengths [B] int64).

        hop: the STFT hop in seconds, a float or per sample [B]. Frames past a sample's length
        are ignored (zeroed before the convolution, masked in attention); log_probs there are
        unspecified. For `F.ctc_loss(log_probs.transpose(0, 1), targets, out_lengths, ...)`.
        frame_times: [B, F] seconds of every input frame (padding-free batches whose frames were
        skipped: `SpeechBatch.frame_times`); then positions follow them (`output_times`) and
        `hop` is unused, except by abspos, which counts frames whatever their times.
        """
        check_content("features", features, self.n_mels, self.conv.weight.dtype)
        batch, frames = features.shape[:2]
        least = max(1, self.kernel - 2 * self.padding)  # what the convolution can take
        if frames < least:
            raise ValueError(
                f"features must have at least {least} frame(s) (kernel {self.kernel}, padding "
                f"{self.padding}), got shape {tuple(features.shape)}"
            )
        frame_hop = self._frame_hop(hop, batch, features.device)
        if frame_times is not None:  # checked even where the encoding does not read them
            check_tensor("frame_times", frame_times, ndims=(2,), floating=True)
        if lengths is not None:
            check_lengths("lengths", lengths, batch, frames)
            lengths = lengths.to(features.device)
            # padded frames must look like the conv's own zero padding: a sample then gives the
            # same outputs alone or padded in a batch (where, not *: garbage may be NaN)
            real = lengths_to_mask(lengths, frames)
            features = torch.where(real[..., None], features, 0.0)

        x = self.glu(self.conv(features.transpose(1, 2)))  # [B, D, T']
        x = self.conv_dropout(x.transpose(1, 2))  # [B, T', D]
        steps = x.shape[1]
        if lengths is None:
            out_lengths = torch.full((batch,), steps, dtype=torch.int64, device=x.device)
            mask = None
        else:
            out_lengths = self.output_lengths(lengths)
            mask = lengths_to_mask(out_lengths, steps)

        positions, kwargs = None, None
        if frame_times is not None and self.feed in ("hop", "seconds"):
            if frame_times.shape != features.shape[:2]:
                raise ValueError(
                    f"frame_times must have shape [B, F] = {list(features.shape[:2])}, "
                    f"got {list(frame_times.shape)}"
                )
            times = output_times(frame_times, lengths, self.stride, steps)
            check_finite("frame_times", times, what=" (the output frames' times)")
            positions = times[..., None]  # [B, T', 1]
        elif self.feed == "hop":
            kwargs = {"hop": frame_hop}
        elif self.feed == "seconds":
            positions = timestamps(batch, steps, frame_hop, mask=mask, device=x.device)
        x = self.encoder(
            x, mask=mask, positions=positions, position_kwargs=kwargs, generator=generator
        )
        log_probs = self.head(x).float().log_softmax(dim=-1)
        return log_probs, out_lengths

    def extra_repr(self) -> str:
        return (
            f"vocab_size={self.vocab_size}, position={self.position_name!r}, "
            f"kernel={self.kernel}, stride={self.stride}, padding={self.padding}"
        )
