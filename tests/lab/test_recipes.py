"""FIRE's threshold and xPos's scale base set from each study's training length: the length
study's models get them (L = data.max_len), an option a row gives keeps its value, and the
report says what was set."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from cape.encodings.fire import FIRE
from cape.encodings.rotary import Rotary
from cape.lab.experiments import resolve_config
from cape.lab.experiments.length.config import PRESETS, LengthConfig, position_options
from cape.lab.experiments.length.model import make_model
from cape.lab.experiments.recipes import length_recipe, recipe_notes


@pytest.fixture(scope="module")
def full():
    cfg, _ = resolve_config(LengthConfig, PRESETS, "cpu-full")
    return cfg


def test_length_rows_take_fire_and_xpos_settings_from_the_training_length(full):
    assert full.data.max_len == 32
    for name in ("FIRE", "FIRE+CAPE"):
        fires = [m for m in make_model(full, full.row(name)).modules() if isinstance(m, FIRE)]
        assert len(fires) == full.model.layers
        assert all(f.threshold0 == 8.0 for f in fires)  # 32 / 4, not the library's 512
    rotaries = [m for m in make_model(full, full.row("xPos")).modules() if isinstance(m, Rotary)]
    assert rotaries and all(r.xpos and r.xpos_scale_base == 16.0 for r in rotaries)
    # rows that are neither get nothing of it
    for name in ("rotary", "rotary+CAPE", "ALiBi"):
        opts = position_options(full.row(name), full)
        assert "threshold" not in opts and "xpos_scale_base" not in opts


def test_an_option_given_keeps_its_value():
    assert length_recipe("fire", {"threshold": 3.0}, train_length=32) == {"threshold": 3.0}
    given = {"xpos": True, "xpos_scale_base": 5.0}
    assert length_recipe("rotary", given, train_length=32) == given
    assert length_recipe("rotary", {"xpos": False}, train_length=32) == {"xpos": False}
    assert length_recipe("alibi", {}, train_length=32) == {}


def test_report_states_what_the_recipe_set(full):
    rows = asdict(full)["rows"]
    notes = " ".join(recipe_notes(rows, full.data.max_len))
    assert "FIRE: threshold 8 " in notes and "xPos: scale base 16 " in notes
    fixed = [{**r, "options": {**r["options"], "threshold": 3.0}} for r in rows]
    assert "FIRE" not in " ".join(recipe_notes(fixed, 32))
    assert recipe_notes([r for r in rows if r["position"] == "relpos"], 32) == []


def test_translation_peers_take_them_from_the_longest_training_side():
    from cape.lab.experiments.translation import model as translation_model
    from cape.lab.experiments.translation.config import PRESETS as TRANSLATION
    from cape.lab.experiments.translation.config import TranslationConfig

    cfg, _ = resolve_config(TranslationConfig, TRANSLATION, "quick-peers")
    assert cfg.data.max_tokens == 64
    rows = {r.name: r for r in cfg.rows}

    def modules(name, kind):
        model = translation_model.make_model(cfg, rows[name], 1.05, 96, 0)
        return [m for m in model.modules() if isinstance(m, kind)]

    fires = modules("FIRE", FIRE)
    assert fires and all(f.threshold0 == 16.0 for f in fires)  # 64 / 4, not 512
    xpos = modules("xPos", Rotary)
    assert xpos and all(r.xpos and r.xpos_scale_base == 32.0 for r in xpos)
    assert all(not r.xpos for r in modules("rotary", Rotary))
    notes = " ".join(recipe_notes(asdict(cfg)["rows"], cfg.data.max_tokens))
    assert "FIRE: threshold 16 " in notes and "xPos: scale base 32 " in notes


def test_speech_peers_take_them_from_the_longest_training_utterance():
    from cape.lab.experiments.asr.config import PRESETS as ASR
    from cape.lab.experiments.asr.config import AsrConfig
    from cape.lab.experiments.asr.model import make_model as asr_model

    cfg, _ = resolve_config(AsrConfig, ASR, "digits-k3-peers")
    rows = {r.name: r for r in cfg.rows}

    def modules(name, kind):
        return [m for m in asr_model(cfg, rows[name]).modules() if isinstance(m, kind)]

    fires = modules("FIRE", FIRE)
    assert fires and all(f.threshold0 == 1.5 for f in fires)  # 6 s / 4, not 512 frames
    xpos = modules("xPos", Rotary)
    assert xpos and all(r.xpos and r.xpos_scale_base == 3.0 for r in xpos)  # 6 s / 2
    assert all(not r.xpos for r in modules("rotary", Rotary))
    notes = " ".join(recipe_notes(asdict(cfg)["rows"], 6.0))
    assert "FIRE: threshold 1.5 " in notes and "xPos: scale base 3 " in notes
