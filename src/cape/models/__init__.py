"""Models that combine content with positions: attention, Transformer stacks, the ViT, the CTC
recogniser and the encoder-decoder translator (with its greedy and beam search)."""

from .asr import ASR_POSITIONS, CTCModel
from .attention import MultiheadAttention, attention_mask
from .search import beam_search, greedy_decode, max_lengths, sequence_nll
from .seq2seq import MT_POSITIONS, Seq2Seq
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
    "Seq2Seq",
    "MT_POSITIONS",
    "greedy_decode",
    "beam_search",
    "max_lengths",
    "sequence_nll",
]
