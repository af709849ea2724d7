"""``supervised`` / ``semi`` / ``self``: one budgeted study of one method.

Options are typed in ``entrypoints.options`` (the one validation layer for the CLI and
``mlflow run -P``); nothing heavy is imported until they have parsed, so a typo costs a
fraction of a second, not the ~10 s of importing torch and MLflow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click

from scarcelab.accel import NAMES as ACCEL_NAMES
from scarcelab.entrypoints._accel import accel_from, accel_options
from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import (
    BUDGET,
    DEVICE,
    DIAGNOSTICS,
    RUN,
    WHAT,
    Bool,
    DatasetName,
    Device,
    Float,
    Folder,
    GroupedCommand,
    Int,
    LabelCount,
    Overrides,
    Registered,
    Word,
    apply_identity,
    check_device,
    check_overrides,
    data_options,
    dataset_options,
    declared_params,
    entry_map,
    entry_params,
    identity_options,
    option,
    verbosity,
    verbosity_options,
)
from scarcelab.entrypoints.options import (
    SEED_MAX as _SEED_MAX,
)
from scarcelab.errors import ScarcelabError

#: the option of the supervised / semi / self commands that registers the selected model
REGISTER_MODEL = option(
    "--register-model", group=RUN, row=False, default="none", show_default=True,
    type=Word(), help="register the selected model in the MLflow model registry under this "
    "name (a new version each study); auto = scarcelab-<family>-<method>-<dataset>; none = "
    "do not register")


def study_options(fn: Callable[..., Any] | None = None, *, dataset: str = "breastmnist",
                  family: str | None = None, folds: bool = False) -> Any:
    """The options every study command shares (``dataset``: its default, as MLproject's;
    ``family``: the methods ``--method`` accepts, checked without importing them;
    ``folds``: whether ``--folds`` is one)."""
    if fn is None:
        return lambda f: study_options(f, dataset=dataset, family=family, folds=folds)
    opts = [
        option("--method", group=WHAT, required=True, type=Registered("method", family),
                     help=f"registered {family or ''} method (scarcelab list methods)"
                     .replace("  ", " ")),
        option("--dataset", group=WHAT, default=dataset, show_default=True, type=DatasetName(),
                     help="a registered dataset or plugin (scarcelab list datasets), or your "
                     "own images: folder:PATH or csv:FILE (docs/own-images.md)"),
        option("--data-dir", group=WHAT, row=False,
               default="default", show_default=True, type=Folder(),
                     help="existing folder with <dataset>.npz (default: $SCARCELAB_DATA or "
                     "~/.cache/scarcelab; downloaded there if missing)"),
        option("--arch", group=WHAT, default="auto", show_default=True,
                     type=Registered("arch", extra=("auto",)),
                     help="backbone; auto = resnet18 on GPU, small_cnn on CPU"),
        option("--seed", group=WHAT, row=False,
               default="0", show_default=True, type=Int(0, _SEED_MAX),
                     help="seed of the split, the search and training; each seed is one "
                     "sample of the method in the leaderboard"),
        option("--budget-minutes", group=BUDGET, default="3", show_default=True,
                     type=Float(0.0, 7 * 24 * 60, lo_open=True),
                     help="budget of the whole command, in minutes of --budget-clock: "
                     "start-up (at most half of it) and the final model logging (an 8 s "
                     "reserve) are inside it; "
                     "semi's C-Score diagnostics are not charged (time/diag_s)"),
        option("--budget-clock", group=BUDGET, default="wall", show_default=True,
                     type=Word(("wall", "cpu")),
                     help="what the budget counts: wall time, or this process's CPU time "
                     "(reproducible on a shared CPU machine; not for GPU runs)"),
        option("--class-weights", group=WHAT, default="balanced", show_default=True,
                     type=Word(("balanced", "none")),
                     help="the labeled loss: balanced = each class weighted by its inverse "
                     "labeled frequency (and the probe's class_weight=balanced), as "
                     "SSL-vs-SSL trains every method; none = unweighted"),
        option("--max-epochs", group=BUDGET, default="200", show_default=True, type=Int(1, 10**6),
                     help="epochs of a trial at most; --patience and the budget end it "
                     "sooner"),
        option("--patience", group=BUDGET, default="20", show_default=True, type=Int(1, 10**6),
                     help="epochs without a better validation score before a trial stops"),
        option("--n-labeled", group=WHAT, default="default", show_default=True,
                     type=LabelCount(allow_all=True),
                     help="labeled train size, the dataset default, or 'all' (every train "
                     "sample not held out for validation; supervised methods only)"),
        option("--n-val", group=WHAT, default="default", show_default=True,
                     type=LabelCount(allow_all=False),
                     help="validation size (>= 1, it selects the model); defaults to "
                     "n_labeled (with 'all': the dataset's default validation size)"),
        option("--allow-large-val", group=WHAT, default="false", show_default=True, type=Bool(),
                     help="accept a validation set larger than the labeled training set "
                     "(refused by default: unrealistic when labels are scarce)"),
        option("--search", group=BUDGET, default="random", show_default=True,
                     type=Word(("random", "none", "fixed")),
                     help="random = budgeted random search; none = transfer (one run on "
                     "train + validation, configuration from --hparams-from); fixed = one "
                     "run of the --hparams-from configuration with validation selection"),
        option("--hparams-from", group=BUDGET, row=False,
               default="defaults", show_default=True, type=Word(),
                     help="configuration for search=none/fixed: defaults, an MLflow study or "
                     "trial run id, or an experiment name (its best study of this method)"),
        option("--transfer-epochs", group=BUDGET, default="default", show_default=True,
                     type=Int(1, 10**6, default_ok=True),
                     help="epochs of search=none (SSL-vs-SSL App. D.2: 100; 80 for TMED-2)"),
        option("--positive-class", group=WHAT, default="default", show_default=True, type=Word(),
                     help="binary tasks: the class that sensitivity at 95% specificity, the "
                     "partial AUROC and the ROC figure are about (0, 1 or a class name); "
                     "default = the dataset's disease class (BreastMNIST malignant, "
                     "PneumoniaMNIST pneumonia), else 1"),
        option("--val-from", group=WHAT, default="auto", show_default=True,
                     type=Word(("auto", "official", "train")),
                     help="validation set from the dataset's official validation split "
                     "(official), from train (train), or official where it is large enough "
                     "(auto)"),
        option("--batch-size", group=DEVICE, default="default", show_default=True,
                     type=Int(1, 10**6, default_ok=True),
                     help="labeled images per step; default = the method's own"),
        option("--unlabeled-batch-size", group=DEVICE, default="default", show_default=True,
                     type=Int(1, 10**6, default_ok=True),
                     help="unlabeled images per step (semi and self methods); default = "
                     "the method's own"),
        option("--max-steps-per-epoch", group=DEVICE, default="default", show_default=True,
                     type=Int(1, None, default_ok=True),
                     help="cap on the steps of an epoch (one pass over the labeled and "
                     "unlabeled images); default = no cap"),
        option("--max-trials", group=BUDGET, default="0", show_default=True, type=Int(0, None),
                     help="stop after this many trials (0 = until the budget is spent)"),
        option("--device", group=DEVICE, default="auto", show_default=True, type=Device(),
                     help="where to train; auto = cuda when available, else cpu"),
        option("--study-name", group=BUDGET, row=False,
               default="auto", show_default=True, type=Word(),
                     help="the Optuna study workers share (with $OPTUNA_STORAGE): auto = "
                     "the one named after this command's settings (workers of the same "
                     "command share its trials and --max-trials; once finished, the command "
                     "run again repeats it); new = a study of this worker's own; any other "
                     "NAME = the study of that name"),
        option("--set", "overrides", group=BUDGET, row=False, default="none", show_default=True,
                     type=Overrides(),
                     help="fixed hyperparameters, e.g. 'lambda_u=1,threshold=0.9'"),
        option("--experiment", group=RUN, row=False, entry=False,
               default="", help="MLflow experiment (ignored under "
                     "mlflow run, which chooses it)"),
        option("--diag-samples", group=DIAGNOSTICS, row=False,
               default="512", show_default=True, type=Int(0, None),
                     help="unlabeled subsample for the per-epoch C-Score diagnostics of "
                     "semi-supervised runs (0 = off)"),
        option("--probe-solver", group=DIAGNOSTICS, before="sklearn",
               default="sklearn", show_default=True,
                     type=Word(("sklearn", "torch")),
                     help="self-supervised methods' per-epoch linear probe: scikit-learn "
                     "on the host, or torch (all penalties at once, on the device)"),
        option("--eval-every-steps", group=BUDGET, before="0",
               default="0", show_default=True, type=Int(0, None),
                     help="evaluate after an epoch only once this many steps are not yet "
                     "evaluated (0 = every epoch; for tiny sets); patience then counts "
                     "evaluations"),
        option("--schedule-horizon", group=BUDGET, before="epochs",
               default="budget", show_default=True,
                     type=Word(("budget", "epochs")),
                     help="what the cosine learning rate and the unlabeled-weight ramps "
                     "are planned over: budget = the steps each trial's share of the "
                     "budget buys (measured; never more than --max-epochs), so they "
                     "complete when the budget ends the trial; epochs = --max-epochs, "
                     "as the papers (paper suites; a short budget leaves them unfinished)"),
    ]
    fn = accel_options(fn)  # listed after the options above
    for opt in reversed(opts):
        fn = opt(fn)
    return identity_options(verbosity_options(dataset_options(fn, folds=folds)))


#: MLproject parameter name -> click parameter name of the supervised / semi / self entry
#: points, from the options' declarations (tests/entrypoints/test_cli.py checks them
#: against MLproject)
FAMILY_ENTRY = entry_map(study_options(folds=True), REGISTER_MODEL)


def check_study(kw: dict[str, Any]) -> dict[str, Any]:
    """The checks that need the core (still before any data is read): the device exists,
    ``--set`` values fit the method, 'all labels' leaves the method the data it needs.
    Returns the typed overrides."""
    from scarcelab.methods import get_method

    check_device(kw["device"])
    method_cls = get_method(kw["method"])
    overrides = check_overrides(kw["overrides"], method_cls)
    # own images bring their own pool: 'all' labels leave it whole (checked after loading)
    if kw["n_labeled"] == "all" and method_cls.views and kw.get("data_options") is None:
        raise click.BadParameter(
            f"'all' labels every train sample, which leaves {kw['method']} "
            f"({method_cls.family}) no unlabeled data to learn from; give a number, or run "
            "a supervised method for the all-labels reference", param_hint="'--n-labeled'")
    return overrides


#: the study options that reach ``StudyConfig`` other than as the field of their own name
#: (each turned into its value(s) by :func:`study_config`), and those that go elsewhere
#: (the run's identity, the tracker, the console: ``entrypoints/study.py::_run``)
CONVERTED = ("overrides", "positive_class", "study_name", "hparams_from", *ACCEL_NAMES)
NOT_CONFIG = ("experiment", "register_model", "run_name", "tags", "description", "quiet",
              "verbose")


def study_options_names() -> frozenset[str]:
    """The click names of every option a study command declares."""
    return frozenset(str(p.name) for p in declared_params(study_options(folds=True),
                                                          REGISTER_MODEL))


def study_config(family: str, kw: dict[str, Any]) -> Any:
    """The ``StudyConfig`` for parsed ``study_options`` (shared by every study command).

    An option whose click name is a ``StudyConfig`` field is handed over as it parsed, with
    no line of its own here: adding a study option is its declaration and the core's field
    (issue 44 item 2; tests/entrypoints/test_options_reach_config.py fails for an option
    that reaches nothing). Only :data:`CONVERTED` options are turned into something else."""
    from dataclasses import fields

    from scarcelab.protocols.search import StudyConfig

    if "data_options" not in kw:
        kw["data_options"] = data_options(kw, kw["dataset"])
    overrides = check_study(kw)
    hparams, hparams_source = None, "defaults"
    if (kw.get("hparams_from") or "defaults") != "defaults":
        from scarcelab.tracking.hparams import resolve_hparams

        hparams, hparams_source = resolve_hparams(kw["hparams_from"], kw["method"])
    elif kw.get("search") == "fixed":
        # the help offers `defaults` for search=fixed: the method's literature defaults
        # (an empty given configuration; the core refuses fixed with none given at all)
        hparams = {}
    # a command's own options (contamination's --ood...) stay out, whatever their names
    handed = ({f.name for f in fields(StudyConfig)} - set(CONVERTED)) & (
        study_options_names() | {"data_options"})
    given = {k: v for k, v in kw.items() if k in handed}
    positive = kw.get("positive_class")
    return StudyConfig(
        **given, family=family, overrides=overrides, hparams=hparams,
        hparams_source=hparams_source,
        positive_class=None if positive in (None, "", "default") else positive,
        accel=accel_from(kw), **_study_identity(kw.get("study_name") or "auto"))


def _study_identity(name: str) -> dict[str, Any]:
    """``--study-name``: ``auto`` (the study named after the settings), ``new`` (a study of
    its own) or a name, as ``StudyConfig``'s ``study_name`` / ``fresh_study``."""
    if name == "auto":
        return {}
    if name == "new":
        return {"fresh_study": True}
    return {"study_name": name}


