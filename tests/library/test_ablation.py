"""cape.models.without_positions: a model with its positions taken out is its nopos twin.

The reference is built independently: the same model class made with position="nopos" by the
position plan, holding the trained model's content weights (every parameter the twin has).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from cape.models import CausalLM, CTCModel, Seq2Seq, TransformerEncoder, ViT, without_positions

D, H, V = 32, 4, 11


def _vit(position: str) -> nn.Module:
    return ViT(3, position=position, image_size=16, patch=4, dim=D, depth=2, heads=H, channels=1)


def _ctc(position: str) -> nn.Module:
    return CTCModel(V, position=position, n_mels=8, dim=D, depth=2, heads=H, ffn_dim=2 * D)


def _mt(position: str) -> nn.Module:
    return Seq2Seq(V, position=position, dim=D, encoder_layers=1, decoder_layers=2, heads=H,
                   ffn_dim=2 * D)  # fmt: skip


def _lm(position: str) -> nn.Module:
    return CausalLM(V, position=position, dim=D, layers=2, heads=H, ffn_dim=2 * D)


def _stack(position: str) -> nn.Module:
    return TransformerEncoder(2, D, H, 2 * D, position=position)


def _run(kind: str, model: nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if kind == "vit":
        return model(torch.randn(2, 1, 16, 16, generator=g))
    if kind == "ctc":
        return model(torch.randn(2, 30, 8, generator=g))[0]
    if kind == "stack":
        return model(torch.randn(2, 9, D, generator=g))
    tokens = torch.randint(3, V, (2, 9), generator=g)
    if kind == "lm":
        return model(tokens)
    mask = torch.ones(2, 9, dtype=torch.bool)
    return model(tokens, mask, tokens, mask)


MAKERS: dict[str, Callable[[str], nn.Module]] = {
    "vit": _vit, "ctc": _ctc, "mt": _mt, "lm": _lm, "stack": _stack,
}  # fmt: skip
CASES = [
    ("vit", "cape2d"), ("vit", "abspos2d"), ("vit", "rotary2d"),
    ("ctc", "cape1d"), ("ctc", "rotary"), ("ctc", "alibi"), ("ctc", "relpos"),
    ("mt", "sinpos"), ("mt", "abspos"), ("mt", "relpos"), ("mt", "rotary"),
    ("lm", "rotary"), ("lm", "alibi"), ("lm", "fire"), ("lm", "cape1d"),
    ("stack", "rotary"), ("stack", "sinpos"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "position"), CASES)
def test_taken_out_equals_the_nopos_twin(kind: str, position: str) -> None:
    torch.manual_seed(0)
    model = MAKERS[kind](position).eval()
    twin = MAKERS[kind]("nopos").eval()
    state = model.state_dict()
    twin.load_state_dict({k: state[k] for k in twin.state_dict()})  # the content weights
    with torch.no_grad():
        before = _run(kind, model)
        with without_positions(model) as had:
            blind = _run(kind, model)
        after = _run(kind, model)
        want = _run(kind, twin)
    assert had
    torch.testing.assert_close(blind, want)
    assert not torch.allclose(blind, before, atol=1e-4)  # the positions did something
    torch.testing.assert_close(after, before, rtol=0, atol=0)  # and are back


def test_a_model_without_positions_has_none_to_take() -> None:
    model = _lm("nopos").eval()
    with without_positions(model) as had:
        assert not had


def test_positions_come_back_after_an_error() -> None:
    model = _ctc("rotary")
    rotary = [m.rotary for m in model.modules() if hasattr(m, "rotary")]
    with pytest.raises(RuntimeError), without_positions(model):
        raise RuntimeError("evaluation failed")
    assert [m.rotary for m in model.modules() if hasattr(m, "rotary")] == rotary
    assert all(r is not None for r in rotary)
