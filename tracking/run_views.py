"""What the MLflow UI shows of a study beyond its numbers: figures, a description, names,
system metrics and, on request, a registered model. Mixed into :class:`MlflowTracker`.

Why a mixin: every item is an observation of calls the tracker already receives
(``start_study``'s name and params, the study's ``best/*`` metrics, each trial's per-epoch
``val``/``test`` scores, AL curves), turned into artifacts at ``end_study`` — kept apart
from the tracker's delivery and resume logic, which it only uses through ``_submit`` (so
figures wait in the spool during an outage like every other record).

On a study run (``plots/``): the selected checkpoint's test confusion matrix and ROC curve,
validation/test balanced accuracy over time across trials, and Optuna's parallel-coordinate
and hyperparameter-importance plots of the search. On an AL sweep run: the learning curves
of its repetitions. The run's description (``mlflow.note.content``) says what was run, the
selected trial and the headline numbers.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from scarcelab import tags as T

log = logging.getLogger("scarcelab.tracking")


def system_metrics_enabled() -> bool:
    """On unless ``SCARCELAB_SYSTEM_METRICS=0`` (or psutil is missing)."""
    if os.environ.get("SCARCELAB_SYSTEM_METRICS", "1").lower() in ("0", "false", "no", "off"):
        return False
    try:
        import psutil  # noqa: F401
    except ImportError:
        return False
    return True


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 trial``, ``2 trials``: the count with the noun in the number it needs."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def _short(v: Any) -> str:
    """A hyperparameter's value for a description: floats to 4 significant digits."""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


#: the options that say what a cell is, shown bare and in this order (the rest as k=v)
_CELL_HEAD = ("method", "strategy", "dataset")


def cell_run_name(entry: str, options: tuple[tuple[str, str], ...] | list[Any],
                  limit: int = 100) -> str:
    """A sweep cell's run name a person can read: ``semi fixmatch breastmnist seed=0
    n_labeled=40`` (entry, what runs on what, then the other options of the cell as
    ``k=v``), not the values joined by dashes (``supervised-sup-breastmnist-0-1-1-...``).
    Long values (paths, run references) are cut to their last part."""
    opts = dict(options)
    head = [opts[k] for k in _CELL_HEAD if opts.get(k)]
    rest = []
    for k, v in options:
        if k in _CELL_HEAD:
            continue
        v = str(v)
        if "/" in v and len(v) > 24:
            v = "…" + v.rstrip("/").rsplit("/", 1)[-1]
        rest.append(f"{k}={v}")
    name = " ".join([entry, *head, *rest])
    return name if len(name) <= limit else name[:limit - 1] + "…"


