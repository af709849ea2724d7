"""Every experiment scarcelab writes studies into carries MLflow 3's classic-ML experiment
kind, so that the MLflow UI opens it on the runs, not on the GenAI overview (issue 43 §3).
Against a real sqlite MLflow store, never a mock."""

from __future__ import annotations

from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from scarcelab.tracking.experiment_kind import (
    CLASSIC_ML,
    KIND_TAG,
    WORKFLOW_QUERY,
    experiment_url,
)

TINY = ["--dataset", "synthetic_tiny", "--arch", "small_cnn", "--device", "cpu",
        "--max-epochs", "1", "--batch-size", "16", "--max-steps-per-epoch", "2",
        "--max-trials", "1", "--budget-minutes", "1", "-q"]


def _study(*extra: str) -> str:
    from scarcelab.entrypoints.cli import main

    res = CliRunner().invoke(main, ["supervised", "--method", "sup", *TINY, *extra])
    assert res.exit_code == 0, res.output
    return res.output


def _kind(c: MlflowClient, exp_id: str) -> str | None:
    return c.get_experiment(exp_id).tags.get(KIND_TAG)


def test_the_tag_is_the_one_mlflows_ui_reads() -> None:
    """The key and value are read from MLflow's own UI bundle: if a later MLflow renames
    them, this fails instead of the tag silently doing nothing."""
    from pathlib import Path

    import mlflow

    js = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    if not js.is_dir():  # a skinny MLflow without the UI: nothing to open anyway
        return
    bundle = "".join(p.read_text(errors="replace") for p in js.glob("*.js"))
    assert f'"{KIND_TAG}"' in bundle
    assert f'CUSTOM_MODEL_DEVELOPMENT="{CLASSIC_ML}"' in bundle


def test_every_experiment_a_study_writes_to_is_classic_ml(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # logging a model calls mlflow.set_experiment, which exports MLFLOW_EXPERIMENT_ID to
    # this (test) process: the Default study goes first, as in a newcomer's fresh store
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    c = MlflowClient()
    assert _kind(c, "0") is None
    out = _study()  # no --experiment: MLflow's Default, where a newcomer's runs go
    assert _kind(c, "0") == CLASSIC_ML
    # MLflow 3.17's UI goes by the browser's workflow type: the address printed says it
    assert f"then open http://127.0.0.1:5000/#/experiments/0?{WORKFLOW_QUERY}" in out
    _study("--experiment", "fresh")  # one scarcelab creates
    fresh = c.get_experiment_by_name("fresh")
    assert fresh is not None and fresh.tags.get(KIND_TAG) == CLASSIC_ML
    made = c.create_experiment("made-by-hand")  # `mlflow experiments create`: no kind
    _study("--experiment", "made-by-hand")
    assert _kind(c, made) == CLASSIC_ML


def test_a_kind_the_user_chose_is_kept(store) -> None:  # type: ignore[no-untyped-def]
    c = MlflowClient()
    chosen = c.create_experiment("chosen", tags={KIND_TAG: "genai_development"})
    _study("--experiment", "chosen")
    assert _kind(c, chosen) == "genai_development"


def test_contamination_and_report_experiments_are_classic_ml(store, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.entrypoints.contamination import _experiment_id
    from scarcelab.tracking.query.report import log_report

    c = MlflowClient()
    exp = _experiment_id(c, None, "contam")
    assert _kind(c, exp) == CLASSIC_ML
    page = tmp_path / "page" / "index.md"
    page.parent.mkdir()
    page.write_text("# report\n")
    log_report({"page": page}, experiment="reports", run_name="r")
    assert c.get_experiment_by_name("reports").tags.get(KIND_TAG) == CLASSIC_ML


def test_the_printed_address_opens_the_runs_and_never_shows_a_password() -> None:
    q = WORKFLOW_QUERY
    assert experiment_url("http://ana:s3cret@127.0.0.1:5000/", "7") == \
        f"http://127.0.0.1:5000/#/experiments/7?{q}"
    assert experiment_url("https://mlflow.example.org/team", "0") == \
        f"https://mlflow.example.org/team/#/experiments/0?{q}"
    assert experiment_url("http://[::1]:5000", "3") == f"http://[::1]:5000/#/experiments/3?{q}"
    assert experiment_url("sqlite:///m.db", "0") is None
    assert experiment_url("file:///tmp/mlruns", "0") is None
    # the query value is the one MLflow's UI bundle accepts
    from pathlib import Path

    import mlflow

    js = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    if js.is_dir():
        bundle = "".join(p.read_text(errors="replace") for p in js.glob("main.*.js"))
        assert 'get("workflowType")' in bundle and 'MACHINE_LEARNING="machine_learning"' in bundle
