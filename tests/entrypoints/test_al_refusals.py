"""Issue 42 item 8: ``al`` options that cannot apply are refused before any run.

Before: ``al --budget 1000000`` on splice labelled the whole pool (798), exited 0 and still
logged ``budget=1000000``; ``al --encoder nosuchencoder`` on a set that is not encoded exited
0 (the option silently ignored). Each is now one line naming the option, exit status != 0,
and no run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import SHARED_DATA

from scarcelab.active import loop

REPO = Path(__file__).resolve().parents[2]
SHARED = next((d for d in (SHARED_DATA, REPO / "shared" / "data") if (d / "tabular").is_dir()),
              SHARED_DATA)


@pytest.fixture
def no_run(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A store that must stay empty: starting the sweep's record fails the test."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)

    def started(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("a sweep was started with an option that cannot apply")

    monkeypatch.setattr(loop, "_start_sweep", started)


def _al(*args: str):  # type: ignore[no-untyped-def]
    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, ["al", "--strategy", "random", "-q", *args])
    errors = [ln for ln in r.output.splitlines() if ln.startswith("Error")]
    return r, errors


def test_a_budget_larger_than_the_pool_is_refused_naming_the_pool(no_run):  # type: ignore[no-untyped-def]
    if not (SHARED / "tabular").is_dir():
        pytest.skip("../shared/data/tabular (splice) is not here")
    r, errors = _al("--dataset", "splice", "--data-dir", str(SHARED / "tabular"),
                    "--budget", "1000000")
    assert r.exit_code != 0 and len(errors) == 1, r.output
    assert "--budget 1000000" in errors[0] and "pool holds 798" in errors[0], errors[0]
    assert "--budget 798 or less" in errors[0]


def test_a_budget_larger_than_a_synthetic_pool_is_refused(no_run):  # type: ignore[no-untyped-def]
    r, errors = _al("--dataset", "diverging_sine", "--budget", "100000")
    assert r.exit_code != 0 and len(errors) == 1, r.output
    assert "--budget 100000" in errors[0] and "pool holds" in errors[0], errors[0]


def test_a_budget_the_pool_can_give_passes_the_check():
    import numpy as np

    from scarcelab.active.datasets import ALData, dataset_config

    data = ALData("x", np.zeros((100, 2), np.float32), np.repeat([0, 1], 50),
                  np.zeros((4, 2), np.float32), np.array([0, 1, 0, 1]), 2, "here")
    cfg = dataset_config("splice").replace(budget=78, val_fraction=0.2, seed_per_class=1)
    assert loop.pool_capacity(data, cfg) == 100 - 20 - 2 == 78
    rc = loop.ALRunConfig(strategy="random", dataset="splice")
    loop.check_budget(rc, cfg, data)  # the whole pool: allowed
    with pytest.raises(Exception, match="--budget 79 .* pool holds 78"):
        loop.check_budget(rc, cfg.replace(budget=79), data)


@pytest.mark.parametrize("dataset", ["splice", "diverging_sine", "encoded_mnist_5k"])
def test_an_unknown_encoder_is_refused_naming_the_registered_ones(no_run, dataset):  # type: ignore[no-untyped-def]
    r, errors = _al("--dataset", dataset, "--encoder", "nosuchencoder")
    assert r.exit_code == 2 and len(errors) == 1, r.output
    assert "'--encoder'" in errors[0] and "nosuchencoder" in errors[0], errors[0]
    assert "simclr" in errors[0] and "byol" in errors[0], errors[0]


def test_an_encoder_for_a_set_that_is_not_encoded_is_refused(no_run):  # type: ignore[no-untyped-def]
    r, errors = _al("--dataset", "diverging_sine", "--encoder", "byol")
    assert r.exit_code == 2 and len(errors) == 1, r.output
    assert "--encoder byol does not apply to diverging_sine" in errors[0], errors[0]
    r, errors = _al("--dataset", "diverging_sine", "--set", "encoder.epochs=3")
    assert r.exit_code == 2 and "--set encoder.* does not apply" in errors[0], r.output


def test_the_default_encoder_still_passes_for_any_set():
    """``mlflow run -e al`` gives ``--encoder simclr`` for every set: it must pass."""
    from scarcelab.entrypoints.al import _check_encoder

    _check_encoder("splice", "simclr", {})
    _check_encoder("encoded_mnist_5k", "byol", {"epochs": 3})
    _check_encoder("encoded_mnist_5k", "runs:/abc/model", {})
