"""Saving and loading a transformers model that cape changed: transformers' own save_pretrained,
then a stock from_pretrained (which reproduces what transformers can express, or refuses naming
cape's loader) and `cape.integrations.hf.from_pretrained` (which makes everything again).
Refusals name the object, and a refused install leaves the model as it was."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import cape
from cape.integrations import hf

transformers = pytest.importorskip("transformers")
T = transformers
ROUND_TRIP = 1e-6


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=96,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, pad_token_id=0,
    )  # fmt: skip
    return T.LlamaForCausalLM(config).eval()


def _bert() -> torch.nn.Module:
    torch.manual_seed(0)
    return T.BertModel(T.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)).eval()  # fmt: skip


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    return T.GPT2LMHeadModel(T.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=16, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0)).eval()  # fmt: skip


def _opt() -> torch.nn.Module:
    torch.manual_seed(0)
    return T.OPTForCausalLM(T.OPTConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2,
        max_position_embeddings=16, word_embed_proj_dim=32, dropout=0.0, attention_dropout=0.0,
        pad_token_id=1)).eval()  # fmt: skip


def _out(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        y = model(input_ids=ids)
    return y.logits if hasattr(y, "logits") else y.last_hidden_state


def _ids(length: int = 12) -> torch.Tensor:
    return torch.randint(2, 64, (2, length), generator=torch.Generator().manual_seed(1))


def _save(model: torch.nn.Module, folder) -> list[str]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model.save_pretrained(folder)
    return [str(w.message) for w in seen if "cape" in str(w.message)]


# -- RoPE models --------------------------------------------------------------------------------


def test_llama_pi_survives_a_stock_load(tmp_path) -> None:
    model = hf.install_rotary(_llama(), cape.Rotary(16, base=500.0, scaling="pi", factor=2.0))
    assert model.config.rope_parameters == {"rope_type": "linear", "rope_theta": 500.0,
                                            "factor": 2.0}  # fmt: skip
    ids, want = _ids(40), None
    want = _out(model, ids)
    assert not _save(model, tmp_path)  # nothing a stock load would lose
    stock = T.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert float((_out(stock, ids) - want).abs().max()) <= ROUND_TRIP
    again = hf.from_pretrained(T.LlamaForCausalLM, tmp_path).eval()
    assert float((_out(again, ids) - want).abs().max()) <= ROUND_TRIP


@pytest.mark.parametrize("scaling", ["yarn-hf", "yarn"])
def test_llama_yarn_round_trips(tmp_path, scaling: str) -> None:
    """transformers' YaRN is a config a stock load reproduces; the paper's is not: the stock
    load refuses naming cape's loader, which makes it again."""
    rotary = cape.Rotary(16, base=500.0, scaling=scaling, factor=4.0, train_length=24.0)
    model = hf.install_rotary(_llama(), rotary)
    ids = _ids(40)
    want = _out(model, ids)
    _save(model, tmp_path)
    if scaling == "yarn-hf":
        stock = T.LlamaForCausalLM.from_pretrained(tmp_path).eval()
        assert float((_out(stock, ids) - want).abs().max()) <= ROUND_TRIP
    else:
        with pytest.raises(KeyError, match="cape.integrations.hf.from_pretrained"):
            T.LlamaForCausalLM.from_pretrained(tmp_path)
    again = hf.from_pretrained(T.LlamaForCausalLM, tmp_path).eval()
    assert float((_out(again, ids) - want).abs().max()) <= ROUND_TRIP


# -- position tables ----------------------------------------------------------------------------


@pytest.mark.parametrize(("make", "cls"), [(_bert, "BertModel"), (_gpt2, "GPT2LMHeadModel"),
                                           (_opt, "OPTForCausalLM")])  # fmt: skip
