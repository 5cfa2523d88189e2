"""Saving and loading a timm ViT with cape inside: cape's loader gives the saved model back
(the same logits in eval and, with the same draws, in training), a stock timm load refuses the
state naming cape's loader, and what a stock load with strict=False loses is named when the
state is made.

The round trips go through files as users write them (torch.save of the state_dict,
safetensors, timm's save_for_hf folder) into a stock model of other weights. The stock
table's check is independent of cape's loader: stock timm's own forward reads it.
tests/conftest.py lets timm import beside a CPU-only torch with torchvision's CUDA wheel.
"""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path

import pytest
import torch

import cape
from cape.integrations.timm import (
    CAPE_KEY,
    add_rotary,
    cape_record,
    create_model,
    load_state_dict,
    remove_pos_embed,
    replace_pos_embed,
)

try:
    import timm
    from safetensors.torch import save_file
except (ImportError, RuntimeError) as error:  # RuntimeError: torchvision's C ops (conftest)
    pytest.skip(f"timm cannot be imported ({error}): pip install timm", allow_module_level=True)

NAME = "vit_tiny_patch16_224"
KW = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10,
          dynamic_img_size=True, reg_tokens=1)  # fmt: skip
INSTALLS = {
    "cape2d": lambda m: replace_pos_embed(m, "cape2d", preset="image"),
    "lff": lambda m: replace_pos_embed(m, "lff"),  # parameters of its own
    "rotary2d": lambda m: add_rotary(m, "rotary2d", max_global_scaling=1.4, max_global_shift=0.5),
    "rope-mixed": lambda m: add_rotary(m, "rope-mixed"),  # learned frequencies
    "rotary2d+pos_embed": lambda m: add_rotary(
        m, "rotary2d", drop_pos_embed=False, augmentation=cape.Augmentation(max_global_scaling=1.3)
    ),
    "sinpos2d+rope-axial": lambda m: [
        replace_pos_embed(m, "sinpos2d"),
        add_rotary(m, "rope-axial"),
    ],
    "remove_pos_embed": remove_pos_embed,
}
AUGMENTED = ("cape2d", "rotary2d", "rotary2d+pos_embed")  # CAPE's augmentation in train mode
SIZES = [(32, 32), (48, 40)]  # the training grid 4 x 4, and 6 x 5


def _stock(seed: int = 7, **options: object) -> torch.nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(NAME, **{**KW, **options})


