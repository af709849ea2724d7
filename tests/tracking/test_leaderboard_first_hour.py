"""``scarcelab leaderboard`` as a newcomer meets it (issue 43 §3): no ``--experiment``
needed when the studies went to ``Default``; a table that fits an 80-column terminal; and
studies of different time budgets never ranked or tested against each other silently (the
CLI and ``tracking.query.significance``). Against a real sqlite MLflow store."""

from __future__ import annotations

import warnings

import mlflow
import pytest
from click.testing import CliRunner
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from scarcelab.tracking import query

T0 = 1_700_000_000_000
#: (method, family, budget_minutes, per-seed test balanced accuracy): sup at 0.5 min is
#: at chance, as the issue's 0.5-minute study was; at 3 min it beats fixmatch
STUDIES = [("sup", "supervised", 0.5, [0.50, 0.50, 0.51]),
           ("sup", "supervised", 3.0, [0.80, 0.82, 0.81]),
           ("fixmatch", "semi", 3.0, [0.70, 0.74, 0.69])]


def _log(c: MlflowClient, exp: str, method: str, family: str, budget: float, seed: int,
         test: float, start: int) -> None:
    tags = {"scarcelab.role": "study", "scarcelab.family": family,
            "scarcelab.method": method, "scarcelab.dataset": "breastmnist",
            "scarcelab.seed": str(seed)}
    r = c.create_run(exp, start_time=start, tags=tags, run_name=f"{method}-s{seed}")
    c.log_batch(r.info.run_id,
                params=[Param("n_labeled", "40"), Param("budget_minutes", f"{budget:g}")],
                metrics=[Metric("best/val_balanced_accuracy", test - 0.01, T0, 0),
                         Metric("best/test_balanced_accuracy", test, T0, 0),
                         Metric("best/test_accuracy", test, T0, 0),
                         Metric("best/test_auroc", test + 0.05, T0, 0),
                         Metric("time/elapsed_s", 10.0, T0, 0)])
    c.set_terminated(r.info.run_id, "FINISHED", end_time=start + 100)


@pytest.fixture
def default_store(store):  # type: ignore[no-untyped-def]
    """Every study in ``Default`` (no --experiment), as in the issue; an empty experiment
    beside it."""
    c = MlflowClient()
    c.create_experiment("empty")
    i = 0
    for method, family, budget, tests in STUDIES:
        for seed, test in enumerate(tests):
            _log(c, "0", method, family, budget, seed, test, T0 + 1000 * i)
            i += 1
    return store


def _run(args: list[str], monkeypatch: pytest.MonkeyPatch, terminal: bool = False,
         width: int = 80):  # type: ignore[no-untyped-def]
    import scarcelab.entrypoints.leaderboard as lbcmd
    from scarcelab.entrypoints.cli import main

    monkeypatch.setattr(lbcmd, "_on_terminal", lambda: terminal)
    monkeypatch.setenv("COLUMNS", str(width))  # what shutil.get_terminal_size reads first
    return CliRunner().invoke(main, ["leaderboard", *args])


def test_without_experiment_it_reads_the_experiments_holding_studies(default_store,
                                                                     monkeypatch) -> None:
    r = _run([], monkeypatch)
    assert r.exit_code == 0, r.output
    assert "experiments: Default (" in r.stderr  # not the empty one
    assert "empty" not in r.stderr
    assert r.stdout.count("\n") == 1 + 3  # CSV: header + 3 variants, 9 studies
    c = MlflowClient()
    named = c.create_experiment("mine")
    _log(c, named, "sup", "supervised", 3.0, 7, 0.9, T0 + 99_000)
    r = _run([], monkeypatch)
    assert r.exit_code == 0, r.output
    assert "experiments: Default, mine (" in r.stderr


def test_without_any_study_it_says_so_in_one_line(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    MlflowClient().create_experiment("empty")
    r = _run([], monkeypatch)
    assert r.exit_code != 0
    errors = [ln for ln in r.output.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "no scarcelab studies" in errors[0], r.output
    assert "--experiment" in errors[0] and "Traceback" not in r.output


def test_the_terminal_table_fits_80_columns(default_store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    r = _run(["--experiment", "Default"], monkeypatch, terminal=True, width=80)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80, r.stdout
    header = lines[0].split()
    assert {"dataset", "budget_minutes", "method", "test_balanced_accuracy"} <= set(header)
    assert "columns shown; --columns all" in r.stderr
    wide = _run(["--experiment", "Default"], monkeypatch, terminal=True, width=200)
    assert "test_auroc" in wide.stdout.splitlines()[0]  # room for more on a wide terminal
    every = _run(["--experiment", "Default", "--columns", "all"], monkeypatch, terminal=True)
    assert max(map(len, every.stdout.splitlines())) > 80  # what it was before
    pick = _run(["--experiment", "Default", "--columns", "method,test_auroc"], monkeypatch,
                terminal=True)
    assert pick.stdout.splitlines()[0].split() == ["method", "test_auroc"]
    csv = _run(["--experiment", "Default", "--columns", "method,test_auroc"], monkeypatch)
    assert csv.stdout.splitlines()[0] == "method,test_auroc_mean,test_auroc_std"
    bad = _run(["--experiment", "Default", "--columns", "nosuch"], monkeypatch)
    assert bad.exit_code == 2 and "--columns" in bad.output and "nosuch" in bad.output


def test_budgets_are_ranked_apart_and_the_cli_says_so(default_store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    r = _run(["--experiment", "Default", "--columns", "method,budget_minutes"], monkeypatch)
    assert r.exit_code == 0, r.output
    rows = [ln.split(",") for ln in r.stdout.splitlines()[1:]]
    # the 0.5-minute block first, then the 3-minute one, best first within it
    assert rows == [["sup", "0.5"], ["sup", "3.0"], ["fixmatch", "3.0"]]
    assert "breastmnist (n=40): 0.5, 3 min" in r.stderr
    sig = _run(["--experiment", "Default", "--view", "significance"], monkeypatch)
    assert sig.exit_code == 0 and "0.5, 3 min" in sig.stderr


def test_significance_never_tests_across_time_budgets(default_store) -> None:  # type: ignore[no-untyped-def]
    t = query.load("Default", mlflow.get_tracking_uri())
    with pytest.warns(UserWarning, match=r"time budget.*breastmnist \(n=40\): 0\.5, 3 min"):
        sig = query.significance(t)
    assert list(sig["budget_minutes"]) == [0.5, 3.0, 3.0]
    # within 3 minutes sup is best and fixmatch is tested against it; the 0.5-minute sup is
    # alone in its block (before: it was tested against the 3-minute sup and was "worse")
    assert set(sig[sig.budget_minutes == 3.0].best_method) == {"sup (budget_minutes=3)"}
    half = sig[sig.budget_minutes == 0.5].iloc[0]
    assert half["best_method"] == half["method"] and not half["significantly_worse"]
    one = query.load("Default", mlflow.get_tracking_uri())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one budget: nothing to say
        query.significance(one, budget_minutes=3)
