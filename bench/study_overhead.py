"""Where a study's wall time goes, phase by phase (issue 28 §1, issue 27 item 1).

Runs one study of each family at the README's settings — `semi` (FixMatch, the README's
main command), `supervised` (sup), `self` (SimCLR), each a 3-minute budget on BreastMNIST
with small_cnn on CPU; `segment` (1 minute, CoNSeP patches, the README's `segment`
with a random encoder); `tune` (the README's CPU example, 1-minute search cap, then its
retrains) — each in a fresh process, and splits the process's wall time into:

    start    process start and imports (torch, MLflow) until the command has parsed
    setup    tracking-server check, tracker, study record (run, params, artifacts)
    data     loading the dataset and drawing the split
    train    the training steps (everything inside the epochs but what is listed below)
    eval     per-epoch evaluation (validation + test of every epoch; segment: validation)
    probe    the self-supervised linear probe's fits and probabilities (out of eval)
    diag     C-Score diagnostics (semi; not charged to the budget)
    ckpt     checkpointing (in-memory snapshots + uploads of checkpoints/best.pt)
    track    per-epoch tracking calls and trial runs (log_batch, start/end trial)
    between  between trials (sampling, model construction, the search store)
    final    everything after the last training epoch, itself split into:
               final.eval     a final evaluation (segment: test + cross-test sets;
                              study: re-scoring the test set for the figures)
               final.ckpt     the last checkpoint upload
               final.export   torch.export of the model (ours, for the spool)
               final.log_model mlflow.pytorch.log_model (signature, its own export,
                              requirements inference, upload) — reqs/export listed apart
               final.figures  plots/ and the run description, system-metrics stop
               final.close    spool close, run terminated
               final.exit     summary printing and interpreter exit
    retrain  tune: the final retrains (their own train/eval/track inside)

How: the bench starts ``python bench/study_overhead.py --child …``, which imports the
command's modules, wraps the functions named in ``HOOKS`` with timers (no behaviour
change: same arguments, same return values) and runs the CLI in-process. Phases are
derived from those timestamps; the parent measures the process's wall and CPU time
(``os.wait4``: user + system of the child and everything it waited for, e.g. MLflow's
requirements-inference subprocess). Timings the code already logs (``time/*``) are read
back from the run and printed beside them. The hooks work on older revisions of the code
too (a function that is absent is simply not timed), so ``--code DIR`` measures another
checkout (e.g. ``git archive main | tar -x -C DIR``) with this same bench.

``--launcher mlflow`` runs the README's literal command instead (``mlflow run . -e semi
-P method=fixmatch``, with ``--env-manager local``): then only the whole wall, the CPU
time and the run's own ``time/*`` metrics are known (the child is MLflow's).

    OMP_NUM_THREADS=1 nice -n 10 /work/main/.venv/bin/python bench/study_overhead.py \\
        --families semi,supervised,self,segment,tune --out /work/out/perf/overhead

``--extra`` adds CLI options to every command (``--probe-solver torch``,
``--eval-every-steps 10``); each study family's table ends with the same split per
evaluated epoch. The last line is a key=value summary (DESIGN §5).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import importlib
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"

# family -> (entry point, CLI arguments at the README's settings)
FAMILIES: dict[str, tuple[str, list[str]]] = {
    "semi": ("semi", ["--method", "fixmatch", "--dataset", "breastmnist"]),
    "supervised": ("supervised", ["--method", "sup", "--dataset", "breastmnist"]),
    "self": ("self", ["--method", "simclr", "--dataset", "breastmnist"]),
    "segment": ("segment", ["--dataset", "consep_patches", "--encoder", "random",
                            "--cross-test", "nuclei_cpm15"]),
    "tune": ("tune", ["--method", "ce", "--dataset", "cifair10", "--arch", "small_cnn",
                      "--epochs", "12", "--grace-period", "2", "--n-trials", "8"]),
}
BUDGET_FLAG = {"semi": "--budget-minutes", "supervised": "--budget-minutes",
               "self": "--budget-minutes", "segment": "--budget-minutes",
               "tune": "--budget-minutes"}

# (module, attribute path, event name). Wrapped where they are *looked up* at call time.
HOOKS: list[tuple[str, str, str]] = [
    ("scarcelab.protocols.search", "prepare_data", "data"),
    ("scarcelab.protocols.search", "_log_figures", "final.eval_figures"),
    ("scarcelab.protocols.search", "train_trial", "train_trial"),
    ("scarcelab.protocols.search", "export_classifier", "export_classifier"),
    ("scarcelab.train", "evaluate", "evaluate"),
    ("scarcelab.train", "snapshot", "snapshot"),
    ("scarcelab.probe", "LinearProbe.fit", "probe"),
    ("scarcelab.probe", "LinearProbe.predict_proba", "probe"),
    ("scarcelab.probe", "TorchLinearProbe.fit", "probe"),
    ("scarcelab.probe", "TorchLinearProbe.proba", "probe"),
    ("scarcelab.tracking.mlflow_tracker", "check_tracking_server", "check_server"),
    ("scarcelab.tracking.mlflow_tracker", "MlflowTracker.start_study", "start_study"),
    ("scarcelab.tracking.mlflow_tracker", "MlflowTracker.start_trial", "start_trial"),
    ("scarcelab.tracking.mlflow_tracker", "MlflowTracker.end_trial", "end_trial"),
    ("scarcelab.tracking.mlflow_tracker", "MlflowTracker.log_metrics", "log_metrics"),
    ("scarcelab.tracking.mlflow_tracker", "MlflowTracker.log_checkpoint", "log_checkpoint"),
    ("scarcelab.tracking.mlflow_tracker", "MlflowTracker.log_model", "log_model"),
    ("scarcelab.tracking.mlflow_tracker", "MlflowTracker.log_image", "log_image"),
    ("scarcelab.tracking.mlflow_tracker", "MlflowTracker.end_study", "end_study"),
    ("scarcelab.tracking.mlflow_tracker", "MlflowTracker._rv_finish", "figures"),
    ("scarcelab.tracking.mlflow_tracker", "export_model", "export"),
    ("scarcelab.tracking.mlflow_tracker", "load_exported", "load_exported"),
    ("mlflow.pytorch", "log_model", "mlflow_log_model"),
    ("mlflow.models", "infer_pip_requirements", "reqs"),
    ("mlflow.pytorch", "_infer_signature_from_input_example", "signature"),
    ("torch.export", "export", "torch_export"),
    ("scarcelab.protocols.segment", "load_nuclei", "data"),
    ("scarcelab.protocols.segment", "predict_set", "seg_predict"),
    ("scarcelab.protocols.segment", "score_maps", "seg_score"),
    ("scarcelab.protocols.segment", "_train_and_test", "seg_run"),
    ("scarcelab.protocols.tune", "load_raw", "data"),
    ("scarcelab.protocols.tune", "prepare", "data"),
    ("scarcelab.protocols.tune", "train_trial", "train_trial"),
    ("scarcelab.protocols.tune", "_search", "tune_search"),
    ("scarcelab.protocols.tune", "_final", "retrain"),
]


# -- child: run the command with timers --------------------------------------------------------
def cpu() -> float:
    """CPU seconds of this process (all threads) and of the children it waited for (MLflow's
    requirements-inference subprocess): a clock that moves with work, not with the load."""
    import resource

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.marks: dict[str, float] = {}
        self.cpu_marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.marks[name], self.cpu_marks[name] = time.time(), cpu()

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        fn = getattr(owner, attr)
        if getattr(fn, "_bench_wrapped", False):
            return
        rec = self

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if name == "train_trial":  # time its callbacks too (tracking, diagnostics)
                kwargs["callbacks"] = [rec.timed_callback(cb)
                                       for cb in kwargs.get("callbacks", ())]
            ev: dict[str, Any] = {"name": name, "t0": time.time(), "c0": cpu()}
            if name == "log_metrics":
                keys = args[1] if len(args) > 1 else kwargs.get("metrics", {})
                ev["epoch"] = any(k.startswith(("val/", "seg/val_")) for k in keys)
            try:
                return fn(*args, **kwargs)
            finally:
                ev["t1"], ev["c1"] = time.time(), cpu()
                rec.events.append(ev)

        timed._bench_wrapped = True  # type: ignore[attr-defined]
        setattr(owner, attr, timed)

    def timed_callback(self, cb: Any) -> Any:
        """``cb`` (a ``train_trial`` callback) with its end-of-epoch hook timed as
        ``on_epoch`` and, if it measures, its diagnostics as ``diag``."""
        timed = types.SimpleNamespace(
            on_epoch_end=self.timed_callable(cb.on_epoch_end, "on_epoch"))
        if hasattr(cb, "diagnostics"):
            timed.diagnostics = self.timed_callable(cb.diagnostics, "diag")
        return timed

    def timed_callable(self, fn: Any, name: str) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            ev = {"name": name, "t0": time.time(), "c0": cpu()}
            try:
                return fn(*args, **kwargs)
            finally:
                ev["t1"], ev["c1"] = time.time(), cpu()
                self.events.append(ev)
        return timed


def _install(rec: Recorder) -> list[str]:
    missing = []
    for mod_name, path, name in HOOKS:
        try:
            owner: Any = importlib.import_module(mod_name)
            *parents, attr = path.split(".")
            for p in parents:
                owner = getattr(owner, p)
            getattr(owner, attr)
        except (ImportError, AttributeError):
            missing.append(f"{mod_name}.{path}")
            continue
        rec.wrap(owner, attr, name)
    return missing


def child(report: str, argv: list[str]) -> int:
    rec = Recorder()
    rec.mark("interpreter")

    def after_atexit() -> None:  # registered first, so it runs after every other handler
        Path(report + ".atexit").write_text(json.dumps([time.time(), cpu()]))

    atexit.register(after_atexit)
    import scarcelab.entrypoints.cli as cli  # noqa: F401 - the command's own first import
    # what the command imports anyway before any work (torch, MLflow, the protocols),
    # here up front so that it can be wrapped
    for m in ("torch", "mlflow", "mlflow.pytorch", "mlflow.models", "torch.export",
              "scarcelab.train", "scarcelab.protocols.search",
              "scarcelab.tracking.mlflow_tracker"):
        importlib.import_module(m)
    for m in ("scarcelab.protocols.segment", "scarcelab.protocols.tune"):
        if any(a in argv for a in ("segment", "tune")):
            try:
                importlib.import_module(m)
            except ImportError:
                pass
    rec.mark("imports")
    missing = _install(rec)

    def write() -> None:
        rec.mark("exit")
        Path(report).write_text(json.dumps({"events": rec.events, "marks": rec.marks,
                                            "cpu_marks": rec.cpu_marks,
                                            "not_timed": missing}))

    atexit.register(write)
    from scarcelab.entrypoints.cli import main

    prof = None
    if os.environ.get("SCARCELAB_BENCH_PROFILE"):
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    try:
        main.main(args=argv, prog_name="scarcelab", standalone_mode=False)
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        if prof is not None:
            prof.disable()
            prof.dump_stats(os.environ["SCARCELAB_BENCH_PROFILE"])
    rec.mark("command_done")
    return 0


# -- parent: launch, measure, split into phases --------------------------------------------------
def _spans(events: list[dict[str, Any]], name: str, lo: float = -1e18, hi: float = 1e18
           ) -> list[tuple[float, float]]:
    return [(e["t0"], e["t1"]) for e in events if e["name"] == name
            and e["t0"] >= lo and e["t1"] <= hi]


def _sum(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def phases(rep: dict[str, Any], t_launch: float, t_end: float, family: str
           ) -> dict[str, float]:
    """Seconds per phase; they sum to the wall time (``other`` takes the remainder)."""
    ev, marks = rep["events"], rep["marks"]
    out: dict[str, float] = {}
    imports_done = marks.get("imports", t_launch)
    data = sorted(_spans(ev, "data"))
    starts = _spans(ev, "start_study")
    first_work = min([s[0] for s in data + starts] or [imports_done])
    out["start"] = imports_done - t_launch
    out["setup"] = first_work - imports_done  # option parsing, server check, tracker
    out["data"] = _sum(data)
    out["setup"] += _sum(starts)
    if family == "segment":
        epoch_logs = [e for e in ev if e["name"] == "log_metrics" and e.get("epoch")]
        train_end = max((e["t1"] for e in epoch_logs), default=imports_done)
        run = _spans(ev, "seg_run")
        search_lo = run[0][0] if run else imports_done
        val = _sum(_spans(ev, "seg_predict", search_lo, train_end)) + _sum(
            _spans(ev, "seg_score", search_lo, train_end))
        track = _sum([(e["t0"], e["t1"]) for e in epoch_logs])
        span = train_end - search_lo
        out.update(eval=val, track=track, train=span - val - track)
        final_lo = train_end
    elif family == "tune":
        search = _spans(ev, "tune_search")
        retr = _spans(ev, "retrain")
        lo = search[0][0] if search else imports_done
        hi = search[0][1] if search else lo
        tt = _spans(ev, "train_trial", lo, hi)
        ev_s = _sum(_spans(ev, "evaluate", lo, hi))
        cb = _sum(_spans(ev, "on_epoch", lo, hi))
        out.update(train=_sum(tt) - ev_s - cb, eval=ev_s, track=cb,
                   between=(hi - lo) - _sum(tt))
        if retr:
            r0, r1 = retr[0]
            out["retrain"] = r1 - r0
            rt = _spans(ev, "train_trial", r0, r1)
            out["retrain.train"] = _sum(rt) - _sum(_spans(ev, "evaluate", r0, r1)) - _sum(
                _spans(ev, "on_epoch", r0, r1))
            out["retrain.eval"] = _sum(_spans(ev, "evaluate", r0, r1))
            out["retrain.log_model"] = _sum(_spans(ev, "log_model", r0, r1))
            out["retrain.other"] = (out["retrain"] - out["retrain.train"]
                                    - out["retrain.eval"] - out["retrain.log_model"])
            final_lo = r1
        else:
            final_lo = hi
        out["between"] += max(0.0, (retr[0][0] if retr else final_lo) - hi)
    else:
        tt = _spans(ev, "train_trial")
        lo = max([s[1] for s in starts] or [imports_done])
        hi = max([b for _, b in tt] or [lo])
        ev_s = _sum(_spans(ev, "evaluate", lo, hi))
        diag = _sum(_spans(ev, "diag", lo, hi))
        cb = _sum(_spans(ev, "on_epoch", lo, hi))
        ck = _sum(_spans(ev, "snapshot", lo, hi)) + _sum(_spans(ev, "log_checkpoint", lo, hi))
        train = _sum(tt) - ev_s - diag - cb
        trial_runs = _sum(_spans(ev, "start_trial", lo, hi)) + _sum(
            _spans(ev, "end_trial", lo, hi))
        ck_in_cb = _sum([s for s in _spans(ev, "snapshot", lo, hi) + _spans(
            ev, "log_checkpoint", lo, hi) if any(a <= s[0] and s[1] <= b for a, b in
                                                 _spans(ev, "on_epoch", lo, hi))])
        probe = _sum(_spans(ev, "probe", lo, hi))
        out.update(train=train, eval=ev_s - probe, probe=probe, diag=diag, ckpt=ck,
                   track=cb - ck_in_cb + trial_runs,
                   between=(hi - lo) - _sum(tt) - trial_runs - (ck - ck_in_cb))
        # the same split per evaluated epoch (issue 40 item 3): what one epoch costs
        n_ev = len(_spans(ev, "evaluate", lo, hi))
        out["epochs"] = float(n_ev)
        for k in ("train", "eval", "probe", "diag", "ckpt", "track"):
            out[f"per_epoch.{k}"] = out[k] / max(1, n_ev)
        final_lo = hi
    # the final phase: from the end of training to the process's exit
    final = t_end - final_lo
    out["final"] = final
    f: dict[str, float] = {}
    f["eval"] = (_sum(_spans(ev, "seg_predict", final_lo)) + _sum(_spans(ev, "seg_score",
                                                                        final_lo))
                 + _sum(_spans(ev, "evaluate", final_lo)))
    fig_eval = _spans(ev, "final.eval_figures", final_lo)
    f["eval"] += _sum(fig_eval)
    f["ckpt"] = _sum(_spans(ev, "log_checkpoint", final_lo))
    f["export"] = _sum(_spans(ev, "export", final_lo)) + _sum(
        _spans(ev, "export_classifier", final_lo)) + _sum(_spans(ev, "load_exported", final_lo))
    lm = _spans(ev, "mlflow_log_model", final_lo)
    f["log_model"] = _sum(lm)
    inside = [(a, b) for a, b in _spans(ev, "torch_export", final_lo)
              if any(x <= a and b <= y for x, y in lm)]
    f["log_model.export"] = _sum(inside)
    f["log_model.reqs"] = _sum(_spans(ev, "reqs", final_lo))
    f["log_model.signature"] = _sum(_spans(ev, "signature", final_lo))
    f["images"] = _sum(_spans(ev, "log_image", final_lo))
    f["figures"] = _sum(_spans(ev, "figures", final_lo))
    ends = _spans(ev, "end_study", final_lo)
    f["close"] = _sum(ends) - f["figures"]
    done = max([b for _, b in ends] or [t_end])
    f["exit"] = t_end - done
    if "atexit_done" in marks:  # exit hooks (MLflow's, torch's) vs interpreter teardown
        f["exit.summary"] = marks.get("command_done", done) - done
        f["exit.atexit"] = marks["atexit_done"] - marks.get("exit", done)
        f["exit.teardown"] = t_end - marks["atexit_done"]
    f["other"] = final - sum(v for k, v in f.items() if "." not in k)
    for k, v in f.items():
        out[f"final.{k}"] = v
    top = [k for k in out if "." not in k and k != "epochs"]
    out["other"] = (t_end - t_launch) - sum(out[k] for k in top)
    return out


def _run_metrics(store: str) -> dict[str, Any]:
    """The study run's own ``time/*`` metrics (sums over its trials' epochs) and tags."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        return {}
    c = MlflowClient(store)
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()],
                         "tags.`scarcelab.role` = 'study'", max_results=1,
                         order_by=["attributes.start_time DESC"])
    if not runs:
        return {}
    study = runs[0]
    out: dict[str, Any] = {"run_id": study.info.run_id,
                           "run_wall_s": ((study.info.end_time or 0) - study.info.start_time)
                           / 1000.0}
    children = c.search_runs([study.info.experiment_id],
                             f"tags.`mlflow.parentRunId` = '{study.info.run_id}'",
                             max_results=1000)
    sums: dict[str, float] = {}
    for r in [study, *children]:
        for key in ("time/epoch_s", "time/eval_s", "time/diag_s", "time/data_s",
                    "time/probe_s"):
            if r is study and key in ("time/epoch_s", "time/eval_s"):
                continue
            hist = c.get_metric_history(r.info.run_id, key)
            if key == "time/diag_s" and r is study:
                continue  # the study logs the running total; the trials log each epoch
            sums[key] = sums.get(key, 0.0) + sum(m.value for m in hist)
    for k, v in study.data.metrics.items():
        if k.startswith("time/"):
            out[f"study.{k}"] = v
    out.update({f"sum.{k}": v for k, v in sums.items()})
    out["n_trials"] = len(children)
    return out


