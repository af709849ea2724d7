"""The start-up before a study trains is shown phase by phase, with times, and the bar's
clock counts from the command's start as the budget does (issue 43 §3: the bar sat at
"0% 0:00" through 59 s of start-up on a loaded machine)."""

from __future__ import annotations

import io
import re
import time

from click.testing import CliRunner

from scarcelab.entrypoints._progress import VERBOSE, Display, ProgressTracker, Startup
from scarcelab.tracker import InMemoryTracker

PHASES = ["imports (torch, MLflow)", "tracking server check",
          "data, split and model set-up", "the study's MLflow run"]


def test_a_study_prints_its_start_up_phases_in_order(store) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, [
        "supervised", "--method", "sup", "--dataset", "synthetic_tiny", "--arch",
        "small_cnn", "--device", "cpu", "--max-epochs", "1", "--batch-size", "16",
        "--max-steps-per-epoch", "2", "--max-trials", "1", "--budget-minutes", "1", "-v"])
    assert r.exit_code == 0, r.output
    out = r.output
    at = [out.index(f": {p} …") for p in PHASES]
    assert at == sorted(at) and at[-1] < out.index("trial   0 finished")
    for p in PHASES:
        assert re.search(r"start-up \d+:\d\d: " + re.escape(p) + " …", out), p
    done = re.findall(r"start-up (\d+):(\d\d) of the 1:00 budget: (.*)", out)
    assert len(done) == 2  # when it ends, and again in the closing summary
    parts = done[0][2].split(" · ")
    assert parts[0].startswith("launch (interpreter") and len(parts) == 1 + len(PHASES)
    secs = [float(m) for m in re.findall(r" (\d+\.\d) s", done[0][2])]
    total = int(done[0][0]) * 60 + int(done[0][1])
    assert len(secs) == 1 + len(PHASES) and abs(sum(secs) - total) <= 1.5


def test_the_bar_counts_from_the_command_start() -> None:
    display = Display(VERBOSE, stream=io.StringIO())
    startup = Startup(display, time.time() - 30.0)  # the command started 30 s ago
    startup.phase("imports (torch, MLflow)")
    pt = ProgressTracker(InMemoryTracker(), display, budget_s=180.0, startup=startup)
    pt.own_bar = False
    pt.start_study("s", {}, {}, {})
    frac, text = pt.status()
    assert text.startswith("0:30 elapsed, 2:30 left"), text  # was 0:00 elapsed
    assert 0.16 < frac < 0.18
    assert startup.text.startswith("start-up 0:30 of the 3:00 budget: launch")
    assert "imports (torch, MLflow) 0.0 s · the study's MLflow run 0.0 s" in startup.text
    assert "start-up 0:30: imports (torch, MLflow) …" in display.stream.getvalue()  # type: ignore[attr-defined]
