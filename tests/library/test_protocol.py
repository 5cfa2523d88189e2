"""The encoding protocol and the one vocabulary of names (`cape.build`).

Every name builds with every option it lists; every absolute encoding is called the same way
and declares the positions it reads; the models take any suitable name and refuse the others
by name. Expected values are computed here, independently of the encodings' own code.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import cape
from cape.build import ENCODINGS, encoding_class, encoding_options
from cape.models import CTCModel, Seq2Seq, ViT

DIM = 16
# one valid value (or a set of options that go together) per option any name lists
EXAMPLES: dict[str, dict] = {
    "freq_scale": {"freq_scale": 2.0},
    "base": {"base": 100.0},
    "rho": {"rho": "linspace"},
    "extent": {"extent": 2.0},
    "max_global_shift": {"max_global_shift": 1.0},
    "max_local_shift": {"max_local_shift": 0.25},
    "max_global_scaling": {"max_global_scaling": 1.2},
    "normalize": {"normalize": True},
    "augmentation": {"augmentation": {"max_global_shift": 1.0, "max_global_scaling": 1.1}},
    "num_positions": {"num_positions": 7},
    "overflow": {"overflow": "clamp"},
    "init_std": {"init_std": 0.0},
    "grid": {"grid": (3, 2)},
    "cls_token": {"cls_token": True},
    "max_distance": {"max_distance": 10.0},
    "step": {"step": 0.5},
    "values": {"values": True},
    "pos_dim": {"pos_dim": 2},
    "groups": {"groups": 2},
    "fourier_dim": {"fourier_dim": 8},
    "hidden_dim": {"hidden_dim": 4},
    "gamma": {"gamma": 2.0},
    "learnable": {"learnable": False},
    "mlp": {"mlp": False, "fourier_dim": DIM},
    "fourier": {"fourier": False},
    "sizes": {"sizes": (4, 4)},
    "low": {"low": -2.0},
    "high": {"high": 2.0},
    "fit_grid": {"fit_grid": (4, 4)},
    "causal": {"causal": True},
    "slopes": {"slopes": [2.0 ** -(k + 1) for k in range(DIM)]},  # alibi: one per head (DIM)
    "scaling": {"scaling": "yarn", "train_length": 16},
    "train_length": {"scaling": "ntk", "train_length": 16},
    "factor": {"scaling": "pi", "factor": 2.0},
    "yarn_alpha": {"scaling": "yarn", "train_length": 16, "yarn_alpha": 2.0},
    "yarn_beta": {"scaling": "yarn", "train_length": 16, "yarn_beta": 16.0},
    "xpos": {"xpos": True},
    "xpos_scale_base": {"xpos": True, "xpos_scale_base": 256.0},
    "xpos_center": {"xpos": True, "xpos_center": 0.0},
    "scaling_options": {  # a rope scaling's own options (cape.functional.rope_registry)
        "scaling": "llama3",
        "factor": 8.0,
        "train_length": 64.0,
        "scaling_options": {"low_freq_factor": 1.0, "high_freq_factor": 4.0},
    },
    "hidden": {"hidden": 8},  # fire: the MLP's width
    "c": {"c": 2.0},  # fire: psi's initial scale
    "threshold": {"threshold": 4.0},  # fire: the initial threshold L
    "heads": {"heads": 2},  # rope-mixed: frequencies per head
    "theta": {"theta": 50.0},  # rope-axial / rope-mixed: the frequencies' base
}
REQUIRED = {
    "abspos": {"num_positions": 9},
    "embed-1d": {"num_positions": 9},
    "abspos2d": {"grid": (3, 3)},
    "embed-2d": {"sizes": (4, 4)},
    "embed-4d": {"sizes": (4, 4, 4, 4)},
    "rope-mixed": {"heads": 2},
}


def _make(name: str, **options) -> torch.nn.Module:
    return cape.build(name, DIM, **{**REQUIRED.get(name, {}), **options})


# -- the vocabulary -------------------------------------------------------------------------


def test_every_listed_option_has_an_example() -> None:
    listed = {o for name in ENCODINGS for o in encoding_options(name)} - {"preset"}
    assert listed <= set(EXAMPLES), f"add an example value for {sorted(listed - set(EXAMPLES))}"


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_each_listed_option_builds(name: str) -> None:
    entry = ENCODINGS[name]
    for option in encoding_options(name):
        given = {"preset": entry.presets[0]} if option == "preset" else EXAMPLES[option]
        module = _make(name, **given)
        assert isinstance(module, entry.cls)
    unknown = "not_an_option"
    with pytest.raises(TypeError, match=rf"unknown option.*{unknown}.*{name!r}; allowed"):
        _make(name, **{unknown: 1})


def test_options_given_as_fields_or_mapping_build_the_same_augmentation() -> None:
    fields = dict(max_global_shift=2.0, max_local_shift=0.5, max_global_scaling=1.3)
    for name in ("cape1d", "rotary", "lff", "abspos", "sine-2d"):
        a, b = _make(name, **fields), _make(name, augmentation=fields)
        assert a.augmentation == b.augmentation == cape.Augmentation(**fields), name
    with pytest.raises(ValueError, match="augmentation or its fields"):
        _make("rotary", augmentation=fields, max_global_shift=1.0)
    with pytest.raises(TypeError, match=r"unknown augmentation field\(s\) \['shift'\]"):
        _make("rotary", augmentation={"shift": 1.0})


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_no_name_or_preset_raises_a_deprecation_warning(name: str) -> None:
    """cape.build hands every class `augmentation=` (never the deprecated flat keywords), with
    the fields, a mapping, "auto" (cape2d) or the papers' presets."""
    entry = ENCODINGS[name]
    cases: list[dict] = [{}]
    if entry.augments:
        cases += [
            {"max_global_shift": 1.0, "max_local_shift": 0.25, "normalize": True},
            {"augmentation": {"max_global_scaling": 1.2}},
            {"augmentation": cape.Augmentation(max_global_shift=1.0)},
        ]
    cases += [{"preset": p} for p in entry.presets]
    if name == "cape2d":
        cases += [{"max_local_shift": "auto"}, {"augmentation": {"max_local_shift": "auto"}}]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for options in cases:
            _make(name, **options)
        if name in ("cape1d", "cape2d"):
            cls = entry.cls
            for modality in entry.presets:
                args = (DIM,) if cls is cape.CAPE2d else (modality, DIM)
                cls.preset(*args)
                cls.preset(*args, max_global_shift=2.0)
                cls.preset(*args, augmentation=cape.Augmentation(max_global_shift=2.0))


