"""The position plan: where an encoding goes, and one augmentation draw per forward."""

from __future__ import annotations

import copy

import pytest
import torch

import cape
from cape.augment import augment_positions
from cape.models import CTCModel, Seq2Seq, TransformerDecoder, TransformerEncoder, ViT
from cape.models.plan import position_plan

AUG = {"max_global_shift": 5.0, "max_local_shift": 0.5, "max_global_scaling": 1.4}


def _positions_seen(model: torch.nn.Module) -> tuple[list[torch.Tensor | None], list]:
    """Hooks that record the positions every self-attention reads: those of the context the
    stack prepared (or, called alone, the q_positions it receives)."""
    seen: list[torch.Tensor | None] = []

    def hook(_mod, _args, kwargs):
        context = kwargs.get("context")
        seen.append(kwargs.get("q_positions") if context is None else context.q_positions)

    handles = [
        m.register_forward_pre_hook(hook, with_kwargs=True)
        for name, m in model.named_modules()
        if name.endswith("self_attn")
    ]
    return seen, handles


@pytest.mark.parametrize("name", ["rotary", "alibi", "fire"])
def test_shared_draw_is_one_draw_for_every_layer(name: str) -> None:
    torch.manual_seed(0)
    enc = TransformerEncoder(3, 32, 4, 64, position=name, position_options={"augmentation": AUG})
    enc.train()
    mask = cape.lengths_to_mask(torch.tensor([9, 6]), 9)
    seen, _ = _positions_seen(enc)
    enc(torch.randn(2, 9, 32), mask=mask, generator=torch.Generator().manual_seed(7))
    assert len(seen) == 3
    for pos in seen[1:]:
        assert seen[0] is not None and torch.equal(pos, seen[0])
    # the same draw, computed independently from the augmentation's definition
    index = cape.token_positions(2, 9, mask=mask)
    want = augment_positions(
        index, mask, **AUG, training=True, generator=torch.Generator().manual_seed(7)
    )
    torch.testing.assert_close(seen[0], want, rtol=0, atol=0)
    assert not torch.equal(want, index)  # something was drawn
    modules = {id(layer.self_attn.rotary or layer.self_attn.biases[0]) for layer in enc.layers}
    # one module for the stack when it has no parameters (rotary, ALiBi), else one per layer
    assert len(modules) == (3 if name == "fire" else 1)


def test_shared_draw_equals_layers_fed_augmented_positions() -> None:
    """A stack with the shared draw computes what its layers compute on positions augmented
    once beforehand: the draw is the only difference from an unaugmented stack."""
    torch.manual_seed(0)
    shared = TransformerEncoder(
        2, 32, 4, 64, position="rotary", position_options={"augmentation": AUG}, dropout=0.0
    )
    plain = TransformerEncoder(2, 32, 4, 64, position="rotary", dropout=0.0)
    plain.load_state_dict(shared.state_dict())
    shared.train(), plain.train()
    x = torch.randn(3, 11, 32)
    mask = cape.lengths_to_mask(torch.tensor([11, 8, 3]), 11)
    out = shared(x, mask=mask, generator=torch.Generator().manual_seed(3))
    pos = augment_positions(
        cape.token_positions(3, 11, mask=mask),
        mask,
        **AUG,
        training=True,
        generator=torch.Generator().manual_seed(3),
    )
    want = plain(x, mask=mask, positions=pos)
    real = mask[..., None]
    torch.testing.assert_close(out * real, want * real)


