"""Behaviours of tracking/stats.py, tracking/al.py and tracking/query/{render,report}.py that
the seeded mutation sample of the query layer (docs/mutation.md) showed no test checked.

Expected values are hand-derived from the documented contracts: the CD diagram's geometry
(Demšar 2006, Fig. 1: average-rank axis, methods labelled below it, clique bars, the Nemenyi
CD as a scale bar) is checked as relations between the drawn artists, not as pixel
constants; the MLflow behaviours go through a real sqlite store in a temporary folder."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from scarcelab.tracking import stats  # noqa: E402
from scarcelab.tracking.query import render  # noqa: E402

# -- CD diagram ------------------------------------------------------------------------
K, N = 4, 10
NAMES = ["A", "B", "C", "D"]


def _ordered_scores() -> pd.DataFrame:
    """A beats B beats C beats D on every one of 10 problems, by distinct margins: every
    pair's Wilcoxon signed-rank test is exact with all 10 differences of one sign, so
    p = 2 / 2**10 = 0.001953 for each of the 6 pairs and Holm makes every adjusted p
    6 * 0.001953 = 0.0117 (the running max of (6 - i) * p). At alpha = 0.05 every pair
    differs (no clique); at alpha = 0.01 none does (one clique A-D). Ranks are 1, 2, 3, 4."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.3, size=(N, 1))
    offsets = np.array([3.0, 2.0, 1.0, 0.0]) * 0.1
    noise = rng.uniform(0.0, 0.05, size=(N, K))
    return pd.DataFrame(base + offsets + noise, columns=NAMES)


def _lines(fig) -> list[Line2D]:  # type: ignore[no-untyped-def]
    return list(fig.axes[0].get_lines())


def _axis_line(fig) -> Line2D:  # type: ignore[no-untyped-def]
    """The rank axis: the longest thin horizontal black line (clique bars are thick)."""
    cands = [ln for ln in _lines(fig) if mcolors.same_color(ln.get_color(), "black")
             and ln.get_linewidth() < 2 and len(ln.get_xdata()) == 2
             and ln.get_ydata()[0] == ln.get_ydata()[1]]
    return max(cands, key=lambda ln: abs(ln.get_xdata()[1] - ln.get_xdata()[0]))


def _xpos(fig, rank: float) -> float:  # type: ignore[no-untyped-def]
    """x of a rank on the drawn axis (rank 1 at its left end, rank K at its right end)."""
    x0, x1 = sorted(_axis_line(fig).get_xdata())
    return x0 + (rank - 1) / (K - 1) * (x1 - x0)


def _clique_bars(fig) -> list[Line2D]:  # type: ignore[no-untyped-def]
    return [ln for ln in _lines(fig) if ln.get_linewidth() == 3.5]


def _labels(fig) -> dict[str, matplotlib.text.Text]:  # type: ignore[no-untyped-def]
    pat = re.compile(r"^([A-D]) \(\d\.\d\d\)$")
    return {m.group(1): t for t in fig.axes[0].texts if (m := pat.match(t.get_text()))}


def _data_bbox(fig, artist):  # type: ignore[no-untyped-def]
    """An artist's rendered extent in data units (the axes fill the figure, y in inches)."""
    fig.canvas.draw()
    bb = artist.get_window_extent(fig.canvas.get_renderer())
    return bb.transformed(fig.axes[0].transData.inverted())


def _half_lw(fig, line: Line2D) -> float:  # type: ignore[no-untyped-def]
    """Half a line's thickness in data y units (points -> pixels -> data)."""
    ax = fig.axes[0]
    px = line.get_linewidth() / 72.0 * fig.dpi / 2
    return float(ax.transData.inverted().transform((0, px))[1]
                 - ax.transData.inverted().transform((0, 0))[1])


@pytest.fixture(scope="module")
def cd_fig_clique():  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    fig = stats.cd_diagram(_ordered_scores(), alpha=0.01, title="t")
    yield fig
    plt.close(fig)