def _run(family: str, kw: dict[str, Any], ctx: click.Context) -> None:
    level = verbosity(ctx, kw.pop("quiet"), kw.pop("verbose"))
    ident = {k: kw.pop(k) for k in ("run_name", "tags", "description")}
    t0 = time.time()
    cfg = study_config(family, kw)
    import dataclasses

    from scarcelab.entrypoints._progress import Display, Startup
    from scarcelab.tracking.lifecycle import command_started_at

    # the budget is the command's wall time: its start-up counts (protocols.search)
    started = command_started_at()
    display = Display(level)
    startup = Startup(display, started)
    startup.phase("imports (torch, MLflow)")
    from scarcelab.protocols.search import run_study
    from scarcelab.tracking.mlflow_tracker import check_tracking_server

    cfg = dataclasses.replace(cfg, started_at=started)
    startup.phase("tracking server check")
    check_tracking_server()  # a dead server: one clear line now, not a traceback later
    reg = kw.get("register_model") or "none"
    if reg == "auto":  # a name that says what the model is, not just "model"
        from scarcelab.data.own import dataset_label

        reg = f"scarcelab-{family}-{cfg.method}-{dataset_label(cfg.dataset)}"
    reg = None if reg in ("none", "default", "") else reg
    if cfg.data_options is not None and cfg.data_options.folds > 1:
        _run_folds(family, cfg, kw, ctx, display, ident, reg, t0)
        return
    tracker = _tracker(kw, ident, reg, display, cfg, ctx)
    tracker.startup = startup
    startup.phase("data, split and model set-up")
    res = run_study(cfg, tracker)
    _summary(tracker, cfg, res, t0, startup=startup.text)