def _saved(install: str) -> torch.nn.Module:
    """A model with cape installed and every weight moved off its initial value (cape's own
    parameters too: a load that skipped them would show)."""
    model = _stock(seed=1)
    INSTALLS[install](model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model.eval()


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what a stock load would lose: its own tests
        return model.state_dict()


def _logits(model: torch.nn.Module, size: tuple[int, int], train: bool = False) -> torch.Tensor:
    images = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(11)  # the same draws of CAPE's augmentation in train mode
    if getattr(model, "cape_rotary", None) is not None:
        model.cape_rotary.generator = torch.Generator().manual_seed(12)
    with torch.no_grad():
        return model.train(train)(images)


def _write(model: torch.nn.Module, how: str, folder: Path) -> tuple[str, dict]:
    """Save as users do -> (model_name, create_model's keywords) that load it again."""
    if how == "torch.save":
        torch.save(_state(model), folder / "model.pth")
        return NAME, {"checkpoint_path": folder / "model.pth", **KW}
    if how == "safetensors":
        save_file(_state(model), str(folder / "model.safetensors"))
        return NAME, {"checkpoint_path": str(folder / "model.safetensors"), **KW}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timm.models.save_for_hf(model, str(folder / "hf"), safe_serialization=True)
    return f"local-dir:{folder / 'hf'}", {}


@pytest.mark.parametrize("how", ["torch.save", "safetensors", "save_for_hf"])
@pytest.mark.parametrize("install", INSTALLS)
def test_save_and_load_give_the_same_logits(install: str, how: str, tmp_path: Path) -> None:
    model = _saved(install)
    name, kwargs = _write(model, how, tmp_path)
    loaded = create_model(timm.create_model, name, **kwargs)
    assert cape_record(loaded) == cape_record(model) is not None
    for size in SIZES:
        assert (_logits(loaded, size) - _logits(model, size)).abs().max() <= 1e-6
    # CAPE's augmentation came back too: the same draws give the same training forward
    train = _logits(model, SIZES[1], train=True)
    assert (_logits(loaded, SIZES[1], train=True) - train).abs().max() <= 1e-6
    if install in AUGMENTED:  # the augmentation moves something: the check can fail
        assert (_logits(model, SIZES[1]) - train).abs().max() > 1e-4


@pytest.mark.parametrize("install", ["cape2d", "rotary2d"])
def test_load_state_dict_makes_the_installs_on_a_stock_model(install: str) -> None:
    model = _saved(install)
    stock = _stock()
    result = load_state_dict(stock, _state(model))
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert stock.pos_embed is None and cape_record(stock) == cape_record(model)
    assert (_logits(stock, SIZES[1]) - _logits(model, SIZES[1])).abs().max() <= 1e-6
    again = load_state_dict(stock, _state(model))  # cape already there: loads as torch does
    assert again.missing_keys == [] and again.unexpected_keys == []


@pytest.mark.parametrize("install", INSTALLS)
def test_a_stock_timm_load_refuses_the_state_naming_cape_loader(
    install: str, tmp_path: Path
) -> None:
    model = _saved(install)
    state = _state(model)
    named = re.escape(CAPE_KEY)
    with pytest.raises(RuntimeError, match=named):
        _stock().load_state_dict(state)
    torch.save(state, tmp_path / "model.pth")
    with pytest.raises(RuntimeError, match=named):
        timm.create_model(NAME, checkpoint_path=str(tmp_path / "model.pth"), **KW)
    overlay = {"file": str(tmp_path / "model.pth"), "num_classes": KW["num_classes"]}
    with pytest.raises(RuntimeError, match=named):
        timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay=overlay, **KW)
    name, _ = _write(model, "save_for_hf", tmp_path)
    with pytest.raises(RuntimeError, match=named):
        timm.create_model(name, pretrained=True)
    assert "cape.integrations.timm.load_state_dict" in CAPE_KEY


def test_timm_adapting_a_head_loads_non_strictly_and_logs_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # timm's own choice: a checkpoint of another num_classes than its pretrained_cfg's loads
    # with strict=False; the key then stands in timm's warning log, and the save warned
    torch.save(_state(_saved("rotary2d")), tmp_path / "model.pth")
    with caplog.at_level("WARNING"):
        timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay={"file": str(
            tmp_path / "model.pth")}, **KW)  # fmt: skip
    assert CAPE_KEY in caplog.text


@pytest.mark.parametrize("install", ["cape2d", "lff"])
def test_a_stock_load_with_strict_false_computes_the_eval_model_at_the_training_size(
    install: str,
) -> None:
    model = _saved(install)
    with pytest.warns(UserWarning, match=f"loses the {install} encoding at image sizes other"):
        state = model.state_dict()
    stock = _stock()
    result = stock.load_state_dict(state, strict=False)
    assert CAPE_KEY in result.unexpected_keys and result.missing_keys == []
    # stock timm's own forward over the saved table: the same logits at the training size
    assert (_logits(stock, SIZES[0]) - _logits(model, SIZES[0])).abs().max() <= 1e-6
    # elsewhere timm resamples the table bicubically: what the warning says is lost
    assert (_logits(stock, SIZES[1]) - _logits(model, SIZES[1])).abs().max() > 1e-5


@pytest.mark.parametrize("install", ["rotary2d", "rope-mixed"])
def test_a_stock_load_of_a_rotary_state_is_warned_and_keeps_no_random_table(install: str) -> None:
    model = _saved(install)
    with pytest.warns(UserWarning, match=f"loses the 2-D rotary {install} of every attention"):
        state = model.state_dict()
    stock = _stock()
    stock.load_state_dict(state, strict=False)
    assert stock.pos_embed.abs().max() == 0.0  # prefix rows folded into the tokens, no patch rows
    assert torch.equal(stock.cls_token, model.cls_token)


