"""Behaviour guard for the ``contamination`` entry point's orchestration: the branches the
sweep tests reach only through slow training (taking over a killed sweep under
``mlflow run``, keeping its finished children, a failing sweep closing its parent FAILED,
a fresh parent's name and note). The protocol and the Table A1 view are replaced by fakes,
so what is pinned is the entry point's own side effects and output, recorded on the code
before it was split into helpers."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from scarcelab.errors import ConfigError

ARGS = ["contamination", "--method", "fixmatch", "--dataset", "synthetic_tiny",
        "--arch", "small_cnn", "--device", "cpu", "--max-trials", "1",
        "--budget-minutes", "2", "--ood", "gaussian", "--ratios", "0,0.5,0.5"]


def _store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(uri)
    return MlflowClient()


def _fake_view(monkeypatch: pytest.MonkeyPatch, calls: list[Any]) -> None:
    from scarcelab.tracking import contamination as view

    def table(parent_run_id: str | None = None, **_: Any) -> pd.DataFrame:
        calls.append(("table", parent_run_id))
        return pd.DataFrame({"source": ["gaussian"], "ratio": [0.5]})

    def plot(t: pd.DataFrame, path: Path) -> None:
        calls.append(("plot", path.name))
        path.write_bytes(b"png")

    monkeypatch.setattr(view, "contamination_table", table)
    monkeypatch.setattr(view, "plot_vs_ratio", plot)
    monkeypatch.setattr(view, "to_markdown", lambda t: "TABLE-MD")


def test_a_killed_sweep_under_mlflow_run_is_taken_over_and_its_finished_children_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scarcelab.entrypoints.cli import main
    from scarcelab.protocols import contamination as proto
    from scarcelab.tracking import contamination as view

    c = _store(tmp_path, monkeypatch)
    monkeypatch.setenv("OPTUNA_STORAGE", f"sqlite:///{tmp_path}/o.db")
    exp = c.create_experiment("guard")
    killed = c.create_run(exp, run_name="old").info.run_id
    orphan = c.create_run(exp, run_name="child", tags={"mlflow.parentRunId": killed})
    new = c.create_run(exp, run_name="new").info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", new)
    calls: list[Any] = []
    _fake_view(monkeypatch, calls)
    keys: list[str] = []

    def killed_sweep(client: Any, exp_id: str, key: str) -> str:
        calls.append(("killed_sweep", exp_id))
        keys.append(key)
        return killed

    monkeypatch.setattr(view, "killed_sweep", killed_sweep)
    monkeypatch.setattr(view, "finished_children",
                        lambda client, pid: {"gaussian r=0": SimpleNamespace(run_id="k1")})

    def fake_run(cfg: Any, sources: list[str], ratios: list[float], child: Any,
                 ood_dir: Any = None, tuning: str = "", finished: Any = None) -> list[Any]:
        calls.append(("run", sources, ratios, ood_dir, tuning))
        assert finished is not None
        assert finished("gaussian r=0").run_id == "k1"
        assert finished("gaussian r=0.5") is None
        tr = child("gaussian", 0.5)
        assert tr.inner.parent_run_id == new
        return [SimpleNamespace(source="gaussian", ratio=0.5,
                                result=SimpleNamespace(best_val=0.75,
                                                       best_test={"balanced_accuracy": 0.5}),
                                contamination={"n_ood": 12})]

    monkeypatch.setattr(proto, "run_contamination", fake_run)
    r = CliRunner().invoke(main, [*ARGS, "-v"])
    assert r.exit_code == 0, r.output
    assert calls[0] == ("killed_sweep", exp)
    assert calls[1] == ("run", ["gaussian"], [0.0, 0.5], None, "once")
    assert calls[2:] == [("table", new), ("plot", "diagnostics_vs_ratio.png")]
    out = r.output
    assert (f"[scarcelab] resuming contamination sweep run {killed} (its process died): "
            "1 finished child studies kept") in out
    assert ("child 1/3: gaussian r=0: finished before the sweep was killed (run k1), kept"
            in out)
    assert "child 2/3: gaussian r=0.5" in out
    assert "gaussian r=0.5: best val 0.7500, test 0.5000 (n_ood=12)" in out
    assert "TABLE-MD" in out
    assert "contamination sweep fixmatch on synthetic_tiny: 1 child studies" in out
    assert f"parent run: {new}" in out

    old = c.get_run(killed)
    assert old.info.status == "FAILED"
    assert old.data.tags["scarcelab.resumed_by"] == new
    assert c.get_run(orphan.info.run_id).data.tags["mlflow.parentRunId"] == new
    parent = c.get_run(new)
    assert parent.info.status == "FINISHED"
    tags = parent.data.tags
    assert tags["scarcelab.resumed_from"] == killed
    assert tags["scarcelab.role"] == "contamination"
    assert tags["scarcelab.family"] == "semi"
    assert tags["scarcelab.ood"] == "gaussian" and tags["scarcelab.ratios"] == "0,0.5"
    assert tags["scarcelab.sweep_key"] == keys[0] and keys[0].startswith("sweep-")
    assert tags["mlflow.runName"] == "new"
    assert "mlflow.note.content" not in tags
    params = parent.data.params
    assert params["ratios"] == "0,0.5,0.5" and params["resolved.ratios"] == "0,0.5"
    # the default --tuning is logged as itself (it was '' with resolved.tuning=once: a
    # click.Choice records no raw text for entry_params)
    assert params["tuning"] == "once" and "resolved.tuning" not in params
    assert params["method"] == "fixmatch" and "''" not in params.values(), params
    assert {a.path for a in c.list_artifacts(new)} == {
        "contamination_table.csv", "contamination_table.md", "diagnostics_vs_ratio.png"}


def test_a_failing_sweep_closes_its_fresh_parent_failed_with_the_users_name_and_note(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scarcelab.entrypoints.cli import main
    from scarcelab.protocols import contamination as proto
    from scarcelab.tracking import contamination as view

    c = _store(tmp_path, monkeypatch)
    monkeypatch.delenv("OPTUNA_STORAGE", raising=False)
    calls: list[Any] = []
    _fake_view(monkeypatch, calls)
    monkeypatch.setattr(view, "killed_sweep",
                        lambda *a: pytest.fail("no storage: no resume lookup"))

    def fake_run(cfg: Any, sources: list[str], ratios: list[float], child: Any,
                 ood_dir: Any = None, tuning: str = "", finished: Any = None) -> list[Any]:
        assert finished is None
        child("gaussian", 0.0)
        raise ConfigError("boom in the sweep")

    monkeypatch.setattr(proto, "run_contamination", fake_run)
    r = CliRunner().invoke(main, [*ARGS, "--experiment", "fresh", "--run-name", "mine",
                                  "--description", "a note", "--tags", "k=v",
                                  "--tuning", "per_ratio", "-v"])
    assert r.exit_code == 1, r.output
    assert "Error: boom in the sweep" in r.output
    assert "child 1/2: gaussian r=0" in r.output  # per_ratio: no tuning study
    assert calls == []
    exp = c.get_experiment_by_name("fresh").experiment_id
    (run,) = c.search_runs([exp])
    assert run.info.status == "FAILED"
    assert run.info.run_name == "mine"
    assert run.data.tags["mlflow.note.content"] == "a note"
    assert run.data.tags["k"] == "v"
    assert run.data.tags["scarcelab.sweep_key"].startswith("sweep-")
    assert run.data.params["tuning"] == "per_ratio"
    assert "resolved.tuning" not in run.data.params