def _tracker(kw: dict[str, Any], ident: dict[str, Any], reg: str | None, display: Any,
             cfg: Any, ctx: click.Context, parent: str | None = None, label: str = "") -> Any:
    """The progress-reporting MLflow tracker of one study (a child of ``parent`` when
    given: a fold of a --folds study)."""
    from scarcelab.entrypoints._progress import ProgressTracker
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    inner: Any = MlflowTracker(experiment=kw["experiment"] or None)
    inner.register_model_as(reg)
    apply_identity(inner, dict(ident))
    if parent is not None:
        from scarcelab.entrypoints.contamination import ChildStudyTracker

        inner = ChildStudyTracker(parent, inner)
    return ProgressTracker(inner, display, budget_s=cfg.budget_minutes * 60.0, label=label,
                           entry=entry_params(ctx, FAMILY_ENTRY))


def _summary(tracker: Any, cfg: Any, res: Any, t0: float, what: str = "study",
             startup: str = "") -> None:
    from scarcelab.entrypoints._progress import fmt_time, summary_lines
    from scarcelab.tracking.run_views import counted

    test = res.best_test.get("balanced_accuracy", float("nan"))
    click.echo("\n".join(summary_lines(tracker, what, time.time() - t0, [
        f"study {getattr(tracker, 'name', cfg.method)}: {counted(res.n_trials, 'trial')} "
        f"({res.n_failed} failed), {counted(tracker.epochs_total, 'epoch')} in this "
        "process, budget "
        f"{fmt_time(cfg.budget_minutes * 60)}",
        f"  best val balanced accuracy {res.best_val:.4f} (trial {res.best_trial}), test "
        f"balanced accuracy of that checkpoint {test:.4f}",
        *([f"  {startup}"] if startup else []),
        *([f"  warning: {res.schedule_warning}"]
          if getattr(res, "schedule_warning", "") else [])])))
    if tracker.spool_left is not None:  # trained, but the record is not complete: say so
        raise ScarcelabError(
            f"the tracking records of study run {tracker.study_run_id} were not all delivered; "
            f"deliver them with `python -m scarcelab.tracking.spool replay {tracker.spool_left}`")