def test_per_layer_draw_is_an_explicit_option() -> None:
    torch.manual_seed(0)
    opts = {"augmentation": AUG, "draw": "per_layer"}
    per_layer = TransformerEncoder(
        3, 32, 4, 64, position="rotary", position_options=opts, dropout=0.0
    )
    shared = TransformerEncoder(
        3, 32, 4, 64, position="rotary", position_options={"augmentation": AUG}, dropout=0.0
    )
    shared.load_state_dict(per_layer.state_dict())
    assert all(layer.self_attn.rotary.augmentation is not None for layer in per_layer.layers)
    assert per_layer.plan.stack_augmentation is None
    x = torch.randn(2, 9, 32)
    # in eval the two are the same model (nothing is drawn)
    torch.testing.assert_close(per_layer.eval()(x), shared.eval()(x))
    # in training each layer draws its own positions: the first layer's draw is the shared
    # one (the same generator state), the later layers' are new ones
    seen, _ = _positions_seen(shared)
    a = per_layer.train()(x, generator=torch.Generator().manual_seed(1))
    b = shared.train()(x, generator=torch.Generator().manual_seed(1))
    assert len(seen) == 3 and not torch.allclose(a, b)
    again = shared(x, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(again, b)  # the difference is the draws, not noise


def test_plan_places_each_kind() -> None:
    absolute = position_plan("cape1d", dim=32, heads=4, options={"preset": "text"})
    assert absolute.absolute is not None and not absolute.in_attention
    assert absolute.absolute.augmentation is not None  # one call per forward: it draws itself
    alibi = position_plan("alibi", dim=32, heads=4)
    assert alibi.layer().heads == 4  # per-head encodings are built with the number of heads
    assert position_plan("relpos", dim=32, heads=4).layer().head_dim == 8
    none = position_plan("nopos", dim=32, heads=4)
    assert none.absolute is None and not none.in_attention
    module = cape.build("sinpos", 32)
    assert position_plan(module, dim=32, heads=4).absolute is module


def test_plan_refuses_bad_options() -> None:
    with pytest.raises(ValueError, match=r"position_options\['draw'\]"):
        position_plan("rotary", dim=32, heads=4, options={"draw": "sometimes"})
    with pytest.raises(ValueError, match="inside attention"):
        position_plan("cape1d", dim=32, heads=4, options={"draw": "per_layer"})
    with pytest.raises(ValueError, match="synchronised"):
        Seq2Seq(50, dim=32, heads=4, position="rotary", position_options={"draw": "per_layer"})
    with pytest.raises(ValueError, match="reads 2-D"):
        position_plan("rotary2d", dim=32, heads=4, pos_dim=1, what="tokens need 1-D")
    with pytest.raises(ValueError, match="normalize"):
        TransformerDecoder(
            1, 32, 4, 64, position="rotary", position_options={"augmentation": {"normalize": True}}
        )
    with pytest.raises(ValueError, match="not both"):
        TransformerEncoder(1, 32, 4, 64, position="rotary", relative_factory=lambda: None)


@pytest.mark.parametrize(
    ("position", "options"),
    [
        ("cape1d", {"augmentation": {"max_global_shift": 2.0, "normalize": True}}),
        ("rotary", {"augmentation": {"normalize": True}, "draw": "per_layer"}),
        ("alibi", {"augmentation": {"normalize": True}}),
    ],
)
def test_a_causal_plan_refuses_mean_normalisation(position: str, options: dict) -> None:
    """The plan refuses it for every causal model, whatever carries the augmentation (the input
    encoding, each layer's module, or the stack's shared draw); a bidirectional stack keeps it."""
    with pytest.raises(ValueError, match="normalize=True .* later tokens"):
        position_plan(position, dim=32, heads=4, options=options, causal=True)
    with pytest.raises(ValueError, match="normalize"):
        TransformerEncoder(1, 32, 4, 64, position=position, position_options=options, causal=True)
    stack = TransformerEncoder(1, 32, 4, 64, position=position, position_options=options)
    assert stack(torch.randn(2, 5, 32)).shape == (2, 5, 32)


def test_vit_rotary_layers_share_one_draw() -> None:
    torch.manual_seed(0)
    aug = {"max_global_shift": 0.5, "max_global_scaling": 1.4}
    vit = ViT(4, image_size=16, patch=4, dim=32, depth=3, heads=2, position="rotary2d",
              position_options={"augmentation": aug})  # fmt: skip
    seen, _ = _positions_seen(vit)
    vit.train()(torch.randn(2, 3, 16, 16), generator=torch.Generator().manual_seed(0))
    assert len(seen) == 3 and all(torch.equal(p, seen[0]) for p in seen)
    grid = cape.grid_positions(4, 4)[0]
    assert not torch.allclose(seen[0][0, 1:], grid)  # augmented patch positions
    per_layer = copy.deepcopy(vit.plan)
    assert per_layer.draw == "shared"


def test_ctc_model_draw_option_round_trips() -> None:
    opts = {"augmentation": {"max_global_scaling": 1.2}, "draw": "per_layer"}
    model = CTCModel.small(10, position="rotary", position_options=opts, depth=2)
    assert all(layer.self_attn.rotary.augmentation is not None for layer in model.encoder.layers)
    again = CTCModel(**model.spec)
    assert again.plan.draw == "per_layer"
    shared = CTCModel.small(10, position="alibi", position_options={"augmentation": AUG}, depth=2)
    assert shared.plan.stack_augmentation is not None
