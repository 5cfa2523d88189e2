"""The cases of `cape bench deploy`: every `cape.build` name in the model that uses it, and every
model, each with example inputs, the dimensions that vary, and inputs of another shape.

1-D encodings go into a `TransformerEncoder` (absolute ones added at the input, the others built
per layer inside attention), 2-D ones into a `ViT` (the image's height and width vary), encodings
of given N-D positions are called alone on their positions; the models are `ViT`, `CTCModel`,
`Seq2Seq` and a causal `TransformerDecoder` over a memory. The "timm" cases are timm's
VisionTransformer, stock and with cape installed by `cape.integrations.timm` (needs timm).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import cape
from cape.integrations.timm import add_rotary, replace_pos_embed
from cape.models import CTCModel, Seq2Seq, TransformerDecoder, TransformerEncoder, ViT

__all__ = ["Case", "CASES", "make_case"]

DIM, HEADS = 32, 4
AUG = {"augmentation": cape.Augmentation(max_global_shift=4.0, max_global_scaling=1.1)}


@dataclass
class Case:
    """module: called as `module(*args)`; dynamic: `torch.export` dynamic shapes of args;
    other: inputs of another batch and length (or image size), inside the dynamic ranges;
    loss: a scalar of the module's output (training checks)."""

    module: nn.Module
    args: tuple[torch.Tensor, ...]
    dynamic: tuple[dict[int, Any], ...]
    other: tuple[torch.Tensor, ...]
    loss: Callable[[Any], torch.Tensor]


def _dims(t_max: int = 4096) -> tuple[Any, Any]:
    return torch.export.Dim("B", min=1, max=64), torch.export.Dim("T", min=2, max=t_max)


def _mean(out: Any) -> torch.Tensor:
    return (out[0] if isinstance(out, tuple) else out).float().square().mean()


def _sequence(name: str, **options: Any) -> Case:
    """A 2-layer encoder with the encoding `name` where the position plan puts it."""
    t_max = options.get("num_positions", 4096)
    model = TransformerEncoder(2, DIM, HEADS, 2 * DIM, position=name, position_options=options)
    b, t = _dims(t_max)
    x, other = torch.randn(2, 10, DIM), torch.randn(3, 17, DIM)
    return Case(model, (x,), ({0: b, 1: t},), (other,), _mean)


def _images(module: nn.Module) -> Case:
    """Images of 4-pixel patches into module; their height and width vary (multiples of 4)."""
    # at least 2 patches a side: torch's convolution specialises an output size of 1
    h, w = torch.export.Dim("h", min=2, max=64), torch.export.Dim("w", min=2, max=64)
    dyn = {0: torch.export.Dim("B", min=1, max=64), 2: 4 * h, 3: 4 * w}
    return Case(module, (torch.randn(2, 3, 16, 12),), (dyn,), (torch.randn(3, 3, 24, 20),), _mean)


def _image(name: str, **options: Any) -> Case:
    """A 2-layer ViT on 4-pixel patches; the image's height and width vary (multiples of 4)."""
    vit = ViT(5, image_size=16, patch=4, dim=DIM, depth=2, heads=HEADS, position=name,
              position_options=options)  # fmt: skip
    if name == "abspos2d":  # a table of the training grid: the size cannot vary
        dyn = {0: torch.export.Dim("B", min=1, max=64)}
        return Case(vit, (torch.randn(2, 3, 16, 16),), (dyn,), (torch.randn(3, 3, 16, 16),), _mean)
    return _images(vit)


def _timm(install: Callable[[nn.Module], Any]) -> Case:
    """timm's VisionTransformer (2 layers, 4-pixel patches, `dynamic_img_size=True`) with cape
    installed by `cape.integrations.timm`; the image's height and width vary. Needs timm
    (ModuleNotFoundError otherwise: the bench then says the case was not run)."""
    from cape.lab.torchvision_ops import declare_missing_torchvision_ops

    declare_missing_torchvision_ops()
    from timm.models.vision_transformer import VisionTransformer

    vit = VisionTransformer(img_size=16, patch_size=4, embed_dim=DIM, depth=2, num_heads=HEADS,
                            num_classes=5, dynamic_img_size=True)  # fmt: skip
    install(vit)
    return _images(vit)


class _GivenPositions(nn.Module):
    """An encoding of given positions called alone: (x [B, T, D], positions [B, T, M])."""

    def __init__(self, encoding: nn.Module) -> None:
        super().__init__()
        self.encoding = encoding

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.encoding.add_to(x, positions=positions)


def _given(name: str, coords: int, **options: Any) -> Case:
    module = _GivenPositions(cape.build(name, DIM, **options))
    b, t = _dims()
    pos, other_pos = torch.rand(2, 10, coords), torch.rand(3, 17, coords)
    return Case(
        module, (torch.randn(2, 10, DIM), pos), ({0: b, 1: t}, {0: b, 1: t}),
        (torch.randn(3, 17, DIM), other_pos), _mean,
    )  # fmt: skip