def _run_folds(family: str, cfg: Any, kw: dict[str, Any], ctx: click.Context, display: Any,
               ident: dict[str, Any], reg: str | None, t0: float) -> None:
    """``--folds k``: k studies, fold i's labeled images the test set of study i, as child
    runs of one parent run (role ``folds``; under ``mlflow run`` the run it created), which
    gets the mean and sample std over folds of the selected checkpoints' test and
    validation balanced accuracy. Every fold's data, split and refusals are checked before
    the parent exists. Each fold has the whole ``--budget-minutes`` (the command takes k
    times it); each study is tagged ``scarcelab.fold=i/k``, and the leaderboard counts the
    folds of a seed as samples of their own (docs/own-images.md, "Folds")."""
    import dataclasses
    import os

    import mlflow
    import numpy as np
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

    from scarcelab import tags as T
    from scarcelab.data import provenance
    from scarcelab.data.own import dataset_label
    from scarcelab.entrypoints.contamination import _experiment_id
    from scarcelab.entrypoints.options import merge_params, param_str
    from scarcelab.protocols.search import check_data, run_study

    k = cfg.data_options.folds
    cfgs = [dataclasses.replace(cfg, data_options=dataclasses.replace(cfg.data_options,
                                                                      fold=i))
            for i in range(k)]
    for c in cfgs:  # every fold's refusal before any run exists
        check_data(c)
    provenance.reset()
    client = MlflowClient()
    parent = os.environ.pop("MLFLOW_RUN_ID", None)  # the fold studies are runs of their own
    exp_id = _experiment_id(client, parent, kw["experiment"] or None)
    base = ident["run_name"] or f"{cfg.method}-{dataset_label(cfg.dataset)}-s{cfg.seed}"
    if parent is None:
        parent = client.create_run(exp_id, run_name=f"{base}-folds").info.run_id
        params = merge_params(entry_params(ctx, FAMILY_ENTRY), {"dataset": cfg.dataset})
        for key, v in params.items():
            client.log_param(parent, key, param_str(v))
    mlflow.set_experiment(experiment_id=exp_id)
    for key, v in {T.ROLE: "folds", T.FAMILY: family, T.METHOD: cfg.method,
                   T.DATASET: cfg.dataset, T.SEED: str(cfg.seed), T.TEST_FROM: "fold",
                   T.FOLD: f"-/{k}", **ident["tags"],
                   **({MLFLOW_RUN_NOTE: ident["description"]}
                      if ident["description"] else {})}.items():
        client.set_tag(parent, key, v)
    status, tests, vals = "FAILED", [], []
    try:
        for i, c in enumerate(cfgs):
            label = f"fold {i + 1}/{k}"
            display.line(f"{label}: study {i + 1} of {k}")
            child = {**ident, "run_name": f"{base}-fold{i + 1}"}
            tracker = _tracker(kw, child, reg, display, c, ctx, parent, label)
            res = run_study(dataclasses.replace(c, started_at=time.time()), tracker)
            tests.append(res.best_test.get("balanced_accuracy", float("nan")))
            vals.append(res.best_val)
            _summary(tracker, c, res, t0, what=label)
        metrics = {"folds/n": float(k)}
        for key, xs in (("test_balanced_accuracy", tests), ("val_balanced_accuracy", vals)):
            metrics[f"folds/{key}_mean"] = float(np.mean(xs))
            metrics[f"folds/{key}_std"] = float(np.std(xs, ddof=1))
        for key, v in metrics.items():
            client.log_metric(parent, key, v)
        status = "FINISHED"
    finally:
        client.set_terminated(parent, status)
    click.echo(f"{k} folds of {cfg.method} on {cfg.dataset} (parent run {parent}): test "
               f"balanced accuracy {np.mean(tests):.4f} ± {np.std(tests, ddof=1):.4f} "
               "(mean ± sample std over folds)")


def _family_command(family: str, default_method: str) -> None:
    short = f"Run a budgeted {family} study of one method."

    @main.command(name=family, cls=GroupedCommand, short_help=short,
                  help=f"{short}\n\nFor example: scarcelab "
                  f"{family} --method {default_method} --dataset breastmnist "
                  "--budget-minutes 3")
    @study_options(family=family, folds=True)
    @REGISTER_MODEL
    @click.pass_context
    def cmd(ctx: click.Context, **kw: Any) -> None:
        try:
            _run(family, kw, ctx)
        except ScarcelabError as e:
            raise click.ClickException(str(e)) from e


for _family, _default in (("supervised", "sup"), ("semi", "fixmatch"), ("self", "simclr")):
    _family_command(_family, _default)
