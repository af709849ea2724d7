"""What a running study shows: a line per finished trial and a live bar over the budget.

(The leading underscore keeps ``entrypoints.cli``'s command discovery from importing this
module, and torch with it, before the options have parsed.)

The core reports everything through its :class:`~scarcelab.tracker.Tracker`, so progress is
a tracker wrapper (:class:`ProgressTracker`) that watches the calls on their way to the real
tracker — the search itself is not touched. The same wrapper adds the run's data provenance
(``data_files.json``, see :mod:`scarcelab.data.provenance`; for a user's images also the
``data_manifest.json`` of every file and the decode params and tags the loader described),
drops metrics that came out NaN
(e.g. AUROC on a one-class test set: logged as missing, with a warning that says why
(:mod:`scarcelab.metrics.undefined`), never as NaN) and
logs parameters under the names ``mlflow run`` gives them (``entrypoints.options``).

Everything goes to stderr, so stdout keeps only the final summary. Levels: ``quiet`` (0)
shows nothing but the summary; ``normal`` (1) shows trial lines and the bar when stderr is
a terminal, nothing otherwise (logs of batch jobs stay clean); ``verbose`` (2) also prints
trial lines into logs, and one line per epoch.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

from tqdm import tqdm
from tqdm.contrib import DummyTqdmFile
from tqdm.contrib.logging import logging_redirect_tqdm

from scarcelab import tags as T
from scarcelab.tracker import DatasetInfo, DelegatingTracker, Tracker

if TYPE_CHECKING:
    from torch import nn

QUIET, NORMAL, VERBOSE = 0, 1, 2


def fmt_time(s: float) -> str:
    s = max(0, int(round(s)))
    h, rem = divmod(s, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if 1e-3 <= abs(v) < 1e4 or v == 0 else f"{v:.2e}"
    return str(v)


class _Bar(tqdm):
    """tqdm without its monitor thread (Display redraws on its own clock, twice a second)."""

    monitor_interval = 0


def _console_loggers() -> list[logging.Logger]:
    """The root logger and every logger with its own handler on the terminal's streams
    (what ``logging_redirect_tqdm`` can re-route); MLflow's handler writes to whatever
    ``sys.stderr`` is at the time, so the stderr swap below catches it instead."""
    def on_console(lg: logging.Logger) -> bool:
        return any(isinstance(h, logging.StreamHandler)
                   and h.stream in (sys.stdout, sys.stderr) for h in lg.handlers)

    named = [lg for lg in logging.Logger.manager.loggerDict.values()
             if isinstance(lg, logging.Logger) and on_console(lg)]
    return [logging.getLogger(), *named]


class Display:
    """Lines and one live status bar on a stream, drawn by tqdm (``tqdm.write`` clears the
    bar, prints the line and redraws it). The bar redraws twice a second, so elapsed /
    remaining move between trials.

    While the bar is up on this process's stderr, everything else that writes there goes
    above it as whole lines instead of into it: ``sys.stderr`` is swapped
    for tqdm's line-buffering ``DummyTqdmFile`` (Python warnings, MLflow's log stream, stray
    prints) and console logging handlers are re-routed with ``logging_redirect_tqdm``. Writes
    from native code to file descriptor 2 cannot be caught; the erase at the end
    (``\\r\\033[K``, the whole line) at least leaves no bar fragment behind them."""

    WIDTH = 24

    def __init__(self, level: int = NORMAL, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.level = level
        self.show_lines = level >= VERBOSE or (level == NORMAL and self.tty)
        self.show_bar = level >= NORMAL and self.tty and os.environ.get("TERM") != "dumb"
        self._lock = threading.RLock()
        self._status: Any = None  # () -> (fraction, text)
        self._bar: _Bar | None = None
        self._redirect: contextlib.ExitStack | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lines --------------------------------------------------------------------------
    def line(self, text: str, verbose_only: bool = False) -> None:
        if not self.show_lines or (verbose_only and self.level < VERBOSE):
            return
        self._write(text)

    def warn(self, text: str) -> None:
        """Always shown (also when quiet), without breaking the bar."""
        self._write(text)

    def _write(self, text: str) -> None:
        with self._lock:
            if self._bar is not None:
                _Bar.write(text, file=self.stream)  # clears the bar, writes, redraws
            else:
                print(text, file=self.stream, flush=True)

    # -- bar ----------------------------------------------------------------------------
    def start_bar(self, status: Any) -> None:
        """``status()`` returns ``(fraction done, text after the bar)``."""
        self._status = status
        if not self.show_bar or self._bar is not None:
            return
        try:
            cols, rows = os.get_terminal_size(self.stream.fileno())
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            cols = rows = 0
        # unknown (0) under some pseudo-terminals (`script`, some CI ttys); tqdm then reads
        # -1 rows and draws nothing at all, so both are given
        cols, rows = (cols if cols >= 40 else 100), (rows if rows >= 2 else 24)
        with self._lock:
            self._redirect = self._route_noise()
            self._bar = _Bar(total=1000, file=self.stream, ascii=".#", leave=False,
                             bar_format=f"[{{bar:{self.WIDTH}}}] {{percentage:3.0f}}% {{desc}}",
                             ncols=cols - 1, nrows=rows, mininterval=0, delay=0)
            self._update()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="progress")
        self._thread.start()

    def _route_noise(self) -> contextlib.ExitStack:
        """Send other writers to stderr above the bar while it is up (see the class)."""
        stack = contextlib.ExitStack()
        if self.stream is not sys.stderr:
            return stack  # the bar is elsewhere (a test's stream): stderr cannot break it
        stack.enter_context(logging_redirect_tqdm(loggers=_console_loggers(),
                                                  tqdm_class=_Bar))
        real, proxy = sys.stderr, DummyTqdmFile(sys.stderr)

        def restore() -> None:
            if sys.stderr is proxy:
                sys.stderr = real
            rest = "".join(proxy._buf)  # a last line without its newline
            proxy._buf = []
            if rest:
                real.write(rest + "\n")
                real.flush()

        sys.stderr = proxy  # type: ignore[assignment]
        stack.callback(restore)
        return stack

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self.refresh()

    def _update(self) -> None:
        frac, text = self._status()
        assert self._bar is not None
        self._bar.n = int(min(max(frac, 0.0), 1.0) * 1000)
        self._bar.set_description_str(text, refresh=False)
        self._bar.refresh()

    def refresh(self) -> None:
        with self._lock:
            if self._bar is not None and self._status is not None:
                self._update()

    def stop_bar(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        with self._lock:
            if self._bar is not None:
                self._bar.close()  # leave=False: tqdm blanks its line
                self._bar = None
                # the whole line, also what a native write to fd 2 left beside the bar
                self.stream.write("\r\033[K")
                self.stream.flush()
            if self._redirect is not None:
                self._redirect.close()
                self._redirect = None
            self._status = None

    def bar_text(self) -> str:
        frac, text = self._status()
        frac = min(max(frac, 0.0), 1.0)
        n = int(frac * self.WIDTH)
        return f"[{'#' * n}{'.' * (self.WIDTH - n)}] {frac * 100:3.0f}% {text}"


class Clock:
    """Budget time: ``elapsed`` follows the study's own ``time/elapsed_s`` (which includes
    time a killed earlier process spent) and wall time in between."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.t0 = time.time()
        self.offset = 0.0

    def sync(self, study_elapsed: float) -> None:
        self.offset = study_elapsed - (time.time() - self.t0)

    def elapsed(self) -> float:
        return time.time() - self.t0 + self.offset