def launch(family: str, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    entry, args = FAMILIES[family]
    budget = a.segment_budget if family == "segment" else (
        a.tune_budget if family == "tune" else a.budget_minutes)
    args = [*args, BUDGET_FLAG[family], str(budget), *a.extra.split()]
    if family == "tune" and a.tune_n_final:
        args += ["--n-final", str(a.tune_n_final)]
    store = out / f"{family}.db"
    report = out / f"{family}.events.json"
    for old in (store, report, Path(str(report) + ".atexit")):
        old.unlink(missing_ok=True)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}",
           "PYTHONPATH": str(a.code) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "SCARCELAB_DATA": os.environ.get("SCARCELAB_DATA", str(SHARED / "medmnist"))}
    env.setdefault("OMP_NUM_THREADS", str(a.threads))
    if a.profile:
        env["SCARCELAB_BENCH_PROFILE"] = str(out / f"{family}.prof")
    art = out / f"{family}-artifacts"
    art.mkdir(parents=True, exist_ok=True)
    if a.launcher == "mlflow":
        params = []
        it = iter(args)
        for k in it:
            params += ["-P", f"{k.lstrip('-').replace('-', '_')}={next(it)}"]
        cmd = [str(Path(sys.executable).parent / "mlflow"), "run", str(a.code), "-e", entry,
               "--env-manager", "local", *params]
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(report), "--",
               entry, *args]
    store_s = None
    if not a.fresh_store:  # the steady state: a store that exists (its creation apart)
        ts = time.time()
        subprocess.run([sys.executable, "-c", "import sys; from mlflow.tracking import "
                        "MlflowClient; MlflowClient(sys.argv[1]).search_experiments()",
                        env["MLFLOW_TRACKING_URI"]], env=env, check=True,
                       capture_output=True)
        store_s = time.time() - ts
    log = open(out / f"{family}.log", "w")
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=art, env=env, stdout=log, stderr=subprocess.STDOUT)
    _, status, ru = os.wait4(p.pid, 0)
    t1 = time.time()
    log.close()
    res: dict[str, Any] = {"family": family, "budget_s": float(budget) * 60.0,
                           "wall_s": t1 - t0, "cpu_s": ru.ru_utime + ru.ru_stime,
                           "rc": os.waitstatus_to_exitcode(status), "cmd": cmd,
                           "log": str(out / f"{family}.log"), "store_create_s": store_s}
    if report.exists():
        rep = json.loads(report.read_text())
        last = Path(str(report) + ".atexit")
        if last.exists():
            rep["marks"]["atexit_done"], rep["cpu_marks"]["atexit_done"] = json.loads(
                last.read_text())
        res["phases"] = phases(rep, t0, t1, family)
        # the same split on the CPU clock (self + waited-for children): robust to the load
        events_cpu = [{**e, "t0": e["c0"], "t1": e["c1"]} for e in rep["events"]]
        res["phases_cpu"] = phases({"events": events_cpu, "marks": rep["cpu_marks"]}, 0.0,
                                   res["cpu_s"], family)
        res["not_timed"] = rep.get("not_timed", [])
    res["run"] = _run_metrics(f"sqlite:///{store}")
    return res


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