@pytest.fixture(scope="module")
def cd_fig_no_clique():  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    fig = stats.cd_diagram(_ordered_scores(), alpha=0.05)
    yield fig
    plt.close(fig)


def test_cd_diagram_cliques_follow_the_alpha_passed(cd_fig_clique, cd_fig_no_clique):
    """At alpha = 0.01 no Holm-adjusted p (0.0117) is significant: one bar joins A..D; at
    0.05 all pairs differ and no bar is drawn. The bar starts at its first member's rank
    and ends at its last member's (a hair beyond each end, never at another member)."""
    assert _clique_bars(cd_fig_no_clique) == []
    bars = _clique_bars(cd_fig_clique)
    assert len(bars) == 1
    xs, ys = bars[0].get_xdata(), bars[0].get_ydata()
    assert ys[0] == ys[1]
    step = _xpos(cd_fig_clique, 2) - _xpos(cd_fig_clique, 1)
    assert _xpos(cd_fig_clique, 1) - 0.1 * step < xs[0] <= _xpos(cd_fig_clique, 1)
    assert _xpos(cd_fig_clique, K) <= xs[1] < _xpos(cd_fig_clique, K) + 0.1 * step
    assert "α = 0.01" in cd_fig_clique.axes[0].texts[0].get_text()


def test_cd_bar_spans_the_nemenyi_cd_above_the_rank_axis(cd_fig_clique):
    """The scale bar is a horizontal dimgray segment starting at rank 1 whose length, in
    rank units of the drawn axis, is nemenyi_cd(k, N, alpha) of this diagram (k = 4,
    N = 10, alpha = 0.01: 1.80), placed between the axis and the title."""
    cd = stats.nemenyi_cd(K, N, 0.01)
    assert 1.5 < cd < K - 1  # drawn only when shorter than the axis
    fig = cd_fig_clique
    cand = [ln for ln in _lines(fig) if mcolors.same_color(ln.get_color(), "dimgray")
            and ln.get_linewidth() == 1.2]
    assert len(cand) == 1
    xs, ys = cand[0].get_xdata(), cand[0].get_ydata()
    assert len(ys) == 2 and ys[0] == ys[1]  # horizontal
    axis = _axis_line(fig)
    assert ys[0] > axis.get_ydata()[0]
    assert xs[0] == pytest.approx(_xpos(fig, 1))
    step = _xpos(fig, 2) - _xpos(fig, 1)
    assert (xs[1] - xs[0]) / step == pytest.approx(cd, rel=1e-9)
    assert any(t.get_text() == f"Nemenyi CD = {cd:.2f}" for t in fig.axes[0].texts)


@pytest.mark.parametrize("which", ["cd_fig_clique", "cd_fig_no_clique"])
def test_cd_diagram_draws_everything_inside_the_figure(which, request):
    """The axes span the figure with y in [0, height]: every line point and text anchor
    lies inside, so nothing (axis, bars, bottom labels) is cut off the saved image."""
    fig = request.getfixturevalue(which)
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert lo == 0 and hi == pytest.approx(fig.get_figheight())
    for ln in _lines(fig):
        assert np.all((np.asarray(ln.get_ydata()) >= lo) & (np.asarray(ln.get_ydata()) <= hi))
        assert np.all((np.asarray(ln.get_xdata()) >= 0) & (np.asarray(ln.get_xdata()) <= 1))
    for t in ax.texts:
        x, y = t.get_position()
        assert 0 <= x <= 1 and lo <= y <= hi, t.get_text()


def test_cd_labels_sit_below_the_axis_and_the_clique_bars(cd_fig_clique, cd_fig_no_clique):
    """Methods are labelled below the axis and below the clique bars: each label's rendered
    top edge is under the bottom edge of the axis line and of every bar."""
    for fig in (cd_fig_clique, cd_fig_no_clique):
        axis = _axis_line(fig)
        floor = axis.get_ydata()[0] - _half_lw(fig, axis)
        for bar in _clique_bars(fig):
            floor = min(floor, bar.get_ydata()[0] - _half_lw(fig, bar))
        labels = _labels(fig)
        assert sorted(labels) == NAMES
        for name, t in labels.items():
            assert _data_bbox(fig, t).y1 < floor, name