class Startup:
    """The command's start-up, phase by phase, before the study's bar exists: on a loaded
    2-core machine it took ~59 s of a 3-minute budget with nothing on screen but a bar at
    "0% 0:00" (issue 43). Each phase prints a line as it begins (on a terminal, or with
    -v); :meth:`done` gives the breakdown, which the closing summary repeats. Times count
    from ``started_at``, when the command started (``tracking.lifecycle.command_started_at``:
    under ``mlflow run``, MLflow's own start-up), as the budget does."""

    FIRST = "launch (interpreter, command line, option checks)"

    def __init__(self, display: Display, started_at: float) -> None:
        self.display = display
        self.started_at = started_at
        self.phases: list[tuple[str, float]] = []
        first = ("launch (mlflow run, interpreter, command line, option checks)"
                 if os.environ.get("MLFLOW_RUN_ID") else self.FIRST)
        self._cur: tuple[str, float] | None = (first, started_at)
        self.text = ""

    def phase(self, what: str) -> None:
        """Phase ``what`` begins now (the previous one ends)."""
        now = time.time()
        self._close(now)
        self._cur = (what, now)
        self.display.line(f"start-up {fmt_time(now - self.started_at)}: {what} …")

    def _close(self, now: float) -> None:
        if self._cur is not None:
            self.phases.append((self._cur[0], max(0.0, now - self._cur[1])))
            self._cur = None

    def done(self, budget_s: float | None = None) -> str:
        """End the start-up; the one-line breakdown (also kept as ``text``)."""
        now = time.time()
        self._close(now)
        total = now - self.started_at
        of = f" of the {fmt_time(budget_s)} budget" if budget_s else ""
        self.text = (f"start-up {fmt_time(total)}{of}: "
                     + " · ".join(f"{w} {s:.1f} s" for w, s in self.phases))
        self.display.line(self.text)
        return self.text


