"""The view template: every registered view builds, has a note, draws its declared figures,
is a ``leaderboard --view`` choice and names real entry points; the report's sections,
the CLI's choices and a sweep's report parts are all read from the registry.

One small sqlite store holds runs of every kind a view reads (studies with their trials,
AL runs, tune retrains, probe runs, a contamination child study), logged with the MLflow
client as the entry points tag them, so the template runs over each view as it is
registered — a new view is tested here without being named.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from scarcelab.entrypoints.cli import main
from scarcelab.errors import ConfigError
from scarcelab.tracking import query
from scarcelab.tracking.query import registry, render, report

T0 = 1_700_000_000_000
EXP = "views"
ROOT = Path(__file__).resolve().parents[3]


def _study(c: MlflowClient, exp: str, method: str, family: str, dataset: str, seed: int,
           score: float, extra: dict[str, str] | None = None) -> str:
    """A finished study with one trial of two evaluated epochs and its best/* series."""
    tags = {"scarcelab.role": "study", "scarcelab.family": family,
            "scarcelab.method": method, "scarcelab.dataset": dataset,
            "scarcelab.seed": str(seed), **(extra or {})}
    sid = c.create_run(exp, start_time=T0 + seed, tags=tags).info.run_id
    tid = c.create_run(exp, start_time=T0 + seed, tags={
        **tags, "scarcelab.role": "trial", "scarcelab.trial": "0",
        "mlflow.parentRunId": sid}).info.run_id
    trial, best = [], []
    for ep, (val, el) in enumerate(((score - 0.1, 10.0), (score, 20.0))):
        ts = T0 + int(el * 1000)
        trial += [Metric("val/balanced_accuracy", val, ts, ep),
                  Metric("test/balanced_accuracy", val - 0.05, ts, ep),
                  Metric("time/elapsed_s", el, ts, ep),
                  Metric("diag/cci", 0.1 * (ep + 1), ts, ep)]
        best += [Metric("best/val_balanced_accuracy", val, ts, ep),
                 Metric("best/test_balanced_accuracy", val - 0.05, ts, ep),
                 Metric("time/elapsed_s", el, ts, ep)]
    c.log_batch(tid, metrics=trial)
    c.set_terminated(tid, "FINISHED")
    c.log_batch(sid, metrics=best)
    c.set_terminated(sid, "FINISHED")
    return sid


@pytest.fixture(scope="module")
def store() -> Iterator[str]:
    shm = Path("/dev/shm")  # sqlite on tmpfs when there is one: MLflow commits every call
    root = Path(tempfile.mkdtemp(prefix="scarcelab-views-", dir=shm if shm.is_dir() else None))
    uri = f"sqlite:///{root}/mlflow.db"
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment(EXP, artifact_location=str(root / "artifacts"))
    methods = {"sup": ("supervised", 0.6), "mixup": ("supervised", 0.55),
               "fixmatch": ("semi", 0.7)}
    for m, (fam, base) in methods.items():
        for d, ds in enumerate(("dA", "dB")):
            for seed in (0, 1):
                _study(c, exp, m, fam, ds, seed, base + 0.05 * d + 0.01 * seed)
    for s, auc in {"s1": 0.8, "s2": 0.7, "s3": 0.6}.items():
        for ds in ("dA", "dB"):
            for rep in (0, 1):
                r = c.create_run(exp, tags={
                    "scarcelab.role": "al", "scarcelab.family": "active",
                    "scarcelab.dataset": ds, "scarcelab.strategy": s,
                    "scarcelab.query_size": "2", "scarcelab.repetition": str(rep)}).info.run_id
                c.log_metric(r, "al/auc", auc + 0.01 * rep)
                c.set_terminated(r, "FINISHED")
    for m, vals in {"ce": [0.50, 0.54], "ole": [0.30, 0.32]}.items():
        tags = {"scarcelab.role": "study", "scarcelab.protocol": "tune",
                "scarcelab.method": m, "scarcelab.dataset": "cifair10",
                "scarcelab.family": "supervised"}
        study = c.create_run(exp, tags=tags).info.run_id
        for i, v in enumerate(vals):
            r = c.create_run(exp, tags={**tags, "scarcelab.role": "retrain",
                                        "scarcelab.retrain": str(i),
                                        "mlflow.parentRunId": study}).info.run_id
            c.log_metric(r, "test/balanced_accuracy", v)
            c.set_terminated(r, "FINISHED")
        c.set_terminated(study, "FINISHED")
    for enc, acc in {"random": 0.5, "weights.pt": 0.7}.items():
        r = c.create_run(exp, tags={"scarcelab.task": "probe", "scarcelab.protocol": "linear",
                                    "scarcelab.encoder": enc,
                                    "scarcelab.dataset": "pathology_crops"}).info.run_id
        c.log_metric(r, "test/accuracy", acc)
        c.set_terminated(r, "FINISHED")
    # a contamination child study (best trial: 0); one ratio, so that it is no variant
    # of its own that would leave every dataset incomplete for the CD diagram
    _study(c, exp, "fixmatch", "semi", "dC", 0, 0.6, {
        "scarcelab.ratio": "0.5", "scarcelab.ood": "svhn", "scarcelab.ood_kind": "far",
        "scarcelab.best_trial": "0"})
    yield uri
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def tracked(store: str) -> query.Tracked:
    return query.load(EXP, store)


NAMES = registry.view_names()


def test_the_registry_holds_every_view_that_was_in_a_list():
    """The five report views, transfer (missing from the CLI's list before), Table 3,
    Table A1 and the AL ranks: all registered, the report's sections in their order with
    the leaderboard first (the CLI re-sorts that section by --sort-by)."""
    assert {"leaderboard", "gains", "profile", "significance", "ranks", "transfer",
            "table3", "contamination", "al_ranks"} <= set(NAMES)
    assert registry.report_views() == ["leaderboard", "gains", "profile", "significance",
                                       "ranks"]
    assert report.ALL_VIEWS == tuple(registry.report_views())
    assert list(query.VIEWS) == NAMES and query.VIEWS["transfer"] is query.transfer


@pytest.mark.parametrize("name", NAMES)
def test_view_template(name: str, store: str, tracked: query.Tracked):
    """Every view: builds a non-empty table from the store (leaving the process's
    tracking URI alone), has a note, draws every figure it declares (a PNG), and
    ``leaderboard --view <name>`` prints that table."""
    import mlflow

    v = registry.get(name)
    assert len(v.note.split()) >= 8, f"{name}: a note says how the view is computed"
    before = mlflow.get_tracking_uri()
    table = report.compute(tracked, name, source="auto")
    assert mlflow.get_tracking_uri() == before, "a query moved the process's tracking URI"
    assert isinstance(table, pd.DataFrame) and len(table), f"{name}: no rows"
    (sec,) = report.sections(tracked, [name])
    assert sec.title == name and sec.note.startswith(v.note)
    assert set(sec.figures) == set(v.figures)
    for fig_name, fig in sec.figures.items():
        assert fig is not None, f"{name}: figure {fig_name} not drawn"
        assert render.png_bytes(fig).startswith(b"\x89PNG"), fig_name
    res = CliRunner().invoke(main, ["leaderboard", "--experiment", EXP, "--tracking-uri",
                                    store, "--view", name, "--format", "csv"])
    assert res.exit_code == 0, res.output
    # the view's warnings are "note:" lines on stderr; stdout is the CSV alone
    assert res.stdout == render.to_csv(report.compute(query.load(EXP, store), name,
                                                      source="auto"))


@pytest.mark.parametrize("name", NAMES)
def test_view_entries_are_entry_points(name: str):
    """A view's entries name MLproject entry points (or every grid): a typo would silently
    drop the view from every sweep report."""
    entries = set(yaml.safe_load((ROOT / "MLproject").read_text())["entry_points"])
    v = registry.get(name)
    assert v.entries <= entries | {registry.EVERY_ENTRY}, sorted(v.entries - entries)
    if not v.section:  # a file of its own in the sweep report needs a text rendering
        assert v.entries, f"{name}: a table file no sweep writes"


def test_sweep_parts_follow_the_entries():
    """What the sweep driver used to hard-code: every grid gets the leaderboard and ranks
    page; tune adds Table 3, contamination Table A1, probe / segment the transfer view."""
    def names(*entries: str) -> list[str]:
        return [v.name for v in registry.sweep_views(entries)]

    assert names("study") == ["leaderboard", "ranks"]
    assert names("al") == ["leaderboard", "ranks"]
    assert names("tune") == ["leaderboard", "ranks", "table3"]
    assert names("contamination") == ["leaderboard", "ranks", "contamination"]
    assert names("probe") == names("segment") == ["leaderboard", "ranks", "transfer"]
    assert names("self", "probe", "tune") == ["leaderboard", "ranks", "table3", "transfer"]


def test_cli_choices_are_the_registry():
    """``--view`` offers every registered view, transfer included (the CLI's own list
    lacked it while the query layer had it)."""
    cmd = main.get_command(None, "leaderboard")  # type: ignore[arg-type]
    (opt,) = [p for p in cmd.params if p.name == "view"]
    assert list(opt.type.choices) == NAMES and "transfer" in opt.type.choices
    res = CliRunner().invoke(main, ["leaderboard", "--experiment", "x", "--view", "nope"])
    assert res.exit_code == 2 and "transfer" in res.output


def test_a_new_view_is_a_choice_and_a_section_without_editing_a_list(tracked: query.Tracked):
    """Registering one function is all a new view takes: the CLI accepts it, the report
    builds its section with its note and figure."""
    import matplotlib.pyplot as plt

    calls = []

    def draw(t, df, filters):  # type: ignore[no-untyped-def]
        calls.append(len(df))
        return plt.figure()

    @registry.view("toy_counts", note="How many runs of each role the experiments hold.",
                   figures={"toy": draw})
    def toy(t, **filters):  # type: ignore[no-untyped-def]
        return t.runs.groupby("role").size().rename("n").reset_index()

    try:
        assert "toy_counts" in registry.view_names()
        cmd = main.get_command(None, "leaderboard")  # type: ignore[arg-type]
        (opt,) = [p for p in cmd.params if p.name == "view"]
        assert "toy_counts" in opt.type.choices
        (sec,) = report.sections(tracked, ["toy_counts"])
        n = dict(zip(sec.table["role"], sec.table["n"], strict=True))
        assert n["al"] == 12 and n["retrain"] == 4
        assert calls == [len(sec.table)] and sec.note.startswith("How many")
        plt.close(sec.figures["toy"])
        assert "toy_counts" not in registry.report_views()  # not asked for
    finally:
        registry.REGISTRY._entries.pop("toy_counts")


def test_a_view_without_a_note_or_twice_is_refused():
    with pytest.raises(ValueError, match="give a note"):
        registry.view("quiet", note=" ")
    with pytest.raises(ConfigError, match="registered twice"):
        registry.view("leaderboard", note="another leaderboard")(lambda t: t)
    with pytest.raises(ValueError, match="unknown view 'nope'.*transfer"):
        report.sections(query.Tracked(pd.DataFrame(), None, []), ["nope"])  # type: ignore[arg-type]


def test_the_cli_parses_view_without_importing_the_query_layer():
    """``--view`` is checked before pandas, scipy or MLflow are imported (the house rule
    of every command's options): the names come from the view files' ``@view`` calls,
    read with ``ast``, and are the registry's own, in its order."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from scarcelab.entrypoints.cli import main\n"
        "r = CliRunner().invoke(main, ['leaderboard', '--experiment', 'x', '--view', 'no'])\n"
        "heavy = sorted(m for m in ('pandas', 'scipy', 'mlflow') if m in sys.modules)\n"
        "from scarcelab.tracking.query.registry import static_view_names, view_names\n"
        "static = static_view_names()\n"
        "print(r.exit_code, heavy, static == view_names(), static)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         check=True).stdout.strip()
    assert out == f"2 [] True {NAMES}", out


def test_static_view_names_read_from_the_view_files_are_the_registrys(monkeypatch):
    """The ``ast`` reading alone (nothing registered yet, as in a fresh CLI process) finds
    every ``@view("name", …)`` of the package's files, in the registry's order — in this
    process, so the reading itself is what is checked."""
    names = registry.view_names()
    monkeypatch.setattr(registry.REGISTRY, "_loaded", False)
    monkeypatch.setattr(registry.REGISTRY, "_entries", {})
    assert registry.static_view_names() == names


def test_sections_silence_only_the_views_user_warnings(tracked):
    """``sections`` quiets the views' UserWarnings (their notes say it); any other warning,
    e.g. numpy's RuntimeWarning or a pandas FutureWarning, still reaches the caller."""
    import warnings

    @registry.view("noisy_counts", note="Runs per role, with two warnings.")
    def noisy(t, **filters):  # type: ignore[no-untyped-def]
        warnings.warn("said in the note", UserWarning, stacklevel=2)
        warnings.warn("mean of empty slice", RuntimeWarning, stacklevel=2)
        return t.runs.groupby("role").size().rename("n").reset_index()

    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            (sec,) = report.sections(tracked, ["noisy_counts"])
        assert [(w.category, str(w.message)) for w in seen] == [
            (RuntimeWarning, "mean of empty slice")]
        assert not sec.table.empty
    finally:
        registry.REGISTRY._entries.pop("noisy_counts")