TOP = ("start", "setup", "data", "train", "eval", "probe", "diag", "ckpt", "track",
       "between", "retrain", "final", "other")


def table(res: dict[str, Any]) -> str:
    wall, cpu_s = res["wall_s"], res["cpu_s"]
    ph, pc = res.get("phases", {}), res.get("phases_cpu", {})
    lines = [f"{res['family']}: wall {wall:.1f} s, CPU {cpu_s:.1f} s, budget "
             f"{res['budget_s']:.0f} s (wall - budget {wall - res['budget_s']:+.1f} s), "
             f"rc {res['rc']}"
             + (f"; creating its sqlite store took {res['store_create_s']:.1f} s more (not "
                "in the table: done before)" if res.get("store_create_s") else ""),
             f"  {'phase':<24}{'wall s':>8} {'share':>6}  {'CPU s':>7} {'share':>6}"]

    def row(k: str, indent: int) -> str:
        c = pc.get(k, float("nan"))
        return (f"{' ' * indent}{k:<{26 - indent}}{ph[k]:8.1f} {100 * ph[k] / wall:5.1f}%  "
                f"{c:7.1f} {100 * c / cpu_s if cpu_s else float('nan'):5.1f}%")

    for k in TOP:
        if k in ph:
            lines.append(row(k, 2))
            for sub in sorted(x for x in ph if x.startswith(k + ".")):
                if abs(ph[sub]) >= 0.05 or abs(pc.get(sub, 0.0)) >= 0.05:
                    lines.append(row(sub, 4))
    if ph.get("epochs"):
        lines.append(f"  per evaluated epoch ({ph['epochs']:.0f}), ms wall (CPU): " + ", ".join(
            f"{k[10:]} {1e3 * ph[k]:.1f} ({1e3 * pc.get(k, float('nan')):.1f})"
            for k in sorted(x for x in ph if x.startswith("per_epoch."))))
    run = res.get("run", {})
    logged = {k: v for k, v in run.items() if k.startswith(("sum.", "study."))}
    if logged:
        lines.append("  logged by the run: " + ", ".join(
            f"{k}={v:.1f}" for k, v in sorted(logged.items())))
    return "\n".join(lines)