def test_cd_labels_point_away_from_the_axis(cd_fig_clique):
    """The best half is labelled in the left margin, right-aligned so the text ends where
    its leader line ends; the rest in the right margin, left-aligned from the leader's end.
    Neither reaches into the rank axis."""
    fig = cd_fig_clique
    x0, x1 = sorted(_axis_line(fig).get_xdata())
    leaders = [ln for ln in _lines(fig) if len(ln.get_xdata()) == 3]
    for name, t in _labels(fig).items():
        rank = NAMES.index(name) + 1
        y = t.get_position()[1]
        (lead,) = [ln for ln in leaders if ln.get_xdata()[0] == pytest.approx(_xpos(fig, rank))]
        assert lead.get_ydata()[-1] == pytest.approx(y)
        end = lead.get_xdata()[-1]
        bb = _data_bbox(fig, t)
        if rank <= (K + 1) // 2:
            assert t.get_horizontalalignment() == "right"
            assert bb.x1 <= end < x0
        else:
            assert t.get_horizontalalignment() == "left"
            assert x1 < end <= bb.x0


def test_incomplete_problems_are_dropped_with_the_reason():
    df = pd.DataFrame({"a": [0.9, 0.8, np.nan], "b": [0.5, 0.4, 0.3]})
    with pytest.warns(UserWarning) as rec:
        r = stats.average_ranks(df)
    assert [str(w.message) for w in rec] == [
        "dropped 1 of 3 problems with a missing score: rank tests need every method scored "
        "on every problem"]
    assert r.to_dict() == {"a": 1.0, "b": 2.0}


# -- render ----------------------------------------------------------------------------
def test_markdown_of_an_empty_view_says_no_rows():
    assert render.to_markdown(pd.DataFrame()) == "_(no rows)_"
    assert render.to_markdown(pd.DataFrame(columns=["method", "x"])) == "_(no rows)_"


def test_html_tables_carry_no_index_column():
    """The frame's index (a row number after filtering) is not a column of the report: the
    header has exactly the frame's columns and no row has a header cell."""
    df = pd.DataFrame({"method": ["sup", "fixmatch"], "score": [0.5, 0.75]},
                      index=[17, 42])
    page = render.html_report([render.Section("leaderboard", df)])
    table = page[page.index("<table"):page.index("</table>")]
    assert re.findall(r"<th[^>]*>([^<]*)</th>", table) == ["method", "score"]
    assert "17" not in table and "42" not in table
    assert "<td>sup</td>" in table and "<td>0.7500</td>" in table


def test_leaderboard_error_bars_are_the_seed_std():
    """Each bar carries a horizontal error bar mean ± std; a missing std (one seed) is 0."""
    import matplotlib.pyplot as plt

    lb = pd.DataFrame({"dataset": ["d", "d", "d"], "n_labeled": [40, 40, 40],
                       "method": ["sup", "fixmatch", "mixup"],
                       "test_balanced_accuracy_mean": [0.6, 0.8, 0.7],
                       "test_balanced_accuracy_std": [0.05, 0.02, np.nan]})
    fig = render.plot_leaderboard(lb)
    ax = fig.axes[0]
    (bars,) = [c for c in ax.containers if hasattr(c, "errorbar")]
    assert bars.errorbar is not None
    (segs,) = [lc.get_segments() for lc in bars.errorbar.lines[2]]
    # bars sorted by mean ascending: sup (0.6), mixup (0.7), fixmatch (0.8)
    got = sorted((float(s[:, 0].min()), float(s[:, 0].max())) for s in segs)
    want = [(0.55, 0.65), (0.7, 0.7), (0.78, 0.82)]
    np.testing.assert_allclose(got, want, atol=1e-12)
    plt.close(fig)


