"""``scarcelab al-report`` on any experiment (issue 24): a few AL runs that do not make a
complete comparison get a rank table and a sentence saying what cannot be ranked and why,
not ``ValueError: need at least 1 methods (columns), got 0``.

The runs are logged with the MLflow client (tags and metric as ``scarcelab al`` logs them),
so the test reads the same store layout as the real command without running AL."""

from __future__ import annotations

import math

import mlflow
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from scarcelab.entrypoints.cli import main


def _al_run(client: MlflowClient, exp: str, dataset: str, strategy: str, rep: int,
            auc: float, q: int = 1) -> None:
    run = client.create_run(exp, tags={
        "scarcelab.role": "al", "scarcelab.family": "active", "scarcelab.dataset": dataset,
        "scarcelab.method": strategy, "scarcelab.query_size": str(q),
        "scarcelab.repetition": str(rep)})
    client.log_metric(run.info.run_id, "al/auc", auc)
    client.set_terminated(run.info.run_id, "FINISHED")


@pytest.fixture(scope="module")
def store(tmp_path_factory):  # type: ignore[no-untyped-def]
    """One sqlite store for the module (its creation is most of the cost); each test
    writes its own experiment."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('alreport') / 'mlflow.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    mp.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    yield MlflowClient()
    mp.undo()


# (dataset, strategy, repetition, auc) per run; what the note must say
CASES = {
    # the experiment: two AL runs of honeypot, one of splice, no strategy on both
    "no strategy on every problem": (
        [("honeypot", "random", 0, 0.70), ("honeypot", "margin", 0, 0.74),
         ("splice", "badge", 0, 0.76)],
        "no strategy was run on every (dataset, query size) problem"),
    "one strategy repeated, another elsewhere": (
        [("honeypot", "random", 0, 0.70), ("honeypot", "random", 1, 0.72),
         ("splice", "margin", 0, 0.76)],
        "honeypot q=1: random; splice q=1: margin"),
    "no shared repetition": (
        [("honeypot", "random", 0, 0.70), ("honeypot", "margin", 1, 0.74),
         ("splice", "random", 0, 0.76), ("splice", "margin", 0, 0.77)],
        "honeypot q=1: its strategies (margin, random) share no repetition"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_al_report_ranks_what_it_can_and_says_why_not_the_rest(store, case):
    runs, words = CASES[case]
    name = "few-al-" + case.replace(" ", "-").replace(",", "")
    exp = store.create_experiment(name)
    for ds, strat, rep, auc in runs:
        _al_run(store, exp, ds, strat, rep, auc)
    r = CliRunner().invoke(main, ["al-report", "--experiment", name, "--no-log"])
    assert r.exit_code == 0, r.output
    assert r.exception is None, r.exception
    notes = [ln for ln in r.output.splitlines() if ln.startswith("note: ")]
    assert any(words in n for n in notes), r.output
    # and with --log the report run is written, notes included
    r = CliRunner().invoke(main, ["al-report", "--experiment", name])
    assert r.exit_code == 0, r.output
    rid = r.output.split("report run ")[1].split()[0]
    text = mlflow.artifacts.load_text(f"runs:/{rid}/al_notes.txt")
    assert words in text


def test_rank_table_keeps_the_problems_it_can_rank(store):
    from scarcelab.tracking.al import al_runs, rank_table

    exp = store.create_experiment("mixed")
    for ds, strat, rep, auc in CASES["no strategy on every problem"][0]:
        _al_run(store, exp, ds, strat, rep, auc)
    notes: list[str] = []
    table = rank_table(al_runs(["mixed"]), notes)
    # honeypot ranks margin (0.74) above random (0.70); splice has badge alone
    assert table.loc[("honeypot", 1), "margin"] == 1.0
    assert table.loc[("honeypot", 1), "random"] == 2.0
    assert table.loc[("splice", 1), "badge"] == 1.0
    assert all(math.isnan(v) for v in table.loc[("mean", "all")])
    assert len(notes) == 1 and "badge" in notes[0] and "honeypot q=1" in notes[0]


def test_a_complete_comparison_has_no_notes_and_its_cd_diagram(store):
    from scarcelab.tracking.al import al_report

    exp = store.create_experiment("complete")
    for rep in range(3):
        for ds in ("honeypot", "splice"):
            for k, strat in enumerate(("random", "margin", "badge")):
                _al_run(store, exp, ds, strat, rep, 0.70 + 0.01 * k + 0.001 * rep)
    rep = al_report(["complete"], log=False)
    assert rep.notes == []
    assert rep.friedman is not None and rep.pairwise is not None
    assert list(rep.ranks.loc[("mean", "all")].sort_values().index) == ["badge", "margin",
                                                                        "random"]
