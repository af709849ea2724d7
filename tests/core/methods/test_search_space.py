"""Shared search-space entries are declared once (issue 26 item 5) without changing what a
seeded search draws: :func:`scarcelab.methods.space.sample` suggests in dict order, so
moving ``lr`` / ``weight_decay`` into a shared dict must keep both the distributions and
their order.

``tests/reference/search_space_draws.json`` was recorded from the code before the shared
declarations (each method file spelling out its own ``lr`` / ``weight_decay``): three
trials of Optuna's ``RandomSampler(seed=7)`` (the sampler ``search --search random``
uses) per registered method.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from scarcelab.methods import METHODS, get_method
from scarcelab.methods.space import (
    CLASSIFIER_DEFAULTS,
    CLASSIFIER_SPACE,
    SELFSUP_SPACE,
    sample,
)

REF = json.loads(
    (Path(__file__).resolve().parents[2] / "reference" / "search_space_draws.json").read_text())


def _draws(name: str) -> list[dict[str, object]]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    rows = []
    for _ in range(3):
        trial = study.ask()
        rows.append(sample(get_method(name).search_space, trial))
        study.tell(trial, 0.0)
    return rows


@pytest.mark.parametrize("name", sorted(REF))
def test_seeded_draws_are_those_of_the_pre_refactor_spaces(name: str) -> None:
    cls = get_method(name)
    assert list(cls.search_space) == REF[name]["order"]
    assert {k: d.describe() for k, d in cls.search_space.items()} == REF[name]["space"]
    got = _draws(name)
    assert [list(r) for r in got] == [list(r) for r in REF[name]["draws"]]
    for row, ref in zip(got, REF[name]["draws"], strict=True):
        assert row == pytest.approx(ref, rel=1e-12)


def test_every_semi_method_declares_only_its_own_entries() -> None:
    """SSL-vs-SSL App. F.1 searches every classifier method over the same optimiser ranges
    (lr 3·10^U(−5,−2), wd 4·10^U(−6,−3)) and every self-supervised one over
    lr 10^U(−4.5,−1.5), wd 10^U(−6.5,−3.5): a semi/self method's space starts with the
    shared entries, unchanged."""
    semi = [n for n in METHODS.names() if get_method(n).family == "semi"]
    selfsup = [n for n in METHODS.names() if get_method(n).family == "self"]
    assert semi and selfsup
    for names, shared in ((semi, CLASSIFIER_SPACE), (selfsup, SELFSUP_SPACE)):
        for n in names:
            space = get_method(n).search_space
            assert list(space)[:2] == list(shared), n
            assert {k: space[k] for k in shared} == shared, n
    for n in semi:
        defaults = get_method(n).defaults
        assert {k: defaults[k] for k in CLASSIFIER_DEFAULTS} == CLASSIFIER_DEFAULTS, n


def test_int_log_uniform_suggests_under_the_entry_name() -> None:
    """The trial records the draw under the search-space entry's name: the study's best
    parameters and the logged hyperparameters are looked up by it."""
    from scarcelab.methods.space import IntLogUniform

    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    value = IntLogUniform(1, 64).suggest(trial, "batch_size")
    assert trial.params == {"batch_size": value} and 1 <= value <= 64