def test_a_table_model_with_cape1d_round_trips(tmp_path, make, cls: str) -> None:
    model = make()
    encoding = cape.build("cape1d", 32, preset="text")  # augmented in training
    hf.install_positions(model, encoding, max_length=40)
    model.eval()
    ids = _ids(12)
    want, longer = _out(model, ids), _ids(30)  # 30 > the stock table of 16 rows
    lost = _save(model, tmp_path)
    assert lost and "training-time augmentation" in lost[0]  # named when saved
    stock = getattr(T, cls).from_pretrained(tmp_path).eval()  # the stock table: never random
    assert float((_out(stock, ids) - want).abs().max()) <= ROUND_TRIP
    assert float((_out(stock, longer) - _out(model, longer)).abs().max()) <= ROUND_TRIP
    again = hf.from_pretrained(getattr(T, cls), tmp_path).eval()
    assert float((_out(again, ids) - want).abs().max()) <= ROUND_TRIP
    tables = [m for m in again.modules() if isinstance(m, hf.PositionEmbedding)]
    assert tables and tables[0].encoding.augmentation == encoding.augmentation


def test_a_learned_cape_table_keeps_its_trained_rows(tmp_path) -> None:
    model = _bert()
    hf.install_positions(model, cape.build("abspos", 32, num_positions=16))
    table = next(m for m in model.modules() if isinstance(m, hf.PositionEmbedding))
    with torch.no_grad():
        for p in table.encoding.parameters():
            p.add_(1.0)  # trained: not the initialisation any more
    ids = _ids(12)
    want = _out(model, ids)
    _save(model, tmp_path)
    again = hf.from_pretrained(T.BertModel, tmp_path).eval()
    assert float((_out(again, ids) - want).abs().max()) <= ROUND_TRIP


def test_the_position_hook_is_recorded_and_made_again(tmp_path) -> None:
    model = _llama()
    aug = cape.Augmentation(max_global_shift=3.0, max_local_shift=0.5)
    handle = hf.augment_position_ids(model, aug)
    assert model.config.cape["augment_position_ids"] == aug.as_mapping()
    lost = _save(model, tmp_path)
    assert any("is a hook, not a weight" in m for m in lost)
    again = hf.from_pretrained(T.LlamaForCausalLM, tmp_path)
    ids = _ids(12)
    again.train()
    draws = [again(input_ids=ids).logits for _ in range(2)]
    assert float((draws[0] - draws[1]).abs().max()) > 1e-4  # the hook draws in training
    handle.remove()
    assert "augment_position_ids" not in (model.config.cape or {})


# -- refusals --------------------------------------------------------------------------------


def test_augmenting_ids_that_index_a_table_is_refused_at_install() -> None:
    for make, where in ((_bert, "embeddings.position_embeddings"), (_gpt2, "transformer.wpe")):
        model = make()
        with pytest.raises(ValueError, match=f"indexes a learned table.*{where}"):
            hf.augment_position_ids(model, cape.Augmentation(max_local_shift=0.5))
        assert not model._forward_pre_hooks  # nothing installed


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda m: hf.install_rotary(m.state_dict(), cape.Rotary(16)),
            "got OrderedDict \\(a state_dict",
        ),
        (lambda m: hf.install_rotary("llama", cape.Rotary(16)), "got str"),
        (lambda m: hf.install_positions("bert", cape.build("sinpos", 32)), "got str"),
        (lambda m: hf.augment_position_ids(m.config, cape.Augmentation()), "a config"),
        (
            lambda m: hf.augmented_position_ids(
                cape.Augmentation(max_local_shift=0.5), position_ids=[[0, 1, 2]]
            ),
            "position_ids must be",
        ),
    ],  # fmt: skip
)
def test_non_models_are_refused_by_name(call, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        call(_llama())


@pytest.mark.parametrize("bad", [0, -1, "64", True, 2.5])
def test_a_refused_install_leaves_the_model_as_it_was(bad: object) -> None:
    model = _bert()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="max_length must be None or a positive int"):
        hf.install_positions(model, cape.build("sinpos", 32), max_length=bad)  # type: ignore[arg-type]
    assert isinstance(model.embeddings.position_embeddings, torch.nn.Embedding)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_a_training_input_past_the_buffer_names_max_length() -> None:
    model = hf.install_positions(_bert(), cape.build("sinpos", 32)).train()
    with pytest.raises(ValueError, match="max_length=30"):
        model(input_ids=_ids(30))
