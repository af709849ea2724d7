"""``ALConfig`` inherits ``FitConfig``'s shared fields instead of repeating them (issue 26
item 5), without changing a default or a logged parameter: the AL loop logs
``al.<field>`` for every field of ``dataclasses.asdict(cfg)`` (scarcelab/active/loop.py).

``tests/reference/al_configs.json`` holds ``asdict`` of every AL dataset's config as the
code before the refactor produced it (ALConfig and FitConfig each spelling the fields).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from scarcelab.active.classifier import FitConfig, FitSettings
from scarcelab.active.datasets import ALConfig, dataset_config
from scarcelab.errors import ConfigError

REF = json.loads(
    (Path(__file__).resolve().parents[2] / "reference" / "al_configs.json").read_text())


def _jsonable(d: dict[str, object]) -> dict[str, object]:
    return json.loads(json.dumps(d))  # tuples -> lists, as recorded


@pytest.mark.parametrize("name", sorted(REF))
def test_every_dataset_config_logs_the_same_fields_and_values(name: str) -> None:
    cfg = dataset_config(name)
    assert _jsonable(dataclasses.asdict(cfg)) == REF[name]
    # the fit the loop runs gets exactly the dataset's optimiser / stopping settings, as
    # the loop's old field-by-field FitConfig(...) construction did
    assert cfg.fit_config() == FitConfig(cfg.optimizer, cfg.lr, cfg.weight_decay,
                                         cfg.batch_size, cfg.max_epochs, cfg.patience,
                                         restore_best=cfg.restore_best,
                                         drop_last=cfg.drop_last)


def test_defaults_and_shared_fields() -> None:
    shared = {f.name for f in dataclasses.fields(FitSettings)}
    assert shared == {"optimizer", "lr", "weight_decay", "batch_size", "max_epochs",
                      "patience", "restore_best", "drop_last"}
    assert issubclass(ALConfig, FitSettings) and issubclass(FitConfig, FitSettings)
    # eval_batch_size is a FitConfig-only setting: not an AL field, so not logged
    assert "eval_batch_size" not in {f.name for f in dataclasses.fields(ALConfig)}
    assert dataclasses.asdict(FitConfig()) == {
        "optimizer": "nadam", "lr": 1e-3, "weight_decay": 0.0, "batch_size": 32,
        "max_epochs": 50, "patience": 2, "restore_best": True, "drop_last": False,
        "eval_batch_size": 1024}
    base = ALConfig(budget=7)
    assert {k: getattr(base, k) for k in shared} == {
        k: getattr(FitConfig(), k) for k in shared}
    with pytest.raises(TypeError):
        ALConfig()  # type: ignore[call-arg]  # the budget has no default
    assert base.replace(lr=0.5).fit_config().lr == 0.5
    with pytest.raises(ConfigError, match="unknown AL config field"):
        base.replace(eval_batch_size=8)