def test_a_lone_remove_pos_embed_saves_a_zero_table_and_warns_of_nothing() -> None:
    model = _saved("remove_pos_embed")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = model.state_dict()
    stock = _stock()
    stock.load_state_dict(state, strict=False)
    for size in SIZES:  # zeros resample to zeros: the same model at every size
        assert (_logits(stock, size) - _logits(model, size)).abs().max() <= 1e-6


def test_another_model_refuses_the_state_by_name_strict_and_warns_otherwise() -> None:
    state = _state(_saved("cape2d"))
    model = _stock()
    add_rotary(model, "rotary2d")
    words = "Unexpected key.*saved from a model with .*cape2d.*this model has .*rotary2d"
    with pytest.raises(RuntimeError, match=words), pytest.warns(UserWarning, match="cape2d"):
        model.load_state_dict(state)
    with pytest.warns(UserWarning, match="saved from a model with .*cape2d"):
        result = model.load_state_dict(state, strict=False)
    assert len(result.unexpected_keys) == 1 and "this model has" in result.unexpected_keys[0]


def test_an_encoding_cape_cannot_make_again_is_named_and_loads_once_installed() -> None:
    model = _stock(seed=1)
    replace_pos_embed(model, cape.CAPE2d(64, fit_grid=(4, 4)))  # made without cape.build
    with pytest.warns(UserWarning, match="cape cannot make encoding CAPE2d .* again"):
        state = model.state_dict()
    stock = _stock()
    before = copy.deepcopy(stock.state_dict())
    with pytest.raises(ValueError, match="cape cannot make encoding CAPE2d"):
        load_state_dict(stock, state)
    assert cape_record(stock) is None and stock.pos_embed is not None
    assert all(torch.equal(v, stock.state_dict()[k]) for k, v in before.items())
    replace_pos_embed(stock, cape.CAPE2d(64, fit_grid=(4, 4)))  # as it was installed
    stock.load_state_dict(state)
    assert (_logits(stock, SIZES[1]) - _logits(model.eval(), SIZES[1])).abs().max() <= 1e-6


@pytest.mark.parametrize("break_state", ["head", "missing", "unexpected"])
def test_a_refused_load_leaves_the_stock_model_as_it_was(break_state: str) -> None:
    state = _state(_saved("rope-mixed"))
    stock = _stock(num_classes=5) if break_state == "head" else _stock()
    if break_state == "missing":
        del state["blocks.1.attn.cape_rotary.head_freqs"]
    if break_state == "unexpected":
        state["blocks.9.mlp.weight"] = torch.zeros(1)
    before = copy.deepcopy(stock.state_dict())
    hooks = [len(m._forward_hooks) for m in stock.modules()]
    word = {"head": "size mismatch for head.weight", "missing": "missing keys", "unexpected": "9"}
    with pytest.raises(RuntimeError, match=word[break_state]):
        load_state_dict(stock, state)
    assert cape_record(stock) is None and not hasattr(stock, "cape_rotary")
    assert [len(m._forward_hooks) for m in stock.modules()] == hooks
    assert stock.state_dict().keys() == before.keys()
    assert all(torch.equal(v, stock.state_dict()[k]) for k, v in before.items())


def test_a_stock_checkpoint_loads_through_cape_loader_as_torch_loads_it() -> None:
    stock_state = _stock(seed=2).state_dict()
    model = _stock()
    assert cape_record(stock_state) is None
    result = load_state_dict(model, stock_state)
    assert result.missing_keys == [] and cape_record(model) is None


def test_the_record_is_json_and_survives_a_parent_module() -> None:
    model = _saved("sinpos2d+rope-axial")
    record = cape_record(model)
    assert record == {
        "format": 1,
        "pos_embed": "removed",
        "encoding": {"name": "sinpos2d", "dim": 64, "options": {"fit_grid": [4, 4]}},
        "rotary": {"name": "rope-axial", "options": {"fit_grid": [4, 4]}},
    }
    parent, other = torch.nn.Module(), torch.nn.Module()
    parent.vit, other.vit = model, _stock()
    INSTALLS["sinpos2d+rope-axial"](other.vit)
    state = _state(parent)
    assert cape_record({CAPE_KEY: state[f"vit.{CAPE_KEY}"]}) == record
    assert other.load_state_dict(state).unexpected_keys == []
    assert (_logits(other.vit, SIZES[1]) - _logits(model, SIZES[1])).abs().max() <= 1e-6


