"""cape inside timm's Vision Transformer: a 2-D encoding for `pos_embed`, 2-D rotary in
attention, and saving and loading that keep them.

Duck-typed on the attributes of timm's `VisionTransformer` (`patch_embed`, `pos_embed`,
`cls_token`, `reg_token`, `num_prefix_tokens`, `no_embed_class`, `blocks[i].attn` with `qkv`,
`q_norm`, `k_norm`): nothing here imports timm or torchvision (`create_model` takes
`timm.create_model` as its factory).

- `replace_pos_embed(model, "cape2d", preset="image")`: the learned `pos_embed` is removed and a
  cape encoding of the patch grid is added to the patch tokens instead, for whatever grid the
  input gives (any image size with timm's `dynamic_img_size=True`); CAPE's augmentation in train
  mode only. Prefix tokens (class, registers) get no cape position (`pos_embed`).
- `add_rotary(model, "rotary2d", max_global_scaling=1.4)`: every attention block rotates q and
  k (after timm's q_norm / k_norm, before its fused `scaled_dot_product_attention`, which is
  kept) by the 2-D patch positions; the prefix tokens sit at (0, 0), the image centre. CAPE's
  augmentation is drawn once per forward for every block (`rotary`).
- `remove_pos_embed(model)`: what both do to `pos_embed`, on its own.

All work through hooks: the state_dict keys stay timm's, `forward`, `forward_features` and
`forward_intermediates` all see the positions, and the patch grid stays symbolic under
torch.export (an exported or ONNX model serves every image size).

Saving: `model.state_dict()` holds cape's record under `CAPE_KEY`, which a stock timm load
refuses by name, and a `pos_embed` that gives stock timm the eval outputs at the training size
(`record`); a warning names what a stock load with strict=False would lose. Loading:
`load_state_dict(stock_model, state)` or `create_model(timm.create_model, name,
checkpoint_path=...)` makes what cape installed again (`loading`).
"""

from .loading import create_model, load_state_dict
from .pos_embed import remove_pos_embed, replace_pos_embed
from .record import CAPE_KEY, cape_record
from .rotary import ROTARY_NAMES, RotaryPositions, add_rotary

__all__ = [
    "replace_pos_embed",
    "add_rotary",
    "remove_pos_embed",
    "RotaryPositions",
    "load_state_dict",
    "create_model",
    "cape_record",
    "CAPE_KEY",
    "ROTARY_NAMES",
]
