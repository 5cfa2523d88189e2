"""Every rope type of transformers as a cape.Rotary, against the stock model of its family:
cape installed from the config gives the stock logits (fp32, eval), and the reverse conversion
writes the config's own rope parameters back. Tiny models built from config objects."""

from __future__ import annotations

import pytest
import torch

import cape
from cape.integrations import hf

transformers = pytest.importorskip("transformers")
T = transformers

ATOL = 1e-5
HF_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}  # transformers' YaRN
SHORT, LONG = 12, 40  # LONG passes every original / maximum length below


def _decoder(**extra: object) -> dict:
    return dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                pad_token_id=0, **extra)  # fmt: skip


def _rope(**params: object) -> dict:
    return {"rope_parameters": {"rope_theta": 500.0, **params}}


LONGROPE = dict(
    rope_type="longrope",
    short_factor=[1.0, 1.1, 1.3, 1.5, 2.0, 2.5, 3.0, 4.0],
    long_factor=[1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
    original_max_position_embeddings=16,
)
FAMILIES = {
    "llama default": (T.LlamaConfig, T.LlamaForCausalLM, _decoder(**_rope())),
    "llama linear": (T.LlamaConfig, T.LlamaForCausalLM,
                     _decoder(**_rope(rope_type="linear", factor=4.0))),
    "llama dynamic": (T.LlamaConfig, T.LlamaForCausalLM,
                      _decoder(**_rope(rope_type="dynamic", factor=2.0))),
    "llama yarn": (T.LlamaConfig, T.LlamaForCausalLM, _decoder(**_rope(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=16))),
    "llama yarn mscale (DeepSeek)": (T.LlamaConfig, T.LlamaForCausalLM, _decoder(**_rope(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=16, mscale=1.0,
        mscale_all_dim=0.5))),
    "llama yarn attention_factor, no truncate": (T.LlamaConfig, T.LlamaForCausalLM, _decoder(
        **_rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
                truncate=False, attention_factor=1.3))),
    "llama3": (T.LlamaConfig, T.LlamaForCausalLM, _decoder(**_rope(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16))),
    "mistral": (T.MistralConfig, T.MistralForCausalLM, _decoder()),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, _decoder()),
    "phi3 longrope": (T.Phi3Config, T.Phi3ForCausalLM, _decoder(
        **_rope(**LONGROPE), original_max_position_embeddings=16) | {
        "max_position_embeddings": 64}),
    "gpt-neox partial rotary": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM, dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=64, rotary_pct=0.5)),
    "gemma3 per-layer rope": (T.Gemma3TextConfig, T.Gemma3ForCausalLM, dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
        sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0,
                                            "rope_theta": 1000.0}})),
}  # fmt: skip


def _pair(case: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    config_cls, model_cls, options = FAMILIES[case]
    made = []
    for _ in range(2):
        torch.manual_seed(0)
        made.append(model_cls(config_cls(**options)).eval())
    return made[0], made[1]


def _ids(length: int) -> torch.Tensor:
    return torch.randint(1, 64, (2, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", list(FAMILIES))
def test_cape_from_the_config_gives_the_stock_logits(case: str) -> None:
    stock, ours = _pair(case)
    rotary = hf.rotary_from_config(ours.config)
    hf.install_rotary(ours, rotary)
    kinds = {type(m).__name__ for m in ours.modules() if type(m).__name__.endswith("Embedding")}
    assert "RotaryEmbedding" in kinds  # cape's adapter, and no stock rotary left
    assert not {k for k in kinds if k.endswith("RotaryEmbedding") and k != "RotaryEmbedding"}
    with torch.no_grad():
        for length in (SHORT, LONG):  # both sides of every original length (longrope, dynamic)
            ids = _ids(length)
            err = float((stock(ids).logits - ours(ids).logits).abs().max())
            assert err <= ATOL, (case, length, err)


@pytest.mark.parametrize("case", list(FAMILIES))
def test_the_reverse_writes_the_configs_rope_parameters(case: str) -> None:
    stock, _ = _pair(case)
    config = stock.config
    rotary = hf.rotary_from_config(config)
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rotaries = rotary if isinstance(rotary, dict) else {"": rotary}
    given = config.rope_parameters
    for key, rot in rotaries.items():
        want = given[key] if key else given
        back = hf.rope_parameters(rot, head_dim=head)
        for name, value in back.items():
            if name not in want:  # written out where transformers takes a default or derives it
                assert name in ("factor", "partial_rotary_factor") or (
                    HF_DEFAULTS[name] == value
                ), (case, name)
                continue
            assert want[name] == pytest.approx(value), (case, name)
        assert back["rope_type"] == want["rope_type"]


def test_the_papers_forms_are_not_transformers_and_say_so() -> None:
    with pytest.raises(ValueError, match="scaling='yarn' \\(its YaRN is scaling='yarn-hf'\\)"):
        hf.rope_parameters(cape.Rotary(16, scaling="yarn", factor=2.0, train_length=16.0))
    with pytest.raises(ValueError, match="scaling='ntk'"):
        hf.rope_parameters(cape.Rotary(16, scaling="ntk", factor=2.0))
    with pytest.raises(ValueError, match="freq_scale=30.0"):
        hf.rope_parameters(cape.Rotary(16, freq_scale=30.0))
    with pytest.raises(ValueError, match="xPos"):
        hf.rope_parameters(cape.Rotary(16, xpos=True))


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (None, TypeError, "config must be a transformers PretrainedConfig.*NoneType"),
        ("meta-llama/Llama-3.2-1B", TypeError, "config must be .*got str"),
        ({"rope_theta": 1.0}, TypeError, "config must be .*got dict"),
    ],
)
def test_rotary_from_config_refuses_what_is_not_a_config(value, error, match) -> None:
    with pytest.raises(error, match=match):
        hf.rotary_from_config(value)


def test_rotary_from_config_names_a_model_and_a_config_without_rope() -> None:
    stock, _ = _pair("llama default")
    with pytest.raises(TypeError, match="got the model LlamaForCausalLM: pass model.config"):
        hf.rotary_from_config(stock)
    with pytest.raises(ValueError, match="BertConfig has no rotary embedding"):
        hf.rotary_from_config(T.BertConfig())


def test_a_user_rope_scaling_registers_and_installs() -> None:
    """The registry is open: a scaling of one's own, by name, in a cape.Rotary."""
    from cape.functional.rope_registry import ROPE_SCALINGS, RopeScaling, register_rope_scaling

    class Halved(RopeScaling):
        def frequencies(self, omega, s, o):
            return omega / (2 * s)

    register_rope_scaling("halved-test", Halved())
    try:
        rot = cape.Rotary(16, base=500.0, scaling="halved-test", factor=1.0)
        want = cape.Rotary(16, base=500.0, scaling="pi", factor=2.0)
        pos = torch.arange(10.0)[None]
        torch.testing.assert_close(rot.angles(pos), want.angles(pos), rtol=0, atol=0)
    finally:
        del ROPE_SCALINGS["halved-test"]
