"""Models that combine content with positions: attention and Transformer stacks."""

from .asr import ASR_POSITIONS, CTCModel
from .attention import MultiheadAttention, attention_mask
from .transformer import (
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from .vit import VIT_POSITIONS, ViT

__all__ = [
    "MultiheadAttention",
    "attention_mask",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "ViT",
    "VIT_POSITIONS",
    "CTCModel",
    "ASR_POSITIONS",
]
