"""Tables for people (issue 27 item 3): the terminal table, JSON, the HTML page's table and
the leaderboard plot's error bars, on hand-made frames."""

from __future__ import annotations

import json
import math
import re
from io import StringIO

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from scarcelab.tracking.query import render


def _lb() -> pd.DataFrame:
    return pd.DataFrame({
        "dataset": ["dA", "dA", "dB"], "n_labeled": [40, 40, 40],
        "family": ["semi", "supervised", "supervised"], "method": ["fixmatch", "sup", "sup"],
        "n_val": [np.nan] * 3, "budget_minutes": [3.0, 3.0, 3.0], "setting": ["", "", ""],
        "n": [3, 3, 1],
        "test_balanced_accuracy_mean": [0.7959999999999999, 0.6893333333333334, 0.55],
        "test_balanced_accuracy_std": [0.015099668870541512, 0.046457866215887815, np.nan],
    })


def test_people_frame_merges_mean_and_std_rounds_and_drops_empty_columns() -> None:
    p = render.people_frame(_lb())
    assert list(p.columns) == ["dataset", "n_labeled", "family", "method", "budget_minutes",
                               "n", "test_balanced_accuracy"]
    assert p["test_balanced_accuracy"].tolist() == ["0.796 ± 0.015", "0.689 ± 0.046", "0.550"]
    assert p["budget_minutes"].tolist() == ["3", "3", "3"]  # whole numbers shown whole
    sig = render.people_frame(pd.DataFrame({"mean": [0.5], "std": [0.25], "p_value": [0.0]}))
    assert sig.to_dict("list") == {"mean ± std": ["0.500 ± 0.250"], "p_value": ["0.000"]}


def test_terminal_table_is_aligned() -> None:
    lines = render.to_table(_lb()).splitlines()
    assert len(lines) == 2 + 3 and set(lines[1].replace(" ", "")) == {"-"}
    # every column starts where its header starts (left text) or ends where it ends (numbers)
    dash_runs = [(i, i + len(r)) for i, r in _runs(lines[1])]
    for line in lines[2:]:
        for (a, b), cell in zip(dash_runs, _cells(line, dash_runs), strict=True):
            assert cell == cell.strip() or line[a:b].strip() == cell.strip()
    acc_end = dash_runs[-1][1]
    assert all(line[:acc_end].endswith(("0.015", "0.046", "0.550")) for line in lines[2:])
    assert render.to_table(_lb().iloc[:0]) == "(no rows)"


def _runs(dashes: str) -> list[tuple[int, str]]:
    out, i = [], 0
    for part in dashes.split("  "):
        if part:
            out.append((dashes.index(part, i), part))
            i = out[-1][0] + len(part)
    return out


def _cells(line: str, spans: list[tuple[int, int]]) -> list[str]:
    return [line[a:b] for a, b in spans]


def test_json_keeps_every_digit_and_writes_null_for_missing() -> None:
    rows = json.loads(render.to_json(_lb()))
    assert rows[0]["test_balanced_accuracy_mean"] == 0.7959999999999999
    assert rows[2]["test_balanced_accuracy_std"] is None and rows[0]["n_val"] is None
    assert rows[0]["n"] == 3


def test_cli_formats_table_on_a_terminal_csv_in_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    import scarcelab.entrypoints.leaderboard as lbcmd
    import scarcelab.tracking.query as q
    from scarcelab.entrypoints.cli import main

    class _T:
        class reader:  # noqa: N801 - what load() returns carries a reader
            uri = "sqlite:///x.db"

    monkeypatch.setattr(q, "load", lambda *a, **k: _T())
    monkeypatch.setattr(q.report, "compute", lambda t, view, **kw: _lb())
    args = ["leaderboard", "--experiment", "e"]
    monkeypatch.setattr(lbcmd, "_on_terminal", lambda: False)
    piped = CliRunner().invoke(main, args)
    assert piped.exit_code == 0, piped.output
    assert piped.output == render.to_csv(_lb())  # every digit, as before
    got = pd.read_csv(StringIO(piped.output))
    assert got["test_balanced_accuracy_mean"].tolist()[:2] == [0.7959999999999999,
                                                               0.6893333333333334]
    monkeypatch.setattr(lbcmd, "_on_terminal", lambda: True)
    tty = CliRunner().invoke(main, [*args, "--columns", "all"])
    assert tty.output.strip() == render.to_table(_lb())
    # by default a terminal gets the leaderboard's main columns (issue 43: fit 80 columns)
    short = CliRunner().invoke(main, args)
    assert short.stdout.splitlines()[0].split() == [
        "dataset", "n_labeled", "budget_minutes", "method", "n", "test_balanced_accuracy"]
    for fmt, check in (("json", lambda o: json.loads(o)[1]["method"] == "sup"),
                       ("markdown", lambda o: "| 0.796 ± 0.015" in o),
                       ("csv", lambda o: o.startswith("dataset,n_labeled"))):
        r = CliRunner().invoke(main, [*args, "--format", fmt])
        assert r.exit_code == 0 and check(r.output), (fmt, r.output)


