"""cape inside models built by other libraries, by duck typing on their modules' attributes.

`cape.integrations.hf`: Hugging Face transformers models (a RoPE model's `rotary_emb`, a BERT-style
position table, CAPE's augmentation of `position_ids`). Nothing here imports those libraries:
`import cape.integrations.hf` works without transformers installed.
"""

from . import hf

__all__ = ["hf"]
