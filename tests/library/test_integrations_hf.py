"""cape.integrations.hf against the real transformers: tiny models built from config objects
(nothing is downloaded), each compared with the stock model or HF's own rotary numbers."""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys

import pytest
import torch

import cape
from cape.integrations import hf

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face integration is tested against transformers"
)
from transformers.models.llama import modeling_llama  # noqa: E402

HEAD = 16  # hidden 32 over 2 heads
THETA = 500.0
ATOL = 1e-5
# YaRN with a ramp that holds no channel (HF truncates it to whole channels, cape's is the
# paper's ramp over r = L / wavelength: they agree when no channel lies strictly inside it):
# r of channels 0, 1 over L = 24 is 3.8, 1.76 (> beta_fast = 1.5: kept), channel 2's 0.81 (< 1)
YARN_NARROW = dict(
    rope_type="yarn", factor=4.0, original_max_position_embeddings=24, beta_fast=1.5, beta_slow=1.0
)


def llama(rope_scaling: dict | None = None, seed: int = 0, **config) -> torch.nn.Module:
    """A 2-layer Llama, hidden 32, head 16, in eval mode; the same seed gives the same weights."""
    options = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=96,
        rope_theta=THETA,
        rope_scaling=rope_scaling,
        pad_token_id=0,
    )
    options.update(config)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**options)).eval()


