"""Behaviour guard for the ``al`` entry point's own logic, recorded before it was split into
helpers: how the flags become the run configuration, the strategy-settings error, the CPU
warning for image architectures and the progress callback. The AL loop is replaced by a
fake, so no data is read and nothing trains."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    db = tmp_path / "m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    return db


def test_flags_make_the_run_config_and_the_cpu_warning_and_progress_show(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scarcelab.active import loop
    from scarcelab.entrypoints.cli import main

    seen: dict[str, Any] = {}

    def fake_run_al(rc: Any, tracker: Any, ctx_data: Any, on_iteration: Any) -> str:
        seen.update(rc=rc, ctx_data=ctx_data, kind=tracker.kind, threads=torch.get_num_threads())
        on_iteration(0, 10, 0.5)
        return "RESULT"

    monkeypatch.setattr(loop, "run_al", fake_run_al)
    monkeypatch.setattr(loop, "sweep_summary", lambda res: f"SUMMARY of {res}")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = torch.get_num_threads()
    try:
        r = CliRunner().invoke(main, [
            "al", "--strategy", "margin", "--dataset", "mnist_5k", "--device", "cpu",
            "--query-size", "5", "--budget", "7", "--seed-set", "2", "--repetitions", "2",
            "--early-stop-on", "test", "--set", "strategy.foo=1", "--experiment", "g", "-v"])
    finally:
        torch.set_num_threads(threads)
    assert r.exit_code == 2, r.output
    assert "'--set'" in r.output and "strategy settings {'foo': 1}:" in r.output
    assert seen == {}

    try:
        r = CliRunner().invoke(main, [
            "al", "--strategy", "margin", "--dataset", "mnist_5k", "--device", "cpu",
            "--query-size", "5", "--budget", "7", "--seed-set", "2", "--repetitions", "2",
            "--early-stop-on", "test", "--experiment", "g", "-v"])
    finally:
        torch.set_num_threads(threads)
    assert r.exit_code == 0, r.output
    assert ("[scarcelab] warning: mnist_5k trains a resnet18 on the CPU at every AL "
            "iteration (minutes each); pass --device auto on a GPU machine or "
            "--set arch=small_cnn") in r.output
    assert "  repetition 0 labels 10: test accuracy 0.5000" in r.output
    assert "SUMMARY of RESULT" in r.output
    rc = seen["rc"]
    assert seen["threads"] == 1 and seen["ctx_data"] is None and seen["kind"] == "al"
    assert rc.overrides == {"budget": 7, "seed_per_class": 2, "stop_on": "test",
                            "val_fraction": 0.0}
    assert (rc.strategy, rc.dataset, rc.query_size, rc.repetitions) == (
        "margin", "mnist_5k", 5, 2)
    assert rc.encoder == {} and rc.strategy_params == {} and rc.device == "cpu"