def test_cape2d_auto_local_shift_is_written_auto_in_the_fields() -> None:
    for enc in (
        _make("cape2d", preset="image"),
        _make("cape2d", max_local_shift="auto"),
        _make("cape2d", augmentation={"max_local_shift": "auto", "max_global_shift": 0.5}),
        cape.CAPE2d.preset(DIM),
    ):
        assert enc.auto_local and enc.augmentation.max_local_shift == 0.0
    assert _make("cape2d", preset="image").augmentation == cape.Augmentation(0.5, 0.0, 1.4)
    assert not _make("cape2d", preset="image", max_local_shift=0.0).auto_local
    assert "auto_local_shift" not in encoding_options("cape2d")  # the fields' "auto" says it
    with pytest.raises(TypeError, match="auto_local_shift=True"):
        _make("rotary2d", max_local_shift="auto")  # 1/N is CAPE2d's


def test_presets_are_the_papers_values_for_every_name_that_takes_them() -> None:
    audio = _make("rotary", preset="audio")
    assert audio.freq_scale == 30.0
    assert audio.augmentation == cape.Augmentation(60.0, 0.015, 1.1, normalize=True)
    text = _make("cape1d", preset="text", max_global_shift=10.0)  # an override wins
    assert text.augmentation == cape.Augmentation(10.0, 0.5, 1.0, normalize=False)
    with pytest.raises(ValueError, match=r"preset must be one of \['text', 'audio'\]"):
        _make("rotary", preset="image")


def test_names_declare_the_protocol() -> None:
    for name in ENCODINGS:
        cls = encoding_class(name)
        assert cls.kind in ("absolute", "attention", "none"), name
        module = _make(name)
        assert module.units in ("continuous", "index"), name
    assert {n for n in ENCODINGS if encoding_class(n).kind == "attention"} == {
        "relpos",
        "rotary",
        "rotary2d",
        "rope-axial",
        "rope-mixed",
        "alibi",
        "fire",
    }
    assert _make("rotary2d").pos_dim == 2 and _make("rotary").pos_dim == 1
    with pytest.raises(TypeError, match="position must be a cape.build name"):
        encoding_class(3, key="position")


# -- one call protocol ----------------------------------------------------------------------

ABSOLUTE_1D = ["sinpos", "cape1d", "abspos", "embed-1d", "sine-1d"]
ABSOLUTE_2D = ["sinpos2d", "cape2d", "abspos2d", "lff", "sine-2d", "embed-2d"]


