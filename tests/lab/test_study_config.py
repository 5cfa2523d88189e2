"""The study-config base: what a study's top-level config inherits (name, seeds, data, model,
train, eval, rows and the run checks), and how `from_mapping` reads a subclass's sections."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from cape.lab.config import from_mapping, to_mapping
from cape.lab.experiments import EXPERIMENTS
from cape.lab.experiments.study_config import StudyConfig
from cape.lab.train import TrainConfig


@dataclass
class _Data:
    size: int = 8


@dataclass
class _Model:
    dim: int = 16


@dataclass
class _Eval:
    lengths: list[int] = field(default_factory=lambda: [1, 2])


@dataclass
class _Row:
    name: str = ""
    position: str = "nopos"


@dataclass
class _Extra:
    hop: float = 10.0


@dataclass
class _Study(StudyConfig[_Data, _Model, _Eval, _Row]):
    name: str = "toy"
    extra: _Extra = field(default_factory=_Extra)


def test_sections_are_read_as_the_classes_the_study_names() -> None:
    cfg = from_mapping(
        _Study,
        {"rows": [{"name": "a"}], "data": {"size": 4}, "eval": {"lengths": [3]}, "seeds": [2]},
    )
    assert isinstance(cfg.data, _Data) and cfg.data.size == 4
    assert isinstance(cfg.eval, _Eval) and cfg.eval.lengths == [3]
    assert cfg.rows == [_Row("a", "nopos")] and cfg.seeds == [2]
    # sections the mapping leaves out take their own defaults
    assert cfg.model == _Model() and cfg.train == TrainConfig() and cfg.extra == _Extra()
    assert cfg.name == "toy"


def test_fields_keep_one_order_with_the_study_s_own_last() -> None:
    names = [f.name for f in dataclasses.fields(_Study)]
    assert names == ["name", "seeds", "data", "model", "train", "eval", "rows", "extra"]
    cfg = from_mapping(_Study, {"rows": [{"name": "a"}]})
    assert list(to_mapping(cfg)) == names


def test_a_row_key_is_checked_against_the_row_class() -> None:
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['rows\[0\]\.bogus'\]"):
        from_mapping(_Study, {"rows": [{"name": "a", "bogus": 1}]})
    with pytest.raises(ValueError, match=r"data\.size must be an integer"):
        from_mapping(_Study, {"rows": [{"name": "a"}], "data": {"size": "x"}})


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"rows": []}, "rows must list at least one model"),
        ({"rows": [{"name": "a"}], "seeds": []}, "seeds must list at least one seed"),
        ({"rows": [{"name": "a"}, {"name": "a"}]}, r"rows\[\]\.name must be unique"),
    ],
)
def test_the_run_checks_come_with_the_base(mapping: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_mapping(_Study, mapping)


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_study_config_extends_the_base(name: str) -> None:
    exp = EXPERIMENTS[name]
    assert issubclass(exp.config_cls, StudyConfig)
    preset = exp.presets[exp.default_preset]
    row = preset["rows"][0]
    with pytest.raises(ValueError, match=r"rows\[\]\.name must be unique"):
        from_mapping(exp.config_cls, {**preset, "rows": [row, row]})