def summary(results: list[dict[str, Any]], load0: float, load1: float) -> str:
    kv: list[str] = []
    for r in results:
        f, ph, wall = r["family"], r.get("phases", {}), r["wall_s"]
        kv += [f"{f}_wall_s={wall:.1f}", f"{f}_cpu_s={r['cpu_s']:.1f}",
               f"{f}_over_budget_s={wall - r['budget_s']:.1f}"]
        if ph:
            pc, c = r.get("phases_cpu", {}), r["cpu_s"]
            if ph.get("epochs"):
                kv += [f"{f}_epochs={ph['epochs']:.0f}"] + [
                    f"{f}_per_epoch_{k[10:]}_cpu_ms={1e3 * pc.get(k, float('nan')):.1f}"
                    for k in sorted(x for x in ph if x.startswith("per_epoch."))]
            kv += [f"{f}_train_eval_share={(ph.get('train', 0) + ph.get('eval', 0)) / wall:.3f}",
                   f"{f}_train_eval_share_cpu="
                   f"{(pc.get('train', 0) + pc.get('eval', 0)) / c if c else float('nan'):.3f}",
                   f"{f}_final_s={ph.get('final', float('nan')):.1f}",
                   f"{f}_final_cpu_s={pc.get('final', float('nan')):.1f}"]
            if "retrain" in ph:
                kv.append(f"{f}_retrain_s={ph['retrain']:.1f}")
    kv += [f"load_start={load0:.1f}", f"load_end={load1:.1f}"]
    return " ".join(kv)


