"""cape.models.asr.CTCModel: lengths, padding invariance, CTC training step, time positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cape
from cape.models.asr import CTCModel
from cape.positions import timestamps

ASR_POSITIONS = ("nopos", "sinpos", "cape1d", "abspos", "relpos", "rotary")  # the speech rows

TINY = dict(n_mels=16, dim=32, depth=2, heads=2, ffn_dim=64)
VOCAB = 7


def _model(position: str = "cape1d", **kw) -> CTCModel:
    torch.manual_seed(0)
    return CTCModel(VOCAB, position=position, **{**TINY, **kw})


@pytest.mark.parametrize(("kernel", "stride"), [(7, 3), (4, 2), (1, 1), (5, 4)])
def test_lengths_match_conv1d(kernel: int, stride: int) -> None:
    model = _model("nopos", kernel=kernel, stride=stride).eval()
    conv = nn.Conv1d(16, 8, kernel, stride=stride, padding=kernel // 2)
    lengths = torch.tensor([1, 2, 3, 10, 29, 30, 31])
    for n in lengths.tolist():
        expect = conv(torch.zeros(1, 16, n)).shape[-1]
        assert model.output_length(n) == expect
    expect = torch.tensor([conv(torch.zeros(1, 16, n)).shape[-1] for n in lengths.tolist()])
    torch.testing.assert_close(model.output_lengths(lengths), expect)
    feats = torch.randn(7, 31, 16)
    log_probs, out_lengths = model(feats, lengths)
    assert log_probs.shape == (7, model.output_length(31), VOCAB)
    torch.testing.assert_close(out_lengths, expect)
    _, full = model(feats)
    assert full.tolist() == [model.output_length(31)] * 7


def test_output_is_log_softmax_float32() -> None:
    model = _model().eval()
    log_probs, _ = model(torch.randn(2, 20, 16).double().float())
    assert log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 7))


@pytest.mark.parametrize("position", ASR_POSITIONS)
@pytest.mark.parametrize("garbage", ["large", "nan"])
def test_padding_does_not_change_real_frames(position: str, garbage: str) -> None:
    model = _model(position).eval()
    torch.manual_seed(1)
    long, short = torch.randn(40, 16), torch.randn(26, 16)
    pad = torch.randn(14, 16) * 1e4 if garbage == "large" else torch.full((14, 16), float("nan"))
    batch = torch.stack([long, torch.cat([short, pad])])
    hop = torch.tensor([0.01, 0.02])
    log_probs, out_lengths = model(batch, torch.tensor([40, 26]), hop=hop)
    alone, alone_len = model(short[None], hop=0.02)
    n = int(out_lengths[1])
    assert n == int(alone_len[0]) == model.output_length(26)
    torch.testing.assert_close(log_probs[1, :n], alone[0], atol=1e-5, rtol=0)
    first, _ = model(long[None], hop=0.01)
    torch.testing.assert_close(log_probs[0], first[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("position", ASR_POSITIONS)
def test_ctc_loss_and_grads(position: str) -> None:
    model = _model(position, layer_drop=0.0).train()
    feats = torch.randn(2, 40, 16)
    lengths = torch.tensor([40, 31])
    log_probs, out_lengths = model(
        feats, lengths, hop=0.01, generator=torch.Generator().manual_seed(0)
    )
    targets = torch.randint(1, VOCAB, (2, 5))  # 0 is the blank
    target_lengths = torch.tensor([5, 3])
    loss = F.ctc_loss(log_probs.transpose(0, 1), targets, out_lengths, target_lengths, blank=0)
    assert torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    assert model.conv.weight.grad.abs().sum() > 0


def _first_layer_positions(model: CTCModel, *args, **kwargs) -> torch.Tensor | None:
    seen: dict[str, torch.Tensor | None] = {}

    def hook(_mod, _args, kw):
        seen["positions"] = kw["context"].q_positions  # what the stack prepared for every layer

    handle = model.encoder.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        model(*args, **kwargs)
    finally:
        handle.remove()
    return seen["positions"]


@pytest.mark.parametrize("position", ["relpos", "rotary"])
def test_relative_encodings_get_seconds(position: str) -> None:
    model = _model(position).eval()
    feats = torch.randn(2, 30, 16)
    lengths = torch.tensor([30, 17])
    hop = torch.tensor([0.01, 0.0125])
    got = _first_layer_positions(model, feats, lengths, hop=hop)
    out_lengths = model.output_lengths(lengths)
    mask = cape.lengths_to_mask(out_lengths, 10)
    torch.testing.assert_close(got, timestamps(2, 10, 3 * hop, mask=mask))
    assert got[0, 0, 0] == pytest.approx(0.5 * 0.03)
    if position == "relpos":
        assert model.encoder.layers[0].self_attn.biases[0].step == pytest.approx(0.03)


def test_abspos_gets_frame_indices() -> None:
    model = _model("abspos").eval()
    feats = torch.randn(1, 30, 16)
    assert _first_layer_positions(model, feats, hop=0.02) is None  # the table's own indices
    out, _ = model(feats, hop=0.01)
    assert out.shape == (1, 10, VOCAB)
    torch.testing.assert_close(out, model(feats, hop=0.02)[0])  # the hop plays no part


@pytest.mark.parametrize("position", ["sinpos", "cape1d"])
def test_sinusoid_uses_timestamps(position: str) -> None:
    model = _model(position).eval()
    seen = []
    # the encoder calls add_to, whose output (the hook's) is x + embedding: take x back off
    handle = model.encoder.position.register_forward_hook(
        lambda _m, args, kw, out: seen.append(out - args[0] if kw.get("add") else out),
        with_kwargs=True,
    )
    feats = torch.randn(2, 30, 16)
    lengths = torch.tensor([30, 20])
    hop = torch.tensor([0.01, 0.02])
    try:
        model(feats, lengths, hop=hop)
    finally:
        handle.remove()
    mask = cape.lengths_to_mask(model.output_lengths(lengths), 10)
    x = torch.zeros(2, 10, 32)
    expect = model.encoder.position(x, positions=timestamps(2, 10, 3 * hop, mask=mask), mask=mask)
    torch.testing.assert_close(seen[0], expect)
    # and a hop-free encoding (token indices) would give something else
    other = model.encoder.position(x, mask=mask)
    assert not torch.allclose(seen[0], other)


def test_hop_changes_sinpos_but_not_nopos() -> None:
    feats = torch.randn(2, 30, 16)
    sin = _model("sinpos").eval()
    assert not torch.allclose(sin(feats, hop=0.01)[0], sin(feats, hop=0.02)[0], atol=1e-4)
    nopos = _model("nopos").eval()
    torch.testing.assert_close(nopos(feats, hop=0.01)[0], nopos(feats, hop=0.02)[0])
    # a per-sample hop equals one call per hop
    both, _ = sin(feats, hop=torch.tensor([0.01, 0.02]))
    torch.testing.assert_close(both[1], sin(feats[1:], hop=0.02)[0][0], atol=1e-5, rtol=0)


def test_position_defaults() -> None:
    assert _model("cape1d").encoder.position.freq_scale == 30.0
    assert _model("cape1d").encoder.position.augmentation.max_global_shift == 60.0
    assert _model("sinpos").encoder.position.freq_scale == 30.0
    assert _model("sinpos").encoder.position.augmentation is None
    assert _model("rotary").encoder.layers[1].self_attn.rotary.freq_scale == 30.0
    assert _model("abspos").encoder.position.num_positions == 1024
    custom = _model("relpos", position_options=dict(max_distance=0.3))
    assert custom.encoder.layers[0].self_attn.biases[0].num_buckets == 21
    assert _model("nopos").encoder.position is None


def test_xpos_decays_over_512_output_frames() -> None:
    """xPos's decay length is the authors' 512 tokens counted in output frames (seconds here):
    a query 512 output frames (stride x 10 ms each) after its key scales their logit by zeta."""
    for stride in (3, 2):
        frame = stride * 0.01
        pos = torch.tensor([[0.0, 512 * frame]])
        logits = []
        for xpos in (True, False):
            model = _model("rotary", stride=stride, position_options=dict(xpos=xpos))
            rotary = model.encoder.layers[0].self_attn.rotary
            eye = torch.eye(rotary.head_dim)[None, :, None, :].expand(
                1, -1, 2, -1
            )  # [1, hd, 2, hd]
            q, k = rotary(eye, eye, positions=pos)  # each "head" j holds the one-hot vector e_j
            logits.append((q[0, :, 1] * k[0, :, 0]).sum(-1).double())  # query 512 frames on
        ratio, cos = logits[0] / logits[1], logits[1]
        i = torch.arange(rotary.head_dim // 2, dtype=torch.float64)
        zeta = (2 * i / rotary.head_dim + 0.4) / 1.4  # xPos's per-pair decay, gamma 0.4
        keep = cos.abs() > 0.1  # ratios of near-zero logits say nothing
        assert int(keep.sum()) >= rotary.head_dim // 2
        # pair of feature j: j // 2 (interleaved) or j mod hd/2 (halves): one layout holds
        assert any(
            torch.allclose(ratio[keep], z[keep], rtol=1e-4)
            for z in (zeta.repeat_interleave(2), zeta.repeat(2))
        )
    kept = _model("rotary", position_options=dict(xpos=True, xpos_scale_base=7.0))
    assert kept.encoder.layers[0].self_attn.rotary.xpos_scale_base == 7.0


def test_module_position() -> None:
    enc = cape.build("cape1d", 32, preset="audio")
    model = _model(enc)
    assert model.encoder.position is enc
    model.eval()(torch.randn(1, 12, 16), hop=0.01)
    with pytest.raises(TypeError, match="position"):
        _model(cape.build("relpos", 16))


def test_small_preset() -> None:
    model = CTCModel.small(30, position="nopos", n_mels=8)
    assert (model.dim, len(model.encoder.layers)) == (256, 6)
    assert model.encoder.layers[0].self_attn.heads == 4
    assert model.encoder.layers[0].ffn[0].out_features == 1024
    assert model.head.out_features == 30 and model.conv.in_channels == 8


@pytest.mark.parametrize(
    ("kwargs", "name", "error"),
    [
        (dict(vocab_size=1), "vocab_size", ValueError),
        (dict(vocab_size=2.0), "vocab_size", TypeError),
        (dict(stride=0), "stride", ValueError),
        (dict(kernel=0), "kernel", ValueError),
        (dict(position="bogus"), "position", ValueError),
        (dict(position=3), "position", TypeError),
        (dict(position="cape1d", position_options=dict(bogus=1)), "bogus", TypeError),
        (dict(position_options=[1]), "position_options", TypeError),
        (dict(dim=30, heads=4), "heads", ValueError),
        (dict(conv_dropout=1.0), "conv_dropout", ValueError),
    ],
)
def test_bad_arguments(kwargs: dict, name: str, error: type) -> None:
    args = {**TINY, "vocab_size": VOCAB, **kwargs}
    with pytest.raises(error, match=name):
        CTCModel(**args)


def test_bad_forward_arguments() -> None:
    model = _model().eval()
    with pytest.raises(ValueError, match="features"):
        model(torch.randn(2, 20, 15))
    with pytest.raises(ValueError, match="lengths"):
        model(torch.randn(2, 20, 16), torch.tensor([21, 3]))
    with pytest.raises(ValueError, match="hop"):
        model(torch.randn(2, 20, 16), hop=0.0)
    with pytest.raises(ValueError, match="hop"):
        model(torch.randn(2, 20, 16), hop=torch.tensor([0.01, 0.01, 0.01]))
    with pytest.raises(ValueError, match="hop"):
        model(torch.randn(2, 20, 16), hop=torch.tensor([0.01, -0.01]))


def test_output_times_means_of_stride_groups() -> None:
    from cape.models.asr import output_times

    times = torch.tensor([[0.1, 0.3, 0.4, 0.9, 1.0, 1.6, 2.0], [0.2, 0.5, 0.7, 0.8, 0.0, 0.0, 0.0]])
    got = output_times(times, torch.tensor([7, 4]), 3, 3)
    # independent: plain Python means of each group of 3; missing frames continue the last step
    expect = [
        [(0.1 + 0.3 + 0.4) / 3, (0.9 + 1.0 + 1.6) / 3, (2.0 + 2.4 + 2.8) / 3],
        [(0.2 + 0.5 + 0.7) / 3, (0.8 + 0.9 + 1.0) / 3, 0.0],
    ]
    torch.testing.assert_close(got, torch.tensor(expect))


@pytest.mark.parametrize("position", ["sinpos", "relpos", "rotary", "cape1d"])
def test_even_frame_times_equal_hop(position: str) -> None:
    """Evenly spaced frame times give what `hop=` gives: the same positions, the same outputs."""
    model = _model(position).eval()
    feats = torch.randn(2, 31, 16)
    lengths = torch.tensor([31, 19])
    hop = torch.tensor([0.01, 0.02])
    frame = (torch.arange(31)[None] + 0.5) * hop[:, None]
    frame = torch.where(torch.arange(31)[None] < lengths[:, None], frame, 0.0)
    a, la = model(feats, lengths, hop=hop)
    b, lb = model(feats, lengths, frame_times=frame, hop=0.5)  # hop is unused with frame_times
    assert torch.equal(la, lb)
    mask = cape.lengths_to_mask(la, a.shape[1])
    torch.testing.assert_close(a[mask], b[mask], atol=1e-4, rtol=1e-4)


def test_skipped_frames_follow_their_times() -> None:
    """Uneven times (frames skipped) reach the encoder as the group means, not as even steps."""
    model = _model("relpos").eval()
    frame = torch.tensor([[0.005, 0.015, 0.045, 0.055, 0.095, 0.105]])
    got = _first_layer_positions(model, torch.randn(1, 6, 16), frame_times=frame)
    torch.testing.assert_close(
        got[0, :, 0], torch.tensor([(0.005 + 0.015 + 0.045) / 3, (0.055 + 0.095 + 0.105) / 3])
    )
    with pytest.raises(ValueError, match="frame_times"):
        model(torch.randn(1, 6, 16), frame_times=frame[:, :5])


def test_spec_rebuilds_the_model() -> None:
    import json

    model = _model("cape1d", position_options={"max_global_shift": 15.0})
    twin = CTCModel(**json.loads(json.dumps(model.spec)))
    assert repr(twin) == repr(model)
    twin.load_state_dict(model.state_dict())


def test_relpos_in_the_first_layer_only() -> None:
    model = _model("relpos", relative_layers="first")
    kinds = [len(layer.self_attn.biases) > 0 for layer in model.encoder.layers]
    assert kinds == [True, False]
    with pytest.raises(ValueError, match="relative_layers"):
        _model("relpos", relative_layers="last")