class ProgressTracker(DelegatingTracker):
    """Delegates every call to ``inner`` and reports progress on ``display``; what it
    does not watch goes through :class:`~scarcelab.tracker.DelegatingTracker` unchanged."""

    def __init__(self, inner: Tracker, display: Display, budget_s: float | None = None,
                 label: str = "", entry: dict[str, str] | None = None,
                 kind: str = "study", startup: Startup | None = None) -> None:
        super().__init__(inner)
        self.startup = startup  # the command's start-up phases, ended at start_study
        self.kind = kind  # "study" (trials with epochs) or "al" (repetitions)
        self.display = display
        self.clock = Clock(budget_s or 0.0)
        self.label = label
        self.entry = entry  # entry-point params to log as mlflow run does (None: it did)
        self.best = -1.0
        self.n_done = self.n_failed = self.epochs_total = 0
        self.data_files: list[dict[str, Any]] = []
        self._trial: dict[str, Any] | None = None
        self._nan_warned: set[str] = set()
        self.finishing = False
        self.own_bar = budget_s is not None
        self.phase: tuple[str, float] | None = None  # (what, since) after the budget

    # -- study --------------------------------------------------------------------------
    def start_study(self, name: str, tags: dict[str, str], params: dict[str, Any],
                    artifacts: dict[str, Any], dataset: DatasetInfo | None = None) -> None:
        from scarcelab.data import provenance
        from scarcelab.entrypoints.options import merge_params

        self.data_files = provenance.used()
        described = provenance.described()  # a user's images: params, tags, manifest
        provenance.reset()  # the next run of this process records its own files
        artifacts = {**artifacts, "data_files.json": {"files": self.data_files}}
        tags = {**tags, T.DATA_FILES: provenance.summary(self.data_files)
                or "none (generated data)"}
        if described:
            params = {**described["params"], **params}
            tags = {**tags, **described["tags"]}
            artifacts = {**artifacts, "data_manifest.json": described["manifest"]}
        if self.entry is not None and not os.environ.get("MLFLOW_RUN_ID"):
            params = merge_params(self.entry, params)
        if self.startup is not None:
            self.startup.phase("the study's MLflow run")
        self.inner.start_study(name, tags, params, artifacts, dataset)
        self.clock = Clock(self.clock.budget_s)  # the search's clock starts now, too
        if self.startup is not None:  # ... at the time the budget has already spent
            self.startup.done(self.clock.budget_s)
            self.clock.offset = time.time() - self.startup.started_at
            self.startup = None
        self.name = name
        if self.own_bar:
            self.display.start_bar(self.status)

    def status(self) -> tuple[float, str]:
        el = self.clock.elapsed()
        frac = el / self.clock.budget_s if self.clock.budget_s else 0.0
        t = self._trial
        now = f" · trial {t['number']} epoch {t['epochs']}" if t else ""
        if self.phase is not None:  # past the search: what runs now, for how long
            what, since = self.phase
            now = f" · {what} ({fmt_time(time.time() - since)})"
        best = f" · best val {self.best:.4f}" if self.best >= 0 else ""
        return frac, (f"{fmt_time(el)} elapsed, {fmt_time(self.clock.budget_s - el)} left"
                      f"{now}{best}{' · ' + self.label if self.label else ''}")

    def end_study(self, status: str) -> None:
        self._phase("figures, run description, closing the run")
        t0 = time.time()
        if self.own_bar:
            self.display.stop_bar()
        self.inner.end_study(status)
        self.display.line(f"run closed in {fmt_time(time.time() - t0)}")

    def _phase(self, what: str) -> None:
        """A phase after the budget (or outside any trial) begins: a line, and the bar
        shows it with its running time: no long phase passes in silence."""
        prev, self.phase = self.phase, (what, time.time())
        if prev is not None and prev[0] != what:
            self.display.line(f"  {prev[0]}: done in {fmt_time(time.time() - prev[1])}")
        self.display.line(f"{what} …")
        self.display.refresh()

    # -- trials -------------------------------------------------------------------------
    def start_trial(self, number: int, tags: dict[str, str], params: dict[str, Any]) -> None:
        self._trial = {"number": number, "params": dict(params), "t0": time.time(),
                       "epochs": 0, "val": None, "role": tags.get(T.ROLE, "trial")}
        if self._trial["role"] == "retrain":  # tune's final phase: after the search
            self._phase(f"retrain {number}")
        self.inner.start_trial(number, tags, params)

    def log_metrics(self, metrics: dict[str, float], step: int, scope: str = "trial") -> None:
        metrics = self._finite(metrics)
        if scope == "study":
            if "time/startup_s" in metrics:  # the budget counts from the command's start
                self.clock.sync(float(metrics["time/startup_s"]))
            if "time/elapsed_s" in metrics and self.phase is None:
                self.clock.sync(float(metrics["time/elapsed_s"]))
            if "seg/val_pq" in metrics and self._trial is None:  # segment: one run, epochs
                self.epochs_total += 1
                self.best = max(self.best, float(metrics["seg/val_pq"]))
                loss = metrics.get("train/loss")
                self.display.line(
                    f"epoch {step:>3}: val PQ {metrics['seg/val_pq']:.4f}"
                    + (f", train loss {loss:.4f}" if loss is not None else "")
                    + f"  ({fmt_time(self.clock.elapsed())} elapsed)")
            if "best/val_balanced_accuracy" in metrics:
                self.best = max(self.best, float(metrics["best/val_balanced_accuracy"]))
        elif self._trial is not None and "val/balanced_accuracy" in metrics:
            t = self._trial
            t["epochs"] += 1
            t["val"] = max(t["val"] or -1.0, float(metrics["val/balanced_accuracy"]))
            loss = metrics.get("train/loss")
            self.display.line(
                f"  trial {t['number']} epoch {t['epochs']}: val balanced accuracy "
                f"{metrics['val/balanced_accuracy']:.4f}"
                + (f", train loss {loss:.4f}" if loss is not None else ""), verbose_only=True)
        elif self._trial is not None and self._trial["role"] == "retrain":
            t = self._trial  # tune's retrains: no validation; epochs, then the test score
            t["epochs"] += int("train/loss" in metrics)
            t.setdefault("last", {}).update(metrics)
        self.inner.log_metrics(metrics, step, scope)

    def log_metrics_batch(self, rows: list[tuple[dict[str, float], int]],
                          scope: str = "trial") -> None:
        rows = [(self._finite(m), s) for m, s in rows]
        if self._trial is not None:
            for m, _ in rows:
                self._trial.setdefault("last", {}).update(m)
        self.inner.log_metrics_batch(rows, scope)

    def end_trial(self, status: str, error: str | None = None) -> None:
        self.inner.end_trial(status, error)
        t, self._trial = self._trial, None
        if t is None:
            return
        self.epochs_total += t["epochs"]
        if status == "FINISHED":
            self.n_done += 1
        elif status == "FAILED":
            self.n_failed += 1
        if self.kind == "al":
            last = t.get("last", {})
            auc = f"AUC {last['al/auc']:.4f}" if "al/auc" in last else "AUC -"
            fin = (f", final accuracy {last['al/final_accuracy']:.4f}"
                   if "al/final_accuracy" in last else "")
            why = f" ({(error or '').strip()[:120]})" if error and status != "FINISHED" else ""
            self.display.line(f"repetition {t['number']} {status.lower()} in "
                              f"{fmt_time(time.time() - t['t0'])}: {auc}{fin}{why}")
            return
        if t["role"] == "retrain":
            test = t.get("last", {}).get("test/balanced_accuracy")
            self.display.line(
                f"retrain {t['number']:>2} {status.lower():<8} {t['epochs']:>3} ep "
                f"{fmt_time(time.time() - t['t0']):>7}"
                + (f"  test balanced accuracy {test:.4f}" if test is not None else ""))
            return
        if t.get("rung") is not None:  # tune: stopped by ASHA at a rung
            status = f"pruned at rung {t['rung']}"
        hp = {k: v for k, v in t["params"].items()
              if k not in ("batch_size", "unlabeled_batch_size", "arch", "trial_seed",
                           "epochs")}
        conf = " ".join(f"{k}={fmt_value(v)}" for k, v in hp.items())
        val = f"val {t['val']:.4f}" if t["val"] is not None else "val -"
        why = f" ({error.strip().splitlines()[-1][:120]})" if error and status != "FINISHED" \
            else ""
        self.display.line(
            f"trial {t['number']:>3} {status.lower():<8} {t['epochs']:>3} ep "
            f"{fmt_time(time.time() - t['t0']):>7}  {val}  best {max(self.best, 0):.4f}  "
            f"{conf}{why}")

    def _finite(self, metrics: dict[str, float]) -> dict[str, float]:
        """NaN/inf metric values (an undefined AUROC) are logged as missing, with a
        warning once per name, instead of as a silent NaN."""
        from scarcelab.metrics.undefined import why_undefined

        out = {}
        for k, v in metrics.items():
            if isinstance(v, float | int) and not math.isfinite(float(v)):
                if k not in self._nan_warned:
                    self._nan_warned.add(k)
                    self.display.warn(
                        f"[scarcelab] warning: metric {k} is undefined here ({v}) and is left "
                        f"out of the record: {why_undefined(k)}; said once per metric")
                continue
            out[k] = v
        return out

    def log_model(self, model: nn.Module, example: Any) -> None:
        self.finishing = True
        self._phase("logging the selected model (torch.export, signature, upload)")
        self.inner.log_model(model, example)

    def set_tags(self, tags: dict[str, str], scope: str = "study") -> None:
        if scope == "study" and tags.get(T.PHASE) not in (None, "done"):
            self._phase(str(tags[T.PHASE]))
        if scope == "trial" and self._trial is not None and T.ASHA_RUNG in tags \
                and tags.get(T.PRUNED) == "true":
            self._trial["rung"] = tags[T.ASHA_RUNG]
        self.inner.set_tags(tags, scope)