def main() -> int:
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        return child(sys.argv[i + 1], sys.argv[sys.argv.index("--") + 1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", default="semi,supervised,self,segment,tune")
    p.add_argument("--budget-minutes", type=float, default=3.0,
                   help="supervised / semi / self (the README's 3)")
    p.add_argument("--segment-budget", type=float, default=1.0)
    p.add_argument("--tune-budget", type=float, default=1.0)
    p.add_argument("--tune-n-final", type=int, default=0, help="0 = the command's 10")
    p.add_argument("--launcher", choices=("cli", "mlflow"), default="cli")
    p.add_argument("--code", type=Path, default=ROOT, help="checkout whose scarcelab runs")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--fresh-store", action="store_true",
                   help="let the command create its sqlite store (a first run); default: "
                   "created before, its cost reported apart")
    p.add_argument("--profile", action="store_true",
                   help="also write a cProfile of each command (<family>.prof)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "study_overhead")
    p.add_argument("--extra", default="", help="more CLI options for every command, e.g. "
                   "'--probe-solver torch --eval-every-steps 8'")
    a = p.parse_args()
    a.code = a.code.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    load0 = _load()
    for fam in a.families.split(","):
        if fam not in FAMILIES:
            p.error(f"--families: unknown {fam!r}; valid: {', '.join(FAMILIES)}")
        r = launch(fam, a, a.out)
        r["load"] = _load()
        results.append(r)
        print(table(r), flush=True)
        if r.get("not_timed"):
            print(f"  (not timed in this checkout: {', '.join(r['not_timed'])})")
    (a.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"machine load (1-min average) {load0:.1f} at start, {_load():.1f} at the end; "
          f"{os.cpu_count()} cores; code {a.code}; launcher {a.launcher}")
    print(summary(results, load0, _load()))
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
