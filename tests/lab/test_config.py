"""Config files, --set overrides and typed validation with errors naming the key."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from cape.lab.config import apply_overrides, from_mapping, load_file, to_mapping
from cape.lab.train import TrainConfig


@dataclass
class Model:
    dim: int = 64
    position: Literal["nopos", "sinpos", "cape1d"] = "cape1d"
    shift: float = 0.0


@dataclass
class Config:
    model: Model = field(default_factory=Model)
    sizes: tuple[int, ...] = (24, 32)
    name: str = "run"
    bf16: bool = False


def test_yaml_and_toml_files_read_the_same(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("model:\n  dim: 128\n  position: sinpos\nsizes: [8, 16]\n")
    (tmp_path / "a.toml").write_text('sizes = [8, 16]\n[model]\ndim = 128\nposition = "sinpos"\n')
    assert load_file(tmp_path / "a.yaml") == load_file(tmp_path / "a.toml")
    cfg = from_mapping(Config, load_file(tmp_path / "a.yaml"))
    assert cfg.model.dim == 128 and cfg.sizes == (8, 16) and cfg.model.shift == 0.0
    assert to_mapping(cfg)["sizes"] == [8, 16]


def test_overrides_parse_yaml_scalars_and_nest() -> None:
    out = apply_overrides(
        {"model": {"dim": 64}},
        ["model.dim=256", "model.shift=0.5", "bf16=true", "sizes=[1, 2]", "name=abc"],
    )
    cfg = from_mapping(Config, out)
    assert (cfg.model.dim, cfg.model.shift, cfg.bf16, cfg.sizes, cfg.name) == (
        256,
        0.5,
        True,
        (1, 2),
        "abc",
    )


def test_overrides_read_exponents_without_a_dot_as_numbers() -> None:
    # plain YAML 1.1 reads "3e-3" as a string; "3.0e-3" as a float
    out = apply_overrides({}, ["a=3e-3", "b=-1E4", "c=2.5e+1", "d=e5", "e=1e", "f='x'"])
    assert out == {"a": 0.003, "b": -10000.0, "c": 25.0, "d": "e5", "e": "1e", "f": "x"}


def test_errors_name_the_key_and_what_is_allowed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['model.dimm'\].*'dim'"):
        from_mapping(Config, {"model": {"dimm": 3}})
    with pytest.raises(
        ValueError, match=r"model.position must be one of \['nopos', 'sinpos', 'cape1d'\]"
    ):
        from_mapping(Config, {"model": {"position": "fancy"}})
    with pytest.raises(ValueError, match="model.dim must be an integer"):
        from_mapping(Config, {"model": {"dim": "big"}})
    with pytest.raises(ValueError, match=r"sizes\[1\] must be an integer"):
        from_mapping(Config, {"sizes": [1, "x"]})
    with pytest.raises(ValueError, match="key=value"):
        apply_overrides({}, ["model.dim"])
    with pytest.raises(ValueError, match="does not exist"):
        load_file(tmp_path / "missing.yaml")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match=r"\.yaml, \.yml or \.toml"):
        load_file(tmp_path / "x.json")


@dataclass
class _WithTrain:
    train: TrainConfig = field(default_factory=TrainConfig)


@pytest.mark.parametrize(
    "section",
    [
        {"lr": "x"},
        {"stepz": 3},
        {"clip_norm": "big"},
        {"deterministic": "yes"},
        {"precision": "fp16"},
        {"steps": 0},
    ],
)
def test_train_section_errors_read_the_same_everywhere(section: dict) -> None:
    # a bare train mapping and a `train:` section of a config file give the same message
    with pytest.raises(ValueError) as nested:
        from_mapping(_WithTrain, {"train": section})
    with pytest.raises(ValueError) as direct:
        from_mapping(TrainConfig, section, "train.")
    assert str(nested.value) == str(direct.value)
    assert f"train.{next(iter(section))}" in str(direct.value)


def test_train_section_accepts_every_field_type() -> None:
    cfg = from_mapping(
        _WithTrain,
        {
            "train": {
                "clip_norm": None,
                "lr": 3,
                "deterministic": True,
                "schedule": "constant",
                "seed": 7,
            }
        },
    ).train
    assert (cfg.clip_norm, cfg.lr, cfg.deterministic, cfg.schedule, cfg.seed) == (
        None,
        3.0,
        True,
        "constant",
        7,
    )
    assert type(cfg.lr) is float
