"""cape inside models built by other libraries, by duck typing on their modules' attributes.

`cape.integrations.hf`: Hugging Face transformers models (a RoPE model's `rotary_emb`, a BERT-style
position table, CAPE's augmentation of `position_ids`). `cape.integrations.timm`: timm's
VisionTransformer (a cape 2-D encoding in place of `pos_embed`, 2-D rotary in every attention
block). Nothing here imports those libraries: both modules work without them installed.
"""

from . import hf, timm

__all__ = ["hf", "timm"]
