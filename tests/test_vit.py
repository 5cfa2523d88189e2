"""cape.models.vit.ViT: every position name, resizing, determinism, augmentation, training."""

from __future__ import annotations

import pytest
import torch

from cape.models.vit import VIT_POSITIONS, ViT

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
    torch.testing.assert_close(tokens[:, 1:] - patches, model.position.table.flatten(0, 1)[None].expand(2, -1, -1))
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
    model = ViT(2, image_size=16, patch=4, dim=32, depth=2, heads=2, mlp_ratio=2,
                position=position, channels=1)
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
