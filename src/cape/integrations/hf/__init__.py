"""cape inside Hugging Face transformers models, both ways, by duck typing: `import cape`
never imports transformers.

RoPE models (Llama, Mistral, Qwen2, Phi-3, GPT-NeoX, Gemma 3...: a `rotary_emb(x,
position_ids[, layer_type]) -> (cos, sin)` module): `rotary_from_config(model.config)` gives
the `cape.Rotary` of every rope type transformers ships (`rope`), `rope_parameters` the
reverse; `install_rotary(model, rotary)` serves cos/sin from it and rewrites the config so that
saving and loading keep it. `augment_position_ids(model, augmentation)` adds a training-time
augmentation of `position_ids` (CAPE's or its successors'), in train mode only.

Position tables (BERT-style `position_embeddings`, GPT-2's `wpe`, OPT's `embed_positions`):
`install_positions(model, cape.build("cape1d", hidden))` puts a cape absolute encoding in
their place (`tables`).

Saving: transformers' own `save_pretrained`; loading: a stock `from_pretrained` reproduces
what transformers can express and refuses the rest by name; `from_pretrained(model_class,
path)` here makes everything cape installed again (`saving`).
"""

from .hook import AugmentationHook, augment_position_ids, augmented_position_ids
from .install import CAPE_ROPE_TYPE, install_positions, install_rotary, rotary_spec
from .rope import RotaryEmbedding, rope_parameters, rotary_from_config
from .saving import cape_record, from_pretrained
from .tables import OPTPositionEmbedding, PositionEmbedding

__all__ = [
    "RotaryEmbedding",
    "rotary_from_config",
    "rope_parameters",
    "install_rotary",
    "augmented_position_ids",
    "augment_position_ids",
    "AugmentationHook",
    "PositionEmbedding",
    "OPTPositionEmbedding",
    "install_positions",
    "from_pretrained",
    "cape_record",
    "rotary_spec",
    "CAPE_ROPE_TYPE",
]