def test_profile_lines_step_and_bands_span_min_to_max():
    """Best-so-far scores hold until the next checkpoint: lines are drawn steps-post; the
    band is the min..max over seeds (not 0..max)."""
    import matplotlib.pyplot as plt

    t = np.array([0.0, 60.0, 120.0])
    prof = pd.DataFrame({"dataset": "d", "n_labeled": 40, "method": "sup", "t_s": t,
                         "test_balanced_accuracy_mean": [0.5, 0.6, 0.7],
                         "test_balanced_accuracy_min": [0.45, 0.55, 0.65],
                         "test_balanced_accuracy_max": [0.55, 0.65, 0.75],
                         "val_balanced_accuracy_mean": [0.52, 0.62, 0.72],
                         "val_balanced_accuracy_min": [0.5, 0.6, 0.7],
                         "val_balanced_accuracy_max": [0.54, 0.64, 0.74]})
    fig = render.plot_profile(prof)
    axes = fig.axes
    assert len(axes) == 2  # test on top, validation below
    for ax, lo, hi in ((axes[0], 0.45, 0.75), (axes[1], 0.5, 0.74)):
        (line,) = ax.get_lines()
        assert line.get_drawstyle() == "steps-post"
        (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
        ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
        assert ys.min() == pytest.approx(lo) and ys.max() == pytest.approx(hi)
    plt.close(fig)


# -- report sections ------------------------------------------------------------------
def _al_tracked():  # type: ignore[no-untyped-def]
    """AL runs only (no studies), as the tidy frame: 3 strategies on 2 datasets x 3
    repetitions; s1 > s2 > s3 everywhere."""
    from scarcelab.tracking.query.frame import Tracked

    rows = []
    for s, aucs in {"s1": [0.9, 0.8, 0.85], "s2": [0.7, 0.6, 0.65],
                    "s3": [0.5, 0.4, 0.45]}.items():
        for rep, a in enumerate(aucs):
            for ds in ("d", "e"):
                rows.append({"run_id": f"{s}-{rep}-{ds}", "role": "al", "status": "FINISHED",
                             "dataset": ds, "query_size": 2, "repetition": rep,
                             "strategy": s, "metrics.al/auc": a})
    return Tracked(pd.DataFrame(rows), None, ["0"])  # type: ignore[arg-type]


def test_ranks_section_titles_the_al_cd_diagram():
    import matplotlib.pyplot as plt

    from scarcelab.tracking.query import report

    (sec,) = report.sections(_al_tracked(), ["ranks"])
    assert sec.note == report.NOTES["ranks"]
    assert sec.figures["cd_study"] is None  # no studies: no methods-over-datasets diagram
    fig = sec.figures["cd_al"]
    assert fig.axes[0].texts[0].get_text().startswith("AL strategies  (Friedman p = ")
    plt.close(fig)


def test_a_section_without_a_note_gets_no_note_paragraph():
    """A section with an empty note gets no note paragraph on the page (not a
    placeholder). Every registered view has a note (the registry refuses one without), so
    ``transfer``'s section, which had none, now shows its own."""
    from scarcelab.tracking.query import report

    (sec,) = report.sections(_al_tracked(), ["transfer"])
    assert sec.note == report.NOTES["transfer"] and sec.note
    assert "class='note'" in render.html_report([sec])
    sec.note = ""
    assert "class='note'" not in render.html_report([sec])


# -- MLflow: al_report, al_runs, log_report ---------------------------------------------
@pytest.fixture(scope="module")
def al_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A sqlite store with experiment ``al-uri``: strategies s1 > s2 > s3 on one dataset and
    query size, repetitions 0 and 1 (AUCs logged as by ``scarcelab.active.loop``)."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    shm = Path("/dev/shm")  # sqlite on tmpfs when there is one: MLflow commits every call
    tmp = Path(tempfile.mkdtemp(prefix="scarcelab-alq-", dir=shm)) if shm.is_dir() \
        else tmp_path_factory.mktemp("alq")
    uri = f"sqlite:///{tmp / 'a.db'}"
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("al-uri", artifact_location=str(tmp / "art"))
    for s, aucs in {"s1": [0.9, 0.8], "s2": [0.7, 0.6], "s3": [0.5, 0.4]}.items():
        for rep, a in enumerate(aucs):
            r = c.create_run(exp, tags={
                "scarcelab.role": "al", "scarcelab.dataset": "honeypot",
                "scarcelab.query_size": "2", "scarcelab.method": s,
                "scarcelab.repetition": str(rep)})
            c.log_batch(r.info.run_id, metrics=[Metric("al/auc", a, 0, 0)])
            c.set_terminated(r.info.run_id, "FINISHED")
    prev = mlflow.get_tracking_uri()
    yield {"uri": uri, "tmp": str(tmp)}
    mlflow.set_tracking_uri(prev)
    shutil.rmtree(tmp, ignore_errors=True)


def test_al_runs_repetition_is_an_integer_column(al_store):
    from scarcelab.tracking.al import al_runs

    runs = al_runs(["al-uri"], al_store["uri"])
    assert pd.api.types.is_integer_dtype(runs["repetition"])
    assert pd.api.types.is_integer_dtype(runs["query_size"])
    assert sorted(runs["repetition"].unique().tolist()) == [0, 1]


def test_al_report_reads_the_store_it_is_given(al_store, tmp_path):
    """``tracking_uri`` names the store to read even when the process points elsewhere."""
    import mlflow

    from scarcelab.tracking.al import al_report

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    rep = al_report(["al-uri"], tracking_uri=al_store["uri"], log=False)
    assert list(rep.scores.columns) == ["s1", "s2", "s3"]
    assert rep.scores.to_numpy().tolist() == [[0.9, 0.7, 0.5], [0.8, 0.6, 0.4]]
    assert rep.run_id is None


def test_log_report_logs_into_the_run_mlflow_projects_opened(al_store, tmp_path, monkeypatch):
    """Under ``mlflow run`` (MLFLOW_RUN_ID set) the report goes into that run, which keeps
    the name MLflow Projects gave it; no new run named ``report`` appears."""
    import mlflow
    import mlflow.tracking.fluent as fluent
    from mlflow import MlflowClient

    from scarcelab.tracking.query.report import log_report

    c = MlflowClient(tracking_uri=al_store["uri"])
    exp = c.create_experiment("projects", artifact_location=str(Path(al_store["tmp"]) / "pa"))
    run = c.create_run(exp, run_name="projects-run")
    mlflow.set_tracking_uri(al_store["uri"])
    monkeypatch.setattr(fluent, "_active_experiment_id", None)  # as in a fresh process
    monkeypatch.setenv("MLFLOW_RUN_ID", run.info.run_id)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", exp)
    (tmp_path / "report.html").write_text("<html></html>")
    got = log_report({"report.html": tmp_path / "report.html"}, "ignored-under-projects",
                     run_name="report")
    assert got == run.info.run_id
    after = c.get_run(got)
    assert after.info.run_name == "projects-run"
    assert after.data.tags["scarcelab.role"] == "report"
    assert [a.path for a in c.list_artifacts(got, "report")] == ["report/report.html"]
    assert [r.info.run_id for r in c.search_runs([exp])] == [run.info.run_id]
    assert c.get_experiment_by_name("ignored-under-projects") is None


def test_cd_figure_skips_a_single_block_instead_of_crashing():
    """One complete problem is one block: no rank test, so no diagram (found while writing
    these tests: a report over AL runs of one dataset and query size crashed)."""
    one = pd.DataFrame({"a": [0.8], "b": [0.7]}, index=["p1"])
    assert render.cd_figure(one, "t") is None
    two = pd.DataFrame({"a": [0.8, 0.6], "b": [0.7, 0.5]}, index=["p1", "p2"])
    assert render.cd_figure(two, "t") is not None