def bert(**config) -> torch.nn.Module:
    """A 2-layer BERT, hidden 32, table of 16 positions, no dropout, in eval mode."""
    options = dict(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    options.update(config)
    torch.manual_seed(0)
    return transformers.BertModel(transformers.BertConfig(**options)).eval()


def tokens(batch: int = 2, length: int = 40, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, 64, (batch, length), generator=torch.Generator().manual_seed(seed))


def cos_sin(model: torch.nn.Module, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.arange(length)[None].expand(2, length)
    return model.model.rotary_emb(torch.zeros(1), positions)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max())


# --- the library does not pull transformers in ------------------------------------------------


def test_import_does_not_load_transformers() -> None:
    code = (
        "import json, sys\nimport cape.integrations.hf\n"
        "print(json.dumps([m for m in sys.modules if m.split('.')[0] == 'transformers']))\n"
        "print(cape.integrations.hf.install_rotary.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, name = out.stdout.splitlines()
    assert json.loads(loaded) == [] and name == "install_rotary"


# --- rotary: the layout, the scalings, HF's own numbers ----------------------------------------


@pytest.mark.parametrize("scaling", [None, "pi", "ntk", "yarn"])
def test_cos_sin_in_hf_rotate_half_equal_cape_rotation(scaling: str | None) -> None:
    # HF's apply_rotary_pos_emb with the adapter's cos/sin against cape.Rotary's own forward:
    # the half-split layout, and YaRN's temperature on q and k
    options = {} if scaling is None else dict(scaling=scaling, factor=3.0, train_length=8.0)
    rotary = cape.Rotary(HEAD, base=THETA, **options)
    q, k = torch.randn(2, 2, 12, HEAD), torch.randn(2, 2, 12, HEAD)
    positions = torch.arange(12.0)[None].expand(2, 12) * 1.5 + 0.25  # floats: CAPE's
    cos, sin = hf.RotaryEmbedding(rotary)(q, positions)
    q_hf, k_hf = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    q_cape, k_cape = rotary(q, k, positions=positions)
    assert max_err(q_hf, q_cape) < 1e-5 and max_err(k_hf, k_cape) < 1e-5
    assert max_err(q_hf, q) > 0.1  # the rotation did something


CASES = {
    "default": (None, dict()),
    "linear": (dict(rope_type="linear", factor=4.0), dict(scaling="pi", factor=4.0)),
    "yarn": (
        YARN_NARROW,
        dict(
            scaling="yarn-hf",
            factor=4.0,
            train_length=24.0,
            scaling_options={"beta_fast": 1.5, "beta_slow": 1.0},
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_the_stock_models(case: str) -> None:
    rope_scaling, options = CASES[case]
    stock, ours = llama(rope_scaling), llama(rope_scaling)
    by_hand = cape.Rotary(HEAD, base=THETA, **options)
    mapped = hf.rotary_from_config(stock.config)
    assert repr(mapped) == repr(by_hand)  # the config's mapping is the one written by hand
    hf.install_rotary(ours, by_hand)
    assert ours.model.rotary_emb.attention_scaling == pytest.approx(
        stock.model.rotary_emb.attention_scaling,
        rel=1e-7,  # cape's factors are float32
    )
    for a, b in zip(cos_sin(stock, 80), cos_sin(ours, 80), strict=True):
        assert max_err(a, b) < 5e-6  # positions up to 79 in float32
    ids = tokens(length=40)
    assert max_err(stock(ids).logits, ours(ids).logits) < ATOL


def test_ntk_equals_hf_dynamic_at_the_length_it_scales_to() -> None:
    # HF's "dynamic" NTK at length L > max uses base * s^(hd/(hd-2)) with
    # s = factor * L / max - (factor - 1): cape's static NTK with that factor
    length, table, factor = 24, 16, 2.0
    scaling = dict(rope_type="dynamic", factor=factor)
    stock = llama(scaling, max_position_embeddings=table)
    ours = llama(scaling, max_position_embeddings=table)
    s = factor * length / table - (factor - 1)
    hf.install_rotary(ours, cape.Rotary(HEAD, base=THETA, scaling="ntk", factor=s))
    ids = tokens(length=length)
    assert max_err(stock(ids).logits, ours(ids).logits) < ATOL
    assert max_err(stock.model.rotary_emb.inv_freq, ours.model.rotary_emb.rotary.angles(
        torch.ones(1, 1))[0, 0]) < 1e-6  # fmt: skip


def test_the_papers_yarn_agrees_with_hf_outside_its_ramp_only() -> None:
    # beta 32 / 1 (the defaults): cape's scaling="yarn" is the paper's ramp, over r = L_train /
    # wavelength; transformers' (what its configs convert to: "yarn-hf") is linear in the
    # channel index, truncated to whole channels and clamped at channel 0. Channels with
    # r <= 1 (interpolated) or r >= 32 (kept) agree; here channels 0, 1 (r = 3.8, 1.8) lie
    # inside the paper's ramp and HF keeps channel 0 whole: they differ
    scaling = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=24)
    stock = llama(scaling)
    mapped = hf.rotary_from_config(stock.config)
    assert mapped.scaling == "yarn-hf"
    assert hf.RotaryEmbedding(mapped).attention_scaling == pytest.approx(
        stock.model.rotary_emb.attention_scaling, rel=1e-6
    )
    theirs = stock.model.rotary_emb.inv_freq
    assert torch.allclose(mapped.angles(torch.ones(1, 1))[0, 0], theirs, rtol=1e-6)
    paper = cape.Rotary(HEAD, base=THETA, scaling="yarn", factor=4.0, train_length=24.0)
    mine = paper.angles(torch.ones(1, 1))[0, 0]
    omega = cape.functional.sinusoid_frequencies(HEAD, base=THETA)
    r = 24 * omega / (2 * math.pi)
    outside = (r <= 1) | (r >= 32)
    assert outside.sum() == HEAD // 2 - 2
    assert torch.allclose(mine[outside], theirs[outside], rtol=1e-6)
    assert not torch.allclose(mine[~outside], theirs[~outside], rtol=0.1)


@pytest.mark.parametrize(
    ("rotary", "match"),
    [
        (cape.Rotary(HEAD, xpos=True), "xPos cannot be carried"),
        (cape.Rotary(HEAD, augmentation=cape.Augmentation(max_local_shift=0.5)), "augment_"),
        (cape.Rotary(HEAD, scaling="pi", train_length=16.0), "fixed factor"),
        (cape.Rotary(8), "head_dim=8"),
    ],
    ids=["xpos", "augmentation", "per-call-factor", "head-dim"],
)
def test_what_cannot_be_carried_is_refused(rotary: cape.Rotary, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        hf.install_rotary(llama(), rotary)


def test_configs_and_models_outside_the_mapping_are_refused() -> None:
    config = llama().config
    config.rope_parameters = {**config.rope_parameters, "rope_type": "not-a-rope"}
    with pytest.raises(ValueError, match="rope_type must be one of"):
        hf.rotary_from_config(config)
    with pytest.raises(ValueError, match="no `rotary_emb`"):
        hf.install_rotary(bert(), cape.Rotary(HEAD))
    with pytest.raises(ValueError, match="no position table"):
        hf.install_positions(llama(), cape.build("sinpos", 32))


# --- KV cache and generate ----------------------------------------------------------------------


def _cache_of(output: object) -> object:
    cache = getattr(output, "cache", None)  # transformers >= 5.24; past_key_values before
    return cache if cache is not None else output.past_key_values


def test_incremental_decoding_equals_a_full_pass() -> None:
    model = hf.install_rotary(llama(YARN_NARROW), hf.rotary_from_config(llama(YARN_NARROW).config))
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids = tokens(length=36)
    full = model(ids).logits
    out = model(ids[:, :30], use_cache=True)
    steps = [out.logits]
    for t in range(30, 36):
        out = model(ids[:, t : t + 1], use_cache=True, **{kw: _cache_of(out)})
        steps.append(out.logits)
    assert max_err(torch.cat(steps, dim=1), full) < ATOL


def test_generate_with_the_adapter_and_the_hook_equals_stock() -> None:
    ids, mask = tokens(length=6), torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # a left-padded prompt
    kwargs = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    stock = llama().generate(ids, **kwargs)
    ours = hf.install_rotary(llama(), cape.Rotary(HEAD, base=THETA))
    hooked = llama()
    hf.augment_position_ids(hooked, cape.Augmentation(max_global_shift=5.0, max_local_shift=0.5))
    assert stock.shape == (2, 11)
    assert torch.equal(ours.generate(ids, **kwargs), stock)
    assert torch.equal(hooked.generate(ids, **kwargs), stock)  # eval: the hook is off
    hooked.train()
    with pytest.raises(ValueError, match="non-empty KV cache"):
        hooked.generate(ids, **kwargs)


# --- CAPE's augmentation of position_ids -------------------------------------------------------


def test_training_draws_differ_and_eval_is_the_stock_model() -> None:
    model, stock = llama(), llama()
    aug = cape.Augmentation(max_global_shift=5.0, max_local_shift=0.5, max_global_scaling=1.2)
    handle = hf.augment_position_ids(model, aug)
    hf.install_rotary(model, cape.Rotary(HEAD, base=THETA))
    ids = tokens(length=20)
    model.train()
    first, second = model(input_ids=ids).logits, model(input_ids=ids).logits
    assert max_err(first, second) > 1e-4
    model.eval()
    assert max_err(model(input_ids=ids).logits, stock(ids).logits) < ATOL
    model.train()
    handle.remove()
    assert max_err(model(input_ids=ids).logits, stock(ids).logits) < ATOL


def _positions_seen(model: torch.nn.Module) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []

    def record(module, args, kwargs, output):
        seen.append(kwargs["position_ids"] if "position_ids" in kwargs else args[1])

    model.model.rotary_emb.register_forward_hook(record, with_kwargs=True)
    return seen


def test_left_padding_moves_no_real_token() -> None:
    # the same sample with 0 and 3 pads on the left, the same generator seed: a global shift and
    # scaling per sample, so the real tokens' augmented positions must be equal; pads get 0
    aug = cape.Augmentation(max_global_shift=5.0, max_global_scaling=1.5)
    ids = tokens(batch=1, length=7)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 7, dtype=torch.long)], 1)
    got = []
    for inputs, attention in ((ids, torch.ones_like(ids)), (padded, mask)):
        model = llama()
        seen = _positions_seen(model)
        hf.augment_position_ids(model, aug, generator=torch.Generator().manual_seed(7))
        model.train()(input_ids=inputs, attention_mask=attention)
        got.append(seen[-1])
    plain, left = got
    assert left.is_floating_point() and torch.equal(left[:, :3], torch.zeros(1, 3))
    assert torch.equal(left[:, 3:], plain)
    steps = plain[0, 1:] - plain[0, :-1]  # one scale for the sample: equal steps, not 1
    assert torch.allclose(steps, steps[0].expand_as(steps)) and abs(float(steps[0]) - 1) > 1e-3


def test_local_shifts_stay_within_their_bounds_and_pads_are_zero() -> None:
    aug = cape.Augmentation(max_global_shift=2.0, max_local_shift=0.5)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, 6:] = 0
    pos = hf.augmented_position_ids(aug, mask, generator=torch.Generator().manual_seed(0))
    counted = (mask.cumsum(1) - 1).clamp(min=0).float()
    real = mask.bool()
    assert torch.equal(pos[~real], torch.zeros(int((~real).sum())))
    assert float((pos - counted)[real].abs().max()) <= 2.5
    assert float((pos - counted)[real].abs().max()) > 0


def test_augmentation_options_outside_a_causal_lm_are_refused() -> None:
    with pytest.raises(ValueError, match="normalize=True"):
        hf.augment_position_ids(llama(), cape.Augmentation(normalize=True))
    with pytest.raises(ValueError, match="attention_mask must be"):
        hf.augmented_position_ids(cape.Augmentation(), torch.ones(1, 1, 4, 4))
    with pytest.raises(TypeError, match="augmentation must be a cape.Augmentation"):
        hf.augmented_position_ids({"max_global_shift": 1.0}, torch.ones(1, 4))


# --- BERT-style position tables -------------------------------------------------------------------


def test_bert_with_sinpos_equals_the_table_holding_the_same_sinusoids() -> None:
    stock, ours = bert(), bert()
    with torch.no_grad():
        positions = torch.arange(16.0)[None, :, None]
        stock.embeddings.position_embeddings.weight.copy_(
            cape.build("sinpos", 32)(positions=positions)[0]
        )
    hf.install_positions(ours, cape.build("sinpos", 32))
    ids, mask = tokens(length=12), torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    a = stock(ids, attention_mask=mask).last_hidden_state
    b = ours(ids, attention_mask=mask).last_hidden_state
    assert max_err(a, b) < ATOL
    assert max_err(a, bert()(ids, attention_mask=mask).last_hidden_state) > 1e-3  # can fail


def test_bert_reads_inputs_longer_than_its_table() -> None:
    long = tokens(length=40)
    with pytest.raises(RuntimeError):  # the stock buffer of 16 positions stops it
        bert()(long)
    model = hf.install_positions(bert(), cape.build("sinpos", 32), max_length=64)
    out = model(long).last_hidden_state
    assert out.shape == (2, 40, 32) and bool(torch.isfinite(out).all())
    # the table is continuous: the first 16 rows of a long call are those of a short one
    table = model.embeddings.position_embeddings
    rows = table(torch.arange(40)[None])
    assert max_err(rows[:, :16], table(torch.arange(16)[None])) < 1e-6
    assert max_err(rows[:, 16:32], rows[:, :16]) > 0.1  # new positions, not a wrapped table


def test_bert_cape1d_draws_per_sample_in_training_and_not_in_eval() -> None:
    model = hf.install_positions(bert(), cape.build("cape1d", 32, preset="text"))
    table = model.embeddings.position_embeddings
    seen: list[torch.Tensor] = []
    table.register_forward_hook(lambda module, args, out: seen.append(out))
    ids = tokens(batch=2, length=10)
    same = torch.cat([ids[:1], ids[:1]])  # two copies of one sample
    model.train()
    first, second = model(same).last_hidden_state, model(same).last_hidden_state
    assert max_err(first, second) > 1e-3
    assert seen[-1].shape == (2, 10, 32) and max_err(seen[-1][0], seen[-1][1]) > 1e-3
    model.eval()
    assert max_err(model(same).last_hidden_state, model(same).last_hidden_state) == 0.0
    assert seen[-1].shape[0] == 1  # BERT's [1, T] position ids, one table for the batch
    with pytest.raises(ValueError, match="normalize=True would count padding"):
        hf.PositionEmbedding(cape.build("cape1d", 32, preset="audio"))
    with pytest.raises(ValueError, match="D=32"):
        hf.install_positions(bert(), cape.build("sinpos", 16))


def test_position_table_follows_the_models_dtype() -> None:
    model = hf.install_positions(bert(), cape.build("sinpos", 32)).to(torch.float64)
    out = model.embeddings.position_embeddings(torch.arange(5)[None])
    assert out.dtype == torch.float64 and math.isfinite(float(out.sum()))
