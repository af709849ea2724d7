"""Progress while a study runs (issue 16, "While it runs"): a line per finished trial and a
live bar over the budget on a terminal, nothing when output is not a terminal, ``-q`` and
``-v`` that change that, and a final summary that says where to look."""

from __future__ import annotations

import io
import re

import pytest

from scarcelab.entrypoints._progress import (
    NORMAL,
    QUIET,
    VERBOSE,
    Display,
    ProgressTracker,
    fmt_time,
)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _study(stream: io.StringIO, level: int) -> ProgressTracker:
    from scarcelab.protocols.search import StudyConfig, run_study
    from scarcelab.tracker import InMemoryTracker

    cfg = StudyConfig(method="sup", dataset="synthetic_tiny", arch="small_cnn", device="cpu",
                      max_epochs=2, max_trials=2, budget_minutes=2, batch_size=16,
                      max_steps_per_epoch=2)
    t = ProgressTracker(InMemoryTracker(), Display(level, stream), budget_s=120.0)
    run_study(cfg, t)
    return t


@pytest.fixture(autouse=True)
def _term(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TERM", "xterm")


def test_terminal_gets_trial_lines_and_a_live_budget_bar() -> None:
    out = Tty()
    t = _study(out, NORMAL)
    text = out.getvalue()
    lines = re.findall(r"trial +(\d) finished +2 ep +\S+ +val (\S+) +best (\S+) +(.*)", text)
    assert [n for n, *_ in lines] == ["0", "1"]
    assert all("lr=" in conf and "weight_decay=" in conf for *_, conf in lines)
    assert float(lines[-1][2]) == pytest.approx(t.best, abs=1e-4)
    assert re.search(r"\[[#.]{24}\] +\d+% \d+:\d\d elapsed, \d+:\d\d left", text)
    assert text.endswith("\r\033[K") or text.endswith("\n")  # the bar is erased at the end
    assert t.n_done == 2 and t.epochs_total == 4


def test_not_a_terminal_is_quiet_and_verbose_prints_lines_without_a_bar() -> None:
    out = io.StringIO()
    _study(out, NORMAL)
    assert out.getvalue() == ""
    out = io.StringIO()
    _study(out, VERBOSE)
    text = out.getvalue()
    assert "trial   0 finished" in text and "trial 0 epoch 1: val balanced accuracy" in text
    assert "\r" not in text and "elapsed" not in text


def test_quiet_on_a_terminal_shows_nothing() -> None:
    out = Tty()
    _study(out, QUIET)
    assert out.getvalue() == ""


def test_bar_text_counts_down_the_budget(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.tracker import InMemoryTracker

    t = ProgressTracker(InMemoryTracker(), Display(NORMAL, Tty()), budget_s=600.0)
    t.clock.sync(150.0)  # the study reports 150 s spent (a resumed study counts them)
    frac, text = t.status()
    assert frac == pytest.approx(0.25, abs=0.01)
    assert text.startswith("2:30 elapsed, 7:30 left")
    assert fmt_time(3725) == "1:02:05"


def test_cli_summary_names_experiment_run_model_and_ui(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import mlflow
    from click.testing import CliRunner

    from scarcelab.entrypoints.cli import main

    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(uri)
    r = CliRunner().invoke(main, ["supervised", "--method", "sup", "--dataset",
                                  "synthetic_tiny", "--arch", "small_cnn", "--device", "cpu",
                                  "--max-epochs", "1", "--batch-size", "16",
                                  "--max-steps-per-epoch", "2", "--max-trials", "2",
                                  "--budget-minutes", "2", "--experiment", "summ", "-v"])
    assert r.exit_code == 0, r.output
    runs = mlflow.search_runs(experiment_names=["summ"])
    rid = runs[runs["tags.scarcelab.role"] == "study"].run_id.iloc[0]
    out = r.output
    assert "trial   1 finished" in out  # -v: trial lines although CliRunner is no terminal
    assert "2 trials (0 failed), 2 epochs" in out
    assert f"experiment: summ    study run: {rid}" in out
    assert f"model: runs:/{rid}/model" in out
    assert re.search(r"wall time: \d+:\d\d", out)
    assert f"browse: mlflow ui --backend-store-uri {uri}" in out