def test_html_table_is_the_people_table_in_a_scroll_box() -> None:
    wide = _lb()
    for i in range(12):  # far wider than a page
        wide[f"test_metric_{i}_mean"], wide[f"test_metric_{i}_std"] = 0.5, 0.1
    page = render.html_report([render.Section("leaderboard", wide)])
    assert "<div class='wide'><table" in page and "overflow-x:auto" in page
    assert "0.7960 ± 0.0151" in page and "_std" not in page.split("<table")[1]
    assert "test balanced accuracy" in page  # headers wrap at spaces, not mid-word


def test_leaderboard_bars_carry_capped_std_error_bars_and_name_rows_without_one() -> None:
    fig = render.plot_leaderboard(_lb())
    ax_a, ax_b = [ax for ax in fig.axes if ax.get_visible()]
    (bars,) = [c for c in ax_a.containers if getattr(c, "errorbar", None) is not None]
    _, caps, (lines,) = bars.errorbar.lines
    widths = sorted(abs(s[1][0] - s[0][0]) for s in lines.get_segments())
    assert widths == pytest.approx(sorted([2 * 0.015099668870541512,
                                           2 * 0.046457866215887815]))
    assert len(caps) == 2  # capped, so a small std stays visible
    assert any("no std" in t.get_text() for t in ax_b.texts)
    assert not any("no std" in t.get_text() for t in ax_a.texts)
    assert math.isclose(max(p.get_width() for p in ax_a.patches), 0.7959999999999999)


def test_html_meta_is_one_closed_paragraph_and_each_table_has_its_sections_id() -> None:
    """The page's header note (experiments, tracking URI, generation time) is one
    well-formed paragraph, and each section's table carries a stable id a link or a
    stylesheet can point at (``report.html#table-leaderboard``)."""
    from html.parser import HTMLParser

    meta = render.report_meta(["e1", "e2"], "sqlite:///tmp/x.db")
    assert list(meta) == ["experiments", "tracking URI", "generated"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", meta["generated"])
    page = render.html_report([render.Section("leaderboard", _lb()),
                               render.Section("many seeds", _lb())], meta=meta)

    class P(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.stack: list[str] = []
            self.note: list[str] = []
            self.ids: list[str] = []

        def handle_starttag(self, tag, attrs):  # type: ignore[no-untyped-def]
            a = dict(attrs)
            if tag == "table":
                self.ids.append(a.get("id") or "")
            if tag == "p":
                self.stack.append(a.get("class") or "")
                self.note.append("")

        def handle_endtag(self, tag):  # type: ignore[no-untyped-def]
            if tag == "p":
                self.stack.pop()

        def handle_data(self, data):  # type: ignore[no-untyped-def]
            if self.stack:
                self.note[-1] += data

    p = P()
    p.feed(page)
    assert p.stack == []  # every paragraph closed
    assert p.note[0] == ("experiments: e1, e2" "tracking URI: sqlite:///tmp/x.db"
                         f"generated: {meta['generated']}")
    assert p.ids == ["table-leaderboard", "table-many-seeds"]


def test_png_bytes_are_png_whatever_the_users_default_savefig_format() -> None:
    """The report embeds them as ``data:image/png``: a matplotlibrc with
    ``savefig.format: svg`` must not turn them into SVG."""
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    with mpl.rc_context({"savefig.format": "svg"}):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        data = render.png_bytes(fig)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"


def test_gains_plot_marks_each_methods_worst_gain_on_its_own_row() -> None:
    """Each method's row: its median gain as the bar, its worst gain as the marker."""
    g = pd.DataFrame({"method": ["fixmatch", "mixmatch", "pseudo"],
                      "median_gain": [0.05, 0.02, -0.01],
                      "worst_gain": [0.01, -0.03, -0.08]})
    fig = render.plot_gains(g)
    ax = fig.axes[0]
    (worst,) = [ln for ln in ax.get_lines() if ln.get_label() == "worst gain"]
    ticks = zip(ax.get_yticklabels(), ax.get_yticks(), strict=True)
    rows = {str(t.get_text()): y for t, y in ticks}
    bars = {rows[m]: b.get_width() for m, b in zip(g["method"][::-1], ax.patches, strict=True)}
    xs = np.asarray(worst.get_xdata(), float)
    ys = np.asarray(ax.yaxis.convert_units(worst.get_ydata()), float)
    got = dict(zip(ys, xs, strict=True))
    want = {rows[m]: w for m, w in zip(g["method"], g["worst_gain"], strict=True)}
    assert got == pytest.approx(want)
    med = zip(g["method"], g["median_gain"], strict=True)
    assert bars == pytest.approx({rows[m]: v for m, v in med})