def test_bad_arguments_are_refused_by_name(tmp_path: Path) -> None:
    model, state = _stock(), _state(_saved("cape2d"))
    cases = [
        (lambda: load_state_dict(state, model), TypeError, "model must be a timm .*OrderedDict"),
        (lambda: load_state_dict(model, "w.pth"), TypeError, "state_dict must be a mapping.*path"),
        (lambda: load_state_dict(model, state, strict="yes"), TypeError, "strict must be a bool"),
        (lambda: create_model("vit", NAME), TypeError, "factory must be timm.create_model"),
        (lambda: create_model(timm.create_model, 3), TypeError, "model_name must be a timm"),
        (lambda: create_model(timm.create_model, NAME), ValueError, "checkpoint_path must name"),
        (lambda: create_model(timm.create_model, NAME, checkpoint_path=tmp_path / "no.pth"),
         FileNotFoundError, "checkpoint_path: no file"),
        (lambda: create_model(timm.create_model, NAME, checkpoint_path=3), TypeError, "a path"),
        (lambda: create_model(timm.create_model, NAME, pretrained=True), ValueError, "pretrained"),
        (lambda: create_model(timm.create_model, f"local-dir:{tmp_path}"), FileNotFoundError,
         "holds none of"),
        (lambda: load_state_dict(model, {**state, CAPE_KEY: torch.zeros(3)}), ValueError,
         "uint8 tensor"),
    ]  # fmt: skip
    for call, kind, words in cases:
        with pytest.raises(kind, match=words) as error:
            call()
        assert "\n" not in str(error.value)
    assert cape_record(model) is None and model.pos_embed is not None


def test_a_vit_built_without_pos_embed_saves_no_table_and_names_the_loss() -> None:
    model = _stock(seed=1, pos_embed="none")
    replace_pos_embed(model, "cape2d", preset="image")
    assert cape_record(model)["pos_embed"] == "absent"
    with pytest.warns(UserWarning, match="loses the cape2d encoding .the model has no pos_embed"):
        state = model.state_dict()
    assert "pos_embed" not in state
    loaded = _stock(pos_embed="none")
    load_state_dict(loaded, state)
    assert (_logits(loaded, SIZES[1]) - _logits(model.eval(), SIZES[1])).abs().max() <= 1e-6


@pytest.mark.parametrize(
    "record",
    [
        b"not json",
        b'{"format": 2, "pos_embed": "removed", "encoding": null, "rotary": null}',
        b'{"format": 1, "pos_embed": "gone", "encoding": null, "rotary": null}',
        b'{"format": 1, "pos_embed": "removed", "encoding": {"name": "cape2d"}, "rotary": null}',
        b'{"format": 1, "pos_embed": "kept", "encoding": null}',
    ],
)
def test_a_damaged_record_is_named_before_the_model_changes(record: bytes) -> None:
    state = _state(_saved("cape2d"))
    state[CAPE_KEY] = torch.tensor(list(record), dtype=torch.uint8)
    stock = _stock()
    with pytest.raises(ValueError, match="cape \\(load with"):
        load_state_dict(stock, state)
    assert cape_record(stock) is None and stock.pos_embed is not None


def test_a_fixed_size_vit_loses_no_other_size_and_warns_only_of_the_augmentation() -> None:
    plain, augmented = _stock(dynamic_img_size=False), _stock(dynamic_img_size=False)
    replace_pos_embed(plain, "sinpos2d")
    replace_pos_embed(augmented, "cape2d", preset="image")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stock timm computes the same at the one size it takes
        state = plain.state_dict()
    with pytest.warns(UserWarning, match="loses the cape2d encoding's training-time") as caught:
        augmented.state_dict()
    assert "other than" not in str(caught[0].message)
    stock = _stock(dynamic_img_size=False)
    stock.load_state_dict(state, strict=False)
    assert (_logits(stock, SIZES[0]) - _logits(plain.eval(), SIZES[0])).abs().max() <= 1e-6
