"""cape.models.vit.ViT: every position name, resizing, determinism, augmentation, training."""

from __future__ import annotations

import pytest
import torch

from cape.models.vit import ViT

# the 2-D `cape.build` names of the vision study
VIT_POSITIONS = (
    "nopos",
    "abspos2d",
    "sinpos2d",
    "cape2d",
    "lff",
    "sine-2d",
    "embed-2d",
    "rotary2d",
)

SMALL = dict(image_size=32, patch=4, dim=32, depth=2, heads=2, mlp_ratio=2)


def _model(position: str, **kw) -> ViT:
    torch.manual_seed(0)
    return ViT(5, position=position, **{**SMALL, **kw})


@pytest.mark.parametrize("position", sorted(VIT_POSITIONS))
def test_shapes_at_three_sizes(position: str) -> None:
    model = _model(position)
    for size in (32, 24, 48):
        logits = model(torch.randn(2, 3, size, size))
        assert logits.shape == (2, 5)
        assert torch.isfinite(logits).all()
    rect = model(torch.randn(1, 3, 16, 40))
    assert rect.shape == (1, 5)


@pytest.mark.parametrize("position", ["sinpos2d", "cape2d", "lff", "rotary2d"])
def test_extent_continuous(position: str) -> None:
    model = _model(position).eval()
    x = torch.randn(1, 3, 24, 24)
    assert not torch.allclose(model(x, extent=2.0), model(x))


def test_extent_rejected_for_discrete() -> None:
    with pytest.raises(ValueError, match="extent"):
        _model("abspos2d")(torch.randn(1, 3, 32, 32), extent=2.0)


def test_abspos2d_table_and_resampling() -> None:
    model = _model("abspos2d").eval()
    x = torch.randn(2, 3, 32, 32)
    tokens, _ = model.embed(x)
    patches = model.patch_embed(x).permute(0, 2, 3, 1).flatten(1, 2)
    torch.testing.assert_close(
        tokens[:, 1:] - patches, model.position.table.flatten(0, 1)[None].expand(2, -1, -1)
    )
    # other grids: resampled table, not nothing
    small = torch.randn(2, 3, 24, 24)
    tokens, _ = model.embed(small)
    patches = model.patch_embed(small).permute(0, 2, 3, 1).flatten(1, 2)
    added = tokens[:, 1:] - patches
    torch.testing.assert_close(added[0], model.position.resample((6, 6)).flatten(0, 1))
    nopos = _model("nopos").eval()
    nopos.load_state_dict(model.state_dict(), strict=False)
    assert not torch.allclose(nopos(small), model(small))


def test_abspos2d_rejects_cls_token_option() -> None:
    with pytest.raises(ValueError, match="class-token"):
        ViT(2, position="abspos2d", position_options={"cls_token": True})


@pytest.mark.parametrize("position", ["sinpos2d", "cape2d"])
def test_eval_deterministic_and_batch_independent(position: str) -> None:
    opts = {"preset": "image"} if position == "cape2d" else None
    model = _model(position, position_options=opts).eval()
    x = torch.randn(3, 3, 24, 24)
    out = model(x)
    torch.testing.assert_close(model(x), out)
    torch.testing.assert_close(model(x[1:2]), out[1:2], atol=1e-5, rtol=1e-5)


