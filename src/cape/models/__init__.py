"""Models that combine content with positions: attention, Transformer stacks, the ViT, the CTC
recogniser, the encoder-decoder translator (with its greedy and beam search) and the causal
language model."""

from .ablation import has_positions, without_positions
from .asr import CTCModel
from .attention import MultiheadAttention, attention_mask
from .causal_lm import CausalLM
from .plan import PositionPlan, position_plan
from .search import beam_search, greedy_decode, max_lengths, sequence_nll
from .seq2seq import Seq2Seq
from .transformer import (
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from .vit import ViT

__all__ = [
    "MultiheadAttention",
    "attention_mask",
    "PositionPlan",
    "position_plan",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "ViT",
    "CTCModel",
    "Seq2Seq",
    "CausalLM",
    "greedy_decode",
    "beam_search",
    "max_lengths",
    "sequence_nll",
    "without_positions",
    "has_positions",
]