@pytest.mark.parametrize("name", ABSOLUTE_1D)
def test_1d_default_positions_are_token_indices_and_hop_gives_seconds(name: str) -> None:
    enc = _make(name).eval()
    x = torch.randn(2, 9, DIM)
    idx = torch.arange(9.0).expand(2, 9)
    torch.testing.assert_close(enc(x), enc(x, positions=idx), rtol=0, atol=0)
    if enc.units == "index":
        with pytest.raises(ValueError, match="hop: .* reads table indices, not seconds"):
            enc(x, hop=0.01)
    else:
        seconds = (torch.arange(9.0) + 0.5) * 0.03  # frame centres
        torch.testing.assert_close(
            enc(x, hop=0.03), enc(x, positions=seconds.expand(2, 9)), rtol=0, atol=1e-6
        )
    with pytest.raises(ValueError, match="give one of positions, hop and grid"):
        enc(x, positions=idx, hop=0.01)
    with pytest.raises(ValueError, match="grid: .* reads 1-D positions"):
        enc(x, grid=(3, 3))


def _centres(n: int) -> torch.Tensor:
    return torch.tensor([(2 * j + 1) / n - 1 for j in range(n)])


def _expected_grid(name: str, h: int, w: int) -> torch.Tensor:
    """The (x, y) each encoding reads for a row-major H x W grid, written out here."""
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    if name in ("embed-2d", "sine-2d"):  # LFF's baselines: integer (column, row)
        return torch.stack([cols, rows], -1).reshape(-1, 2).float()
    if name == "abspos2d":  # cell centres in the table's [-1, 1] frame
        return torch.stack([_centres(w)[cols], _centres(h)[rows]], -1).reshape(-1, 2)
    lin = lambda n: torch.linspace(-1, 1, n) if n > 1 else torch.zeros(1)  # noqa: E731
    return torch.stack([lin(w)[cols], lin(h)[rows]], -1).reshape(-1, 2)


@pytest.mark.parametrize("name", ABSOLUTE_2D)
def test_2d_grid_is_the_positions_the_encoding_declares(name: str) -> None:
    enc = _make(name).eval()
    h, w = 4, 5
    pos = enc.grid_positions(h, w, batch=2)
    assert pos.shape == (2, h * w, 2)
    torch.testing.assert_close(pos[0].float(), _expected_grid(name, h, w), rtol=0, atol=1e-6)
    x = torch.randn(2, h * w, DIM)
    by_grid = enc(x, grid=(h, w))
    torch.testing.assert_close(by_grid, enc(x, positions=pos), rtol=0, atol=1e-5)
    four_d = enc(x.reshape(2, h, w, DIM))
    assert four_d.shape == (2, h, w, DIM)
    torch.testing.assert_close(four_d.reshape(2, h * w, DIM), by_grid, rtol=0, atol=0)
    assert enc(grid=(h, w)).shape == (1, h * w, DIM)
    continuous = name in ("sinpos2d", "cape2d", "lff")
    if continuous:  # extent rescales continuous coordinates
        ext = enc.grid_positions(h, w, extent=2.0)
        torch.testing.assert_close(ext[0], 2 * _expected_grid(name, h, w), rtol=0, atol=1e-6)
    else:
        with pytest.raises(ValueError, match="extent"):
            enc(x, grid=(h, w), extent=2.0)


@pytest.mark.parametrize("name", ABSOLUTE_1D + ABSOLUTE_2D)
def test_padding_gets_a_zero_embedding(name: str) -> None:
    enc = _make(name).eval()
    pos_dim = 1 if name in ABSOLUTE_1D else 2
    positions = torch.rand(2, 6, pos_dim) * 3
    if name == "embed-2d":
        positions = positions.long()
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    out = enc(torch.randn(2, 6, DIM), positions=positions, mask=mask)
    assert out[1, 4:].abs().sum() == 0 and out[0].abs().sum() > 0


def _keys_cubic(t: float, a: float = -0.75) -> float:
    """Keys' cubic convolution kernel (the one of bicubic resampling)."""
    t = abs(t)
    if t <= 1:
        return (a + 2) * t**3 - (a + 3) * t**2 + 1
    if t < 2:
        return a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a
    return 0.0


def _bicubic(table: np.ndarray, x: float, y: float) -> np.ndarray:
    """table [H0, W0, D] sampled at (x, y) in [-1, 1] (image edges), borders replicated."""
    h0, w0, _ = table.shape
    u, v = ((x + 1) * w0 - 1) / 2, ((y + 1) * h0 - 1) / 2  # pixel coordinates
    out = np.zeros(table.shape[-1])
    for j in range(math.floor(v) - 1, math.floor(v) + 3):
        for i in range(math.floor(u) - 1, math.floor(u) + 3):
            weight = _keys_cubic(u - i) * _keys_cubic(v - j)
            out += weight * table[min(max(j, 0), h0 - 1), min(max(i, 0), w0 - 1)]
    return out