def test_cape2d_train_augments_and_generator_reproduces() -> None:
    model = _model("cape2d", position_options={"preset": "image"}).train()
    x = torch.randn(2, 3, 32, 32)
    assert not torch.allclose(model(x), model(x))
    a = model(x, generator=torch.Generator().manual_seed(3))
    b = model(x, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("position", sorted(VIT_POSITIONS))
def test_class_token_position_learned(position: str) -> None:
    model = _model(position)
    model(torch.randn(2, 3, 24, 24)).sum().backward()
    assert model.cls_position.grad is not None
    assert model.cls_position.grad.abs().sum() > 0


def test_embed2d_clamps_beyond_training_grid() -> None:
    model = _model("embed-2d")
    assert model.position.sizes == (8, 8)
    assert torch.isfinite(model(torch.randn(1, 3, 64, 48))).all()


def test_rotary_positions_include_class_token() -> None:
    model = _model("rotary2d")
    tokens, pos = model.embed(torch.randn(2, 3, 24, 24))
    assert tokens.shape == (2, 37, 32) and pos.shape == (2, 37, 2)
    assert torch.equal(pos[:, 0], torch.zeros(2, 2))


def _where_data(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A bright 4x4 patch in the left (class 0) or right (class 1) half of a 16x16 image."""
    x = torch.zeros(n, 1, 16, 16)
    y = torch.arange(n) % 2
    for i in range(n):
        r = int(torch.randint(0, 4, (1,), generator=g)) * 4
        c = int(torch.randint(0, 2, (1,), generator=g)) * 4 + 8 * int(y[i])
        x[i, 0, r : r + 4, c : c + 4] = 1.0
    return x, y


def _train(position: str, steps: int = 60) -> float:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = ViT(
        2,
        image_size=16,
        patch=4,
        dim=32,
        depth=2,
        heads=2,
        mlp_ratio=2,
        position=position,
        channels=1,
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = _where_data(64, g)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(-1) == y).float().mean().item()


def test_training_learns_where() -> None:
    assert _train("cape2d") > 0.8


def test_bad_image_size() -> None:
    model = _model("nopos")
    with pytest.raises(ValueError, match="30x32"):
        model(torch.randn(1, 3, 30, 32))
    with pytest.raises(ValueError, match="image_size"):
        ViT(2, image_size=30, patch=4)


def test_unknown_position() -> None:
    with pytest.raises(ValueError, match="cape2d"):
        ViT(2, position="bogus")


# -- packed batches of images of different native sizes (forward_packed) --------------------


def _packed_model(position: str, **kw) -> ViT:
    opts = {"preset": "image"} if position == "cape2d" else None
    return _model(position, position_options=opts, **kw)


def _mixed() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(3, h, w, generator=g) for h, w in ((8, 8), (12, 16), (8, 8))]


@pytest.mark.parametrize("position", sorted(VIT_POSITIONS))
def test_packed_equals_each_image_alone(position: str) -> None:
    model = _packed_model(position).eval()
    images = _mixed()
    out = model.forward_packed(images)
    alone = torch.cat([model(img[None]) for img in images])
    assert out.shape == (3, 5)
    torch.testing.assert_close(out, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", ["sinpos2d", "lff", "rotary2d"])
def test_packed_extent_equals_each_image_alone(position: str) -> None:
    model = _packed_model(position).eval()
    images = _mixed()
    out = model.forward_packed(images, extent=2.0)
    alone = torch.cat([model(img[None], extent=2.0) for img in images])
    torch.testing.assert_close(out, alone, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, model.forward_packed(images), atol=1e-4)


def test_packed_extent_rejected_for_discrete() -> None:
    with pytest.raises(ValueError, match="extent"):
        _packed_model("abspos2d").forward_packed(_mixed(), extent=2.0)


@pytest.mark.parametrize("position", sorted(VIT_POSITIONS))
def test_packed_gradients_equal_sum_of_alone(position: str) -> None:
    """Every parameter `forward` trains gets the gradient of the images alone: padding adds none."""
    model = _packed_model(position).eval()
    images = [img.requires_grad_() for img in _mixed()]
    model.forward_packed(images).square().sum().backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    image_grads = [img.grad.clone() for img in images]
    model.zero_grad(set_to_none=True)
    for img in images:
        img.grad = None
        model(img[None]).square().sum().backward()
    alone = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    trained = {n for n, g in alone.items() if g.abs().sum() > 0}
    assert trained and trained <= {n for n, g in packed.items() if g.abs().sum() > 0}
    assert set(packed) == set(alone)
    for name in alone:
        torch.testing.assert_close(packed[name], alone[name], atol=1e-5, rtol=1e-4, msg=name)
    for got, img in zip(image_grads, images, strict=True):
        torch.testing.assert_close(got, img.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("position", ["cape2d", "abspos2d", "embed-2d", "rotary2d"])
def test_packed_order_invariant(position: str) -> None:
    model = _packed_model(position).eval()
    images = _mixed() + [torch.randn(3, 16, 8)]
    out = model.forward_packed(images)
    perm = [3, 1, 0, 2]
    torch.testing.assert_close(
        model.forward_packed([images[i] for i in perm]), out[perm], atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(
    "position,options",
    [
        ("cape2d", {"preset": "image"}),
        ("cape2d", {"preset": "image", "normalize": True, "max_local_shift": (0.1, 0.2)}),
        (
            "rotary2d",
            {
                "augmentation": {
                    "max_global_shift": 0.5,
                    "max_local_shift": 0.1,
                    "max_global_scaling": 1.4,
                }
            },
        ),
    ],
)
def test_packed_same_size_train_draws_equal_stacked(position: str, options: dict) -> None:
    model = _model(position, position_options=options).train()
    x = torch.randn(3, 3, 12, 16)
    packed = model.forward_packed(list(x), generator=torch.Generator().manual_seed(5))
    stacked = model(x, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(packed, stacked, atol=1e-6, rtol=1e-6)
    # and the draws matter: another seed gives another result
    other = model.forward_packed(list(x), generator=torch.Generator().manual_seed(6))
    assert not torch.allclose(other, stacked, atol=1e-4)


def _recorded_positions(model: ViT, images: list[torch.Tensor], seed: int) -> torch.Tensor:
    """The (augmented) positions CAPE2d embeds for a packed batch."""
    seen = []
    embed = model.position.embed

    def record(positions: torch.Tensor) -> torch.Tensor:
        seen.append(positions.detach().clone())
        return embed(positions)

    model.position.embed = record
    try:
        model.forward_packed(images, generator=torch.Generator().manual_seed(seed))
    finally:
        del model.position.embed
    assert len(seen) == 1
    return seen[0]


def test_packed_cape2d_local_shift_uses_each_images_own_grid() -> None:
    """max_local_shift='auto': emax = 1/N per axis with the image's own N, as when alone."""
    from cape.positions import grid_positions

    opts = {"max_local_shift": "auto"}  # no global shift / scaling: p' = p + eps
    model = _model("cape2d", position_options=opts).train()
    images = [torch.randn(3, 8, 8) for _ in range(4)] + [torch.randn(3, 12, 16)]
    pos = _recorded_positions(model, images, seed=0)
    assert pos.shape == (5, 12, 2)
    small, large = grid_positions(2, 2), grid_positions(3, 4)
    eps_small = pos[:4, :4] - small
    eps_large = pos[4] - large
    assert torch.equal(pos[:4, 4:], torch.zeros(4, 8, 2))  # padding stays at 0
    assert (eps_small.abs() <= 0.5 + 1e-6).all()  # 2x2 grid: emax = 1/2 on both axes
    assert (eps_large[:, 0].abs() <= 0.25 + 1e-6).all()  # 3x4 grid: x 1/4, y 1/3
    assert (eps_large[:, 1].abs() <= 1 / 3 + 1e-6).all()
    # the small images are jittered by their own (larger) emax, not the large grid's
    assert (eps_small[..., 0].abs() > 0.25).any() and (eps_small[..., 1].abs() > 1 / 3).any()
    assert (eps_large[:, 0].abs() > 0.125).any()
    # eval: the plain grids
    model.eval()
    pos = _recorded_positions(model, images, seed=0)
    torch.testing.assert_close(pos[4], large)
    torch.testing.assert_close(pos[0, :4], small)


def test_embed_packed_tokens_mask_positions() -> None:
    model = _packed_model("rotary2d").eval()
    images = _mixed()
    tokens, mask, pos = model.embed_packed(images)
    assert tokens.shape == (3, 13, 32) and mask.shape == (3, 13) and pos.shape == (3, 13, 2)
    assert mask.dtype == torch.bool
    assert mask.sum(1).tolist() == [5, 13, 5] and mask[:, 0].all()
    assert torch.equal(pos[:, 0], torch.zeros(3, 2))
    assert torch.equal(pos[0, 5:], torch.zeros(8, 2))
    alone, alone_pos = model.embed(images[1][None])
    torch.testing.assert_close(tokens[1], alone[0])
    torch.testing.assert_close(pos[1], alone_pos[0])
    torch.testing.assert_close(tokens[0, :5], model.embed(images[0][None])[0][0])


def test_packed_one_patch_embedding_per_size() -> None:
    model = _packed_model("cape2d").eval()
    calls = []
    model.patch_embed.register_forward_hook(lambda m, i, o: calls.append(tuple(i[0].shape)))
    model.forward_packed(_mixed() + [torch.randn(3, 12, 16)])
    assert sorted(calls) == [(2, 3, 8, 8), (2, 3, 12, 16)]


def test_packed_errors() -> None:
    model = _packed_model("cape2d")
    with pytest.raises(ValueError, match="non-empty"):
        model.forward_packed([])
    with pytest.raises(ValueError, match=r"images\[1\] size 10x16"):
        model.forward_packed([torch.randn(3, 8, 8), torch.randn(3, 10, 16)])
    with pytest.raises(ValueError, match=r"images\[2\] must have 3 channels"):
        model.forward_packed([torch.randn(3, 8, 8), torch.randn(3, 8, 8), torch.randn(1, 8, 8)])
    with pytest.raises(ValueError, match=r"images\[0\] must be a tensor \[C, H, W\]"):
        model.forward_packed([torch.randn(1, 3, 8, 8)])
    with pytest.raises(ValueError, match=r"images\[1\].*dtype"):
        model.forward_packed([torch.randn(3, 8, 8), torch.randn(3, 8, 8, dtype=torch.float64)])
    with pytest.raises(TypeError, match="list"):
        model.forward_packed(torch.randn(2, 3, 8, 8))