class CountBar:
    """A bar over a known number of steps (AL iterations, contamination children) whose
    remaining time is extrapolated from the steps done."""

    def __init__(self, display: Display, total: int, what: str) -> None:
        self.display, self.total, self.what = display, max(total, 1), what
        self.done = 0
        self.t0 = time.time()
        self.text = ""

    def status(self) -> tuple[float, str]:
        el = time.time() - self.t0
        left = el / self.done * (self.total - self.done) if self.done else float("nan")
        rest = fmt_time(left) + " left" if math.isfinite(left) else "estimating"
        return self.done / self.total, (f"{self.done}/{self.total} {self.what} · "
                                        f"{fmt_time(el)} elapsed, {rest}"
                                        + (f" · {self.text}" if self.text else ""))

    def step(self, n: int = 1, text: str = "") -> None:
        self.done += n
        if text:
            self.text = text
        self.display.refresh()


def summary_lines(tracker: Any, what: str, wall_s: float, extra: list[str]) -> list[str]:
    """The closing block: experiment, run, model URI, counts, wall time, how to look."""
    import mlflow

    run_id = getattr(tracker, "study_run_id", None)
    uri = mlflow.get_tracking_uri()
    from scarcelab.tracking.experiment_kind import WORKFLOW_QUERY, experiment_url

    exp, exp_id = "?", None
    try:
        from mlflow.tracking import MlflowClient

        c = MlflowClient()
        if run_id is not None:  # a tracker without a study run: nothing to look up
            exp_id = c.get_run(run_id).info.experiment_id
            exp = c.get_experiment(exp_id).name
    except Exception:  # noqa: BLE001 - a summary must not fail a finished study
        pass
    from scarcelab.redaction import redact

    # the address opens MLflow 3's UI on the runs table, not its GenAI overview; a password
    # in the URI is never printed (issue 42 item 3: experiment_url drops user:password)
    url = experiment_url(uri, exp_id) if exp_id is not None else None
    shown = redact(uri)
    if url:
        browse = url
    elif shown.startswith(("http://", "https://")):
        browse = f"open {shown} in a browser"
    else:
        page = (f"http://127.0.0.1:5000/#/experiments/{exp_id}?{WORKFLOW_QUERY}"
                if exp_id is not None else "http://127.0.0.1:5000")
        browse = f"mlflow ui --backend-store-uri {shown}, then open {page}"
    return [*extra,
            f"  experiment: {exp}    {what} run: {run_id}",
            *([f"  model: runs:/{run_id}/model"] if what == "study" else []),
            f"  wall time: {fmt_time(wall_s)}",
            f"  browse: {browse}"]