def test_abspos2d_samples_its_table_bicubically_at_any_position() -> None:
    torch.manual_seed(0)
    enc = _make("abspos2d", grid=(3, 4))
    table = enc.table.detach().double().numpy()
    points = torch.tensor([[[-0.3, 0.7], [0.55, -0.9], [0.0, 0.0], [0.95, 0.2]]])
    got = enc(positions=points)[0].detach().double().numpy()
    for k, (x, y) in enumerate(points[0].tolist()):
        np.testing.assert_allclose(got[k], _bicubic(table, x, y), rtol=0, atol=1e-5)
    # at its own cell centres: the table itself
    centres = enc(positions=enc.grid_positions(3, 4))[0]
    torch.testing.assert_close(centres, enc.table.detach().reshape(12, DIM), rtol=0, atol=1e-6)


def test_nopos_takes_every_layout_and_checks_d() -> None:
    enc = cape.NoPos(DIM)
    x = torch.randn(2, 5, DIM, dtype=torch.float64)
    assert enc(x).dtype == torch.float64 and enc(x).abs().sum() == 0
    assert enc(positions=torch.rand(3, 7, 2)).shape == (3, 7, DIM)
    assert enc(grid=(2, 3)).shape == (1, 6, DIM)
    with pytest.raises(ValueError, match=f"D = {DIM}"):
        enc(torch.randn(2, 5, 4))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        enc([[0.0] * DIM])
    with pytest.raises(ValueError, match="give x"):
        enc()


# -- models ask the encoding ----------------------------------------------------------------

TINY_VIT = dict(image_size=8, patch=4, dim=DIM, depth=1, heads=2)


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_vit_takes_every_2d_name_and_refuses_the_others(name: str) -> None:
    needs_2d = name in (
        "sinpos", "cape1d", "abspos", "embed-1d", "sine-1d", "relpos", "sine-4d", "alibi",
        "fire",
    )  # fmt: skip
    if needs_2d:
        with pytest.raises(ValueError, match=rf"position {name!r} reads \d-D positions; the ViT"):
            ViT(3, position=name, position_options=REQUIRED.get(name), **TINY_VIT)
        return
    model = ViT(3, position=name, **TINY_VIT).eval()
    images = torch.randn(2, 3, 12, 8)
    assert model(images).shape == (2, 3)
    packed = model([images[0], images[1, :, :8]])
    torch.testing.assert_close(packed[0], model(images[:1])[0], rtol=0, atol=2e-5)


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_ctc_and_seq2seq_take_every_1d_name_and_refuse_the_others(name: str) -> None:
    two_d = name in (
        "sinpos2d",
        "cape2d",
        "abspos2d",
        "sine-2d",
        "embed-2d",
        "rotary2d",
        "rope-axial",
        "rope-mixed",
        "sine-4d",
        "embed-4d",
        "lff",
    )
    options = REQUIRED.get(name, {})
    if name == "lff":
        options = {"pos_dim": 1}
        two_d = False
    if two_d:
        with pytest.raises(ValueError, match="1-D"):
            CTCModel(
                12,
                position=name,
                position_options=dict(options),
                n_mels=8,
                dim=DIM,
                depth=1,
                heads=2,
                ffn_dim=32,
            )
        with pytest.raises(ValueError, match="1-D"):
            Seq2Seq(
                12,
                position=name,
                position_options=dict(options),
                dim=DIM,
                heads=2,
                ffn_dim=32,
                encoder_layers=1,
                decoder_layers=1,
            )
        return
    ctc = CTCModel(
        12,
        position=name,
        position_options=dict(options),
        n_mels=8,
        dim=DIM,
        depth=1,
        heads=2,
        ffn_dim=32,
    ).eval()
    log_probs, lengths = ctc(torch.randn(2, 30, 8), torch.tensor([30, 21]))
    assert log_probs.shape == (2, 10, 12) and lengths.tolist() == [10, 7]
    mt = Seq2Seq(
        12,
        position=name,
        position_options=dict(options),
        dim=DIM,
        heads=2,
        ffn_dim=32,
        encoder_layers=1,
        decoder_layers=1,
    ).eval()
    src, mask = torch.randint(3, 12, (2, 5)), torch.ones(2, 5, dtype=torch.bool)
    assert mt(src, mask, src, mask).shape == (2, 5, 12)