class RunViews:
    """Observes the tracker's calls; writes figures and the description at the end."""

    # state, created lazily so that __init__ of the tracker needs no change
    def _rv(self) -> dict[str, Any]:
        st = self.__dict__.get("_rv_state")
        if st is None:
            st = {"name": "", "params": {}, "tags": {}, "best": {}, "history": {},
                  "curves": {}, "trial": None, "eval": None, "trials": [], "n": 0,
                  "monitor": None, "register": None}
            self.__dict__["_rv_state"] = st
        return st

    # -- observations (called by the tracker) ---------------------------------------------
    def _rv_start(self, name: str, tags: dict[str, Any], params: dict[str, Any]) -> None:
        st = self._rv()
        st.update(name=name, tags=dict(tags), params=dict(params))
        run_id = getattr(self, "study_run_id", None)
        if run_id and system_metrics_enabled():
            try:
                from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

                every = float(os.environ.get("SCARCELAB_SYSTEM_METRICS_INTERVAL_S", "10"))
                # mlflow is unannotated here: the type is inferred from the int default,
                # but its docstring and its wait() take seconds as a float
                mon = SystemMetricsMonitor(run_id, sampling_interval=every,  # pyright: ignore[reportArgumentType]
                                           samples_before_logging=1, resume_logging=True)
                mon.start()
                st["monitor"] = mon
            except Exception as e:  # noqa: BLE001 - system metrics are a convenience
                log.info("system metrics not recorded: %s", e)

    def trial_run_name(self, number: int, role: str = "trial") -> str:
        """``fixmatch-breastmnist-s0/t07``: unique within and across studies of a store;
        a final retraining (tune) is ``…/r03``, so it never shares a trial's name."""
        st = self._rv()
        st["trial"] = number
        mark = "r" if role == "retrain" else "t"
        return f"{st['name'] or 'study'}/{mark}{number:02d}"

    def trial_description(self, number: int, role: str, params: dict[str, Any]) -> str:
        """A trial run's description (the MLflow UI's Description): whose trial it is, what
        it ran with and how the study uses it — a trial run opened on its own said nothing
        (issue 43)."""
        st = self._rv()
        kind = "Final retraining" if role == "retrain" else "Trial"
        run_id = getattr(self, "study_run_id", None)
        lines = [f"**{kind} {number}** of study **{st['name'] or 'study'}**"
                 + (f" (run `{run_id}`)" if run_id else "") + ".", ""]
        p = st["params"]
        what = ", ".join(f"{k}={p[k]}" for k in ("method", "dataset", "seed", "budget_minutes")
                         if k in p)
        if what:
            lines.append(f"Study: {what}.")
        if params:
            lines.append("Hyperparameters: " + ", ".join(
                f"{k}={_short(v)}" for k, v in sorted(params.items())) + ".")
        lines.append("The final retrainings are scored on test; the study reports their mean."
                     if role == "retrain" else
                     "The study keeps the checkpoint best on validation balanced accuracy "
                     "over all its trials; that checkpoint's test scores are the study's.")
        return "\n".join(lines)

    def trial_outcome(self, number: int, status: str) -> str:
        """The line added to a trial's description when it ends: how it went."""
        hist = self._rv()["history"].get(number, [])
        text = f"Ended {status}"
        if hist:
            best = max(hist, key=lambda r: r[1])
            text += (f" after {counted(len(hist), 'evaluation')}; best validation balanced "
                     f"accuracy {best[1]:.4f} (test {best[2]:.4f} at that checkpoint)")
        return text + "."

    def _rv_metrics(self, metrics: dict[str, float], step: int, scope: str) -> None:
        st = self._rv()
        if scope == "study":
            st["best"].update({k: v for k, v in metrics.items() if k.startswith("best/")})
            st.setdefault("final", {}).update(
                {k: v for k, v in metrics.items() if k.startswith(("final/", "seg/"))})
            series = st.setdefault("series", {})  # per-step study series that get a figure
            for k in ("seg/val_pq", "train/loss", "final/test_balanced_accuracy"):
                if k in metrics:
                    series.setdefault(k, {})[int(step)] = float(metrics[k])
            return
        n = st["trial"]
        if n is None:
            return
        if "val/balanced_accuracy" in metrics and "time/elapsed_s" in metrics:
            st["history"].setdefault(n, []).append((
                float(metrics["time/elapsed_s"]), float(metrics["val/balanced_accuracy"]),
                float(metrics.get("test/balanced_accuracy", float("nan")))))
        if "al/test_accuracy" in metrics:
            st["curves"].setdefault(n, []).append((int(step),
                                                   float(metrics["al/test_accuracy"])))

    def _rv_tags(self, tags: dict[str, Any], scope: str) -> None:
        if scope == "study":
            self._rv()["tags"].update(tags)

    def log_evaluation(self, y_true: Any, proba: Any, class_names: list[str],
                       split: str = "test", positive_class: int | None = None) -> None:
        self._rv()["eval"] = (y_true, proba, list(class_names), split, positive_class)

    def log_search(self, trials: list[Any]) -> None:
        self._rv()["trials"] = list(trials)

    def register_model_as(self, name: str | None) -> None:
        """Register the study's logged model under ``name`` in the model registry."""
        self._rv()["register"] = name or None

    # -- at the end ------------------------------------------------------------------------
    def note_artifact(self, path: str) -> None:
        """An artifact a protocol logged itself (segment's ``overlays/…``), so the
        description can name what the run holds."""
        self._rv().setdefault("artifacts", []).append(path)

    def _rv_finish(self, status: str) -> None:
        """Figures and description, submitted before the study run is terminated."""
        st = self._rv()
        try:
            self._rv_figures(st)
        except Exception as e:  # noqa: BLE001 - figures must never cost the study
            log.warning("run figures skipped: %s: %s", type(e).__name__, e)
        try:
            from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

            text = self._rv_description(st, status)
            if text:
                self._submit({"op": "log_batch", "key": "study",  # type: ignore[attr-defined]
                              "tags": [[MLFLOW_RUN_NOTE, text]]})
        except Exception as e:  # noqa: BLE001
            log.warning("run description skipped: %s", e)
        if T.PHASE in st["tags"]:  # the phase tag of a running study: over now
            self._submit({"op": "log_batch", "key": "study",  # type: ignore[attr-defined]
                          "tags": [[T.PHASE, "done" if status == "FINISHED"
                                    else status.lower()]]})
        if st["register"] and status == "FINISHED":
            self._submit({"op": "register_model", "key": "study",  # type: ignore[attr-defined]
                          "name": st["register"]})
        mon = st.get("monitor")
        if mon is not None:
            try:
                mon.finish()
            except Exception as e:  # noqa: BLE001
                log.info("system metrics monitor: %s", e)

    def _rv_png(self, fig: Any, name: str) -> None:
        from scarcelab.tracking.plots import png

        if fig is None:
            return
        folder = Path(self._tmp.name) / "plots"  # type: ignore[attr-defined]
        folder.mkdir(exist_ok=True)
        path = folder / f"{name}.png"
        path.write_bytes(png(fig))
        self._rv().setdefault("plots", []).append(f"plots/{name}.png")
        self._submit({"op": "log_artifact", "key": "study",  # type: ignore[attr-defined]
                      "path": str(path), "artifact_path": "plots"})

    def _rv_figures(self, st: dict[str, Any]) -> None:
        from scarcelab.tracking import plots

        title = st["name"]
        if st["eval"] is not None:
            y, proba, names, split, positive = st["eval"]
            self._rv_png(plots.confusion_figure(y, proba, names, f"{title}: {split} confusion "
                                                "matrix (selected checkpoint)"),
                         f"{split}_confusion_matrix")
            self._rv_png(plots.roc_figure(y, proba, names, f"{title}: {split} ROC",
                                          positive_class=positive), f"{split}_roc")
        if st["history"]:
            self._rv_png(plots.trials_profile_figure(
                st["history"], f"{title}: balanced accuracy over time"), "accuracy_over_time")
        for name, fig in plots.search_figures(st["trials"]).items():
            self._rv_png(fig, f"search_{name}")
        series = st.get("series", {})
        if "seg/val_pq" in series:  # segment: what selected the checkpoint, epoch by epoch
            self._rv_png(plots.series_figure(
                {"validation PQ": series["seg/val_pq"],
                 **({"train loss": series["train/loss"]} if "train/loss" in series else {})},
                f"{title}: by epoch", "epoch",
                mark=int(st["final"]["seg/selected_epoch"])
                if "seg/selected_epoch" in st.get("final", {}) else None), "val_pq_by_epoch")
        if len(series.get("final/test_balanced_accuracy", {})) >= 1:  # tune: the retrains
            self._rv_png(plots.retrains_figure(series["final/test_balanced_accuracy"],
                                               f"{title}: final retrains"), "final_retrains")
        if st["curves"]:
            self._rv_png(plots.learning_curves_figure(st["curves"],
                                                      f"{title}: learning curves"),
                         "learning_curves")

    def _rv_description(self, st: dict[str, Any], status: str) -> str:
        t, p, b = st["tags"], st["params"], st["best"]
        role = t.get(T.ROLE, "study")
        lines = [f"**{st['name']}** — {role} ({status})", ""]
        if st.get("user_description"):
            lines += [str(st["user_description"]), ""]
        what = ", ".join(f"{k}={p[k]}" for k in ("method", "dataset", "arch", "seed",
                                                  "budget_minutes", "search", "strategy",
                                                  "query_size", "repetitions")
                         if k in p)
        if what:
            lines.append(f"Run: {what}.")
        if t.get(T.UNLABELED_POOL):  # an AL sweep on data with a given unlabeled pool
            lines.append(f"Unlabeled pool: {t[T.UNLABELED_POOL]}.")
        if role == "study":
            if T.N_TRIALS in t:
                lines.append(f"Trials: {t[T.N_TRIALS]} "
                             f"({t.get(T.N_FAILED, '0')} failed); selected trial "
                             f"{t.get(T.BEST_TRIAL, '?')} (best validation balanced "
                             "accuracy).")
            if t.get(T.SCHEDULE_SHORT):  # a budget cut the selected trial's schedules short
                lines.append(f"**Warning**: {t[T.SCHEDULE_SHORT]}.")
            head = [(k, b[k]) for k in ("best/val_balanced_accuracy",
                                        "best/test_balanced_accuracy", "best/test_auroc",
                                        "best/test_accuracy") if k in b]
            if head:
                lines.append("Selected checkpoint: " + ", ".join(
                    f"{k.removeprefix('best/').replace('_', ' ')} {v:.4f}" for k, v in head)
                    + ".")
            fin = st.get("final", {})
            if "final/test_balanced_accuracy_mean" in fin:
                sd = fin.get("final/test_balanced_accuracy_std", float("nan"))
                n = fin.get("final/n_runs")
                lines.append(
                    "Final retraining: test balanced accuracy "
                    f"{fin['final/test_balanced_accuracy_mean']:.4f}"
                    + ("" if sd != sd else f" ± {sd:.4f}")
                    + (f" (mean ± std over {int(n)} retrains)" if n else "") + ".")
            seg = [(k, b.get(k, fin.get(k))) for k in ("seg/pq", "seg/mpq", "seg/aji",
                                                       "seg/dice")]
            seg = [(k, v) for k, v in seg if v is not None]
            if seg:
                lines.append("Test (selected checkpoint): " + ", ".join(
                    f"{k.removeprefix('seg/').upper()} {v:.4f}" for k, v in seg) + ".")
            run_id = getattr(self, "study_run_id", None)
            held = []
            if run_id and status == "FINISHED" and st.get("model_logged"):
                held.append(f"model `runs:/{run_id}/model`")
            plots_ = st.get("plots", [])
            if plots_:
                held.append("figures under `plots/` ("
                            + ", ".join(p.removeprefix("plots/") for p in plots_) + ")")
            folders = sorted({a.split("/", 1)[0] for a in st.get("artifacts", []) if "/" in a})
            held += [f"`{f}/` ({sum(a.startswith(f + '/') for a in st['artifacts'])} files)"
                     for f in folders]
            if held:
                lines.append("Artifacts: " + "; ".join(held) + ".")
        elif st["curves"]:
            import numpy as np

            aucs = b.get("al/auc_mean")
            finals = [c[-1][1] for c in st["curves"].values() if c]
            where = ("; learning curves under `plots/`"
                     if "plots/learning_curves.png" in st.get("plots", []) else "")
            lines.append(f"{len(st['curves'])} repetitions; mean final test accuracy "
                         f"{np.mean(finals):.4f}" + (f", mean AUC {aucs:.4f}" if aucs else "")
                         + where + ".")
        return "\n".join(lines)