class _Speech(nn.Module):
    def __init__(self, position: str) -> None:
        super().__init__()
        self.model = CTCModel.small(12, position=position, depth=2, n_mels=16, dim=DIM,
                                    heads=HEADS, ffn_dim=2 * DIM)  # fmt: skip

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features, hop=0.01)[0]


def _speech(position: str) -> Case:
    b, t = torch.export.Dim("B", min=1, max=64), torch.export.Dim("f", min=4, max=2048)
    dyn = ({0: b, 1: 3 * t},)  # frames: a multiple of the front end's stride
    return Case(_Speech(position), (torch.randn(2, 30, 16),), dyn, (torch.randn(3, 48, 16),),
                _mean)  # fmt: skip


class _Translation(nn.Module):
    def __init__(self, position: str) -> None:
        super().__init__()
        self.model = Seq2Seq(50, dim=DIM, encoder_layers=2, decoder_layers=2, heads=HEADS,
                             ffn_dim=2 * DIM, position=position)  # fmt: skip

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        ones = torch.ones_like
        return self.model(src, ones(src, dtype=torch.bool), tgt, ones(tgt, dtype=torch.bool))


def _translation(position: str) -> Case:
    b = torch.export.Dim("B", min=1, max=64)
    s, t = torch.export.Dim("S", min=2, max=1024), torch.export.Dim("T", min=2, max=1024)
    args = (torch.randint(0, 50, (2, 9)), torch.randint(0, 50, (2, 7)))
    other = (torch.randint(0, 50, (3, 13)), torch.randint(0, 50, (3, 11)))
    return Case(_Translation(position), args, ({0: b, 1: s}, {0: b, 1: t}), other, _mean)


def _decoder(position: str, **options: Any) -> Case:
    model = TransformerDecoder(2, DIM, HEADS, 2 * DIM, position=position,
                               position_options=options)  # fmt: skip
    b, t = _dims()
    m = torch.export.Dim("M", min=2, max=1024)
    args = (torch.randn(2, 10, DIM), torch.randn(2, 6, DIM))
    other = (torch.randn(3, 17, DIM), torch.randn(3, 9, DIM))
    return Case(model, args, ({0: b, 1: t}, {0: b, 1: m}), other, _mean)


CASES: dict[str, Callable[[], Case]] = {
    "nopos": lambda: _sequence("nopos"),
    "sinpos": lambda: _sequence("sinpos"),
    "cape1d": lambda: _sequence("cape1d", preset="text"),
    "abspos": lambda: _sequence("abspos", num_positions=64),
    "relpos": lambda: _sequence("relpos"),
    "rotary": lambda: _sequence("rotary"),
    "rotary+CAPE": lambda: _sequence("rotary", **AUG),
    "rotary yarn": lambda: _sequence("rotary", scaling="yarn", factor=4.0, train_length=16),
    "rotary xpos": lambda: _sequence("rotary", xpos=True),
    "alibi": lambda: _sequence("alibi"),
    "alibi+CAPE": lambda: _sequence("alibi", **AUG),
    "fire": lambda: _sequence("fire"),
    "sinpos2d": lambda: _image("sinpos2d"),
    "cape2d": lambda: _image("cape2d", preset="image"),
    "abspos2d": lambda: _image("abspos2d"),
    "rotary2d": lambda: _image("rotary2d"),
    "rope-axial": lambda: _image("rope-axial"),
    "rope-mixed": lambda: _image("rope-mixed"),
    "lff": lambda: _given("lff", 2, pos_dim=2),
    "sine-1d": lambda: _given("sine-1d", 1),
    "sine-2d": lambda: _given("sine-2d", 2),
    "sine-4d": lambda: _given("sine-4d", 4),
    "embed-1d": lambda: _given("embed-1d", 1, num_positions=16),
    "embed-2d": lambda: _given("embed-2d", 2, sizes=(8, 8)),
    "embed-4d": lambda: _given("embed-4d", 4, sizes=(4, 4, 4, 4)),
    "CTCModel cape1d": lambda: _speech("cape1d"),
    "CTCModel rotary": lambda: _speech("rotary"),
    "Seq2Seq cape1d": lambda: _translation("cape1d"),
    "Seq2Seq rotary": lambda: _translation("rotary"),
    "decoder rotary": lambda: _decoder("rotary"),
    "decoder alibi": lambda: _decoder("alibi"),
    "timm stock": lambda: _timm(lambda vit: None),
    "timm cape2d": lambda: _timm(lambda vit: replace_pos_embed(vit, "cape2d", preset="image")),
    "timm rotary2d": lambda: _timm(lambda vit: add_rotary(vit, "rotary2d", **AUG)),
    "timm rope-mixed": lambda: _timm(lambda vit: add_rotary(vit, "rope-mixed")),
}


def make_case(name: str, seed: int = 0) -> Case:
    """The case `name` of `CASES`, its weights drawn from `seed`."""
    if name not in CASES:
        raise ValueError(f"case must be one of {list(CASES)}, got {name!r}")
    torch.manual_seed(seed)
    return CASES[name]()
