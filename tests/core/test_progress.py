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


# -- issue 27 item 5: other writers to the terminal do not break the bar ----------------------

def test_warnings_logs_and_mlflow_lines_go_above_the_bar_not_into_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The noise seen in a real run — a Python warning written to stderr (torch's "No
    complete tensor found in the group!"), torch.export's Dim.AUTO log line (torch's
    handler follows sys.stderr), MLflow's log stream (also follows sys.stderr) and a record
    through a handler made before the bar (``logging.basicConfig``'s, holding the terminal)
    — each shows on a line of its own while the bar is up, and the bar is drawn again after
    them. Before, each was appended to the bar text on the bar's line."""
    import logging
    import sys
    import warnings

    from mlflow.utils.logging_utils import MLFLOW_LOGGING_STREAM

    term = Tty()
    monkeypatch.setattr(sys, "stderr", term)
    handler = logging.StreamHandler(sys.stderr)  # like basicConfig's: holds the terminal
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        d = Display(NORMAL)
        d.start_bar(lambda: (0.5, "0:30 elapsed, 0:30 left · logging the selected model"))
        d.refresh()
        sys.stderr.write(warnings.formatwarning(  # what warnings.showwarning writes
            "No complete tensor found in the group!", UserWarning, "_package.py", 415))
        d.refresh()
        logging.getLogger("torch._export.non_strict_utils").warning(
            "dimension inputs[0].shape[0] 0/1 specialized; Dim.AUTO was specified")
        d.refresh()
        MLFLOW_LOGGING_STREAM.write("2026/12/01 15:26:27 INFO mlflow.system_metrics: "
                                    "Started monitoring system metrics.\n")
        d.refresh()
        logging.getLogger("scarcelab.tracking").warning("tracking server slow")
        d.line("trial   0 finished")
        d.stop_bar()
        assert handler in root.handlers  # the terminal's handler is back in place
    finally:
        root.removeHandler(handler)
    text = term.getvalue()
    for noise in ("_package.py:415: UserWarning: No complete tensor found",
                  "dimension inputs[0].shape[0] 0/1 specialized",
                  "2026/12/01 15:26:27 INFO mlflow.system_metrics: Started monitoring",
                  "WARNING scarcelab.tracking: tracking server slow",
                  "trial   0 finished"):
        assert noise in text, (noise, text)
        line = next(ln for ln in text.split("\n") if noise in ln)
        shown = line.split("\r")[-1]  # what stays on that terminal line
        assert noise in shown and "elapsed" not in shown, (noise, line)
        assert "elapsed" in text[text.index(noise):]  # the bar comes back after it
    assert sys.stderr is term  # stderr given back when the bar stops
    assert text.endswith("\r\033[K")


def test_undefined_metric_warning_names_its_own_reason() -> None:
    """Sem-Drift is undefined when no class has both centroids, not because "AUROC" has a
    one-class test set (the example the warning used to give for every metric)."""
    from scarcelab.tracker import InMemoryTracker

    out = io.StringIO()
    t = ProgressTracker(InMemoryTracker(), Display(QUIET, out))
    t.start_study("s", {}, {}, {})
    t.start_trial(0, {}, {})
    t.log_metrics({"diag/sem_drift": float("nan"), "test/auroc": float("nan"),
                   "diag/ood_ff": float("inf")}, 0)
    lines = {ln.split()[3]: ln for ln in out.getvalue().splitlines()}
    assert "centroid" in lines["diag/sem_drift"] and "AUROC" not in lines["diag/sem_drift"]
    assert "single class" in lines["test/auroc"]
    assert "no OOD" in lines["diag/ood_ff"]


def test_mlflow_info_lines_only_with_verbose(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import logging

    import mlflow  # noqa: F401 - configured already: the live logger must follow too
    from click.testing import CliRunner

    from scarcelab.entrypoints.cli import main

    monkeypatch.delenv("MLFLOW_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv("SCARCELAB_MLFLOW_LOGGING_LEVEL_SET", raising=False)
    level = logging.getLogger("mlflow").level
    try:
        assert CliRunner().invoke(main, ["list", "archs"]).exit_code == 0
        assert logging.getLogger("mlflow").level == logging.WARNING
        import os

        assert os.environ["MLFLOW_LOGGING_LEVEL"] == "WARNING"  # read at mlflow's import
        assert CliRunner().invoke(main, ["-v", "list", "archs"]).exit_code == 0
        assert logging.getLogger("mlflow").level == logging.INFO
        monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "DEBUG")  # the user's choice stands
        monkeypatch.delenv("SCARCELAB_MLFLOW_LOGGING_LEVEL_SET")
        assert CliRunner().invoke(main, ["list", "archs"]).exit_code == 0
        assert os.environ["MLFLOW_LOGGING_LEVEL"] == "DEBUG"
    finally:
        logging.getLogger("mlflow").setLevel(level)


# -- issue 27 item 5: the model export itself is quiet ------------------------------------------

def _export_warnings(model, example):  # type: ignore[no-untyped-def]
    """What torch.export + the pt2 archive writer warn and log, exported as MLflow does
    (batch dimension ``Dim.AUTO``, mlflow/pytorch/__init__.py ``_save_model_with_pt2``)."""
    import logging
    import tempfile
    import warnings

    import torch

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    lg = logging.getLogger("torch._export")
    keep = Keep(level=logging.WARNING)
    lg.addHandler(keep)
    try:
        with warnings.catch_warnings(record=True) as got, tempfile.TemporaryDirectory() as d:
            warnings.simplefilter("always")
            ep = torch.export.export(model, (example,),
                                     dynamic_shapes=[{0: torch.export.Dim.AUTO}])
            torch.export.save(ep, f"{d}/model.pt2")
    finally:
        lg.removeHandler(keep)
    return ep, [str(w.message) for w in got] + records


def test_exported_classifier_is_contiguous_so_the_archive_writer_does_not_warn() -> None:
    """Training leaves conv weights channels_last; torch's pt2 writer then warns "No
    complete tensor found in the group!" once per such weight (a trained small_cnn's
    study: twice). ``for_export`` (used by export_classifier, the probe's
    and segment's models) stores them contiguous: no warning, same outputs."""
    import torch

    from scarcelab.models import create_model
    from scarcelab.models.classifier import ExportedClassifier, for_export

    torch.manual_seed(0)
    trained = ExportedClassifier(create_model("small_cnn", in_channels=3),
                                 torch.nn.Linear(128, 2), ["a", "b"]).eval()
    trained.to(memory_format=torch.channels_last)
    x = torch.rand(2, 3, 28, 28)
    _, before = _export_warnings(trained, x)
    assert any("No complete tensor" in w for w in before)  # what users saw
    want = trained(x)
    ep, after = _export_warnings(for_export(trained), x)
    assert not [w for w in after if "No complete tensor" in w], after
    assert torch.allclose(ep.module()(x), want, atol=1e-6)


def test_segment_logs_a_model_that_takes_any_batch(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """segment's example had one tile, so MLflow's ``Dim.AUTO`` batch dimension was fixed to
    1 (torch.export: "0/1 specialized") and the logged model took one tile at a time."""
    from pathlib import Path

    import torch

    from scarcelab.protocols.segment import SegmentConfig, run_segment
    from scarcelab.tracker import InMemoryTracker

    data = Path(__file__).resolve().parents[3] / "shared" / "data" / "consep_patches"
    if not data.exists():
        pytest.skip(f"needs the shared CoNSeP patches at {data}")
    got: dict[str, object] = {}

    class Keep(InMemoryTracker):
        def log_model(self, model, example):  # type: ignore[no-untyped-def]
            got["model"], got["example"] = model, example

    cfg = SegmentConfig(max_epochs=1, patience=1, steps_per_epoch=1, batch_size=2, crop=32,
                        window=64, scale=0.25, max_train_tiles=2, max_val_tiles=1,
                        max_test_tiles=1, n_overlays=0, device="cpu", arch="small_cnn",
                        data_dir=str(data))
    run_segment(cfg, Keep())
    model, example = got["model"], got["example"]
    assert isinstance(example, torch.Tensor) and example.shape[0] >= 2
    ep, said = _export_warnings(model, example)
    assert not [w for w in said if "specialized" in w or "No complete tensor" in w], said
    three = torch.rand(3, *example.shape[1:])
    assert ep.module()(three).shape[0] == 3  # the batch dimension stayed dynamic
