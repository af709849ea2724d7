"""scarcelab's ASHA search against Ray Tune's ``ASHAScheduler`` on the same trainable
(issue 28, item 3): trials per hour and the overhead per trial.

gem (the "Tune It or Don't Use It" authors' code, ``scripts/hpo.py``) runs its search with
Ray Tune's ``ASHAScheduler``; ``scarcelab tune`` runs the same rule as an Optuna pruner
over its own study store (:class:`scarcelab.protocols.tune.RayASHAPruner`). Here both
drive one trainable, in alternating rounds, each system in a fresh process:

* **the trainable**: ``ce`` with ``small_cnn`` on ``synthetic_tiny_rgb`` (600 training and
  150 validation 16x16 RGB images, CPU), the per-epoch report being gem's
  ``accuracy_avg5`` on validation balanced accuracy; ``--epochs`` epochs, grace period
  ``--grace``, reduction factor 2, one bracket, ``--trials`` trials, one trial at a time
  (one worker: ``scarcelab tune``'s default, and ``max_concurrent_trials=1`` for Ray);
* **the configurations**: scarcelab's, i.e. trial ``n`` draws lr, weight decay and the
  batch size with :class:`~scarcelab.protocols.study_store.TrialSeededSampler` (seed 0);
  Ray runs the same list (``tune.grid_search`` over the trial index, which it schedules in
  order), and trial ``n`` trains with the seed ``_search`` gives it
  (``scarcelab.trials.trial_seed``), so both sides train the same networks on
  the same batches;
* **ours**: :func:`scarcelab.protocols.tune.run_tune` with ``phase="search"`` — the code
  ``scarcelab tune`` runs — with its MLflow tracker on a fresh SQLite store
  (``ours_mlflow``: what a user runs) and with the in-memory tracker (``ours_memory``: the
  driver without the record keeping);
* **theirs**: ``ray.tune.Tuner`` with ``ASHAScheduler(time_attr="training_iteration",
  max_t=epochs, grace_period, reduction_factor=2, brackets=1)``, the function trainable
  calling ``tune.report`` after each epoch, data passed with ``tune.with_parameters``,
  Ray's default loggers, ``ray.init`` inside the timed span (a user pays it per search);
  ``ray_reuse`` with ``reuse_actors=True`` (one worker process serves every trial: the
  setting most favourable to Ray, and the default comparison), ``ray`` with Ray's
  defaults (here a fresh worker process, importing torch and scarcelab, per trial; slow on
  a loaded machine, so not in the default ``--systems``).

Per system: trials per hour (trials finished or stopped per wall-clock hour of the
search), the wall and CPU seconds (CPU of the whole process tree: Ray's GCS, raylet and
trial workers included, read with psutil before ``ray.shutdown``; a worker that already
exited is not counted, so Ray's CPU is a lower bound with ``ray``), and where the time
goes: the trainable's own seconds (``train_trial`` minus the per-epoch callback), the
per-epoch callback (tracker logging and the pruning decision for ours, ``tune.report``
for Ray), and the rest, the driver's overhead, per trial. The two searches must stop the
same trials at the same epochs (Ray's rule, reimplemented); the bench checks that.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/asha_peers.py --rounds 3

Ends with one ``key=value`` line (DESIGN §5).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SYSTEMS = ("ours_mlflow", "ours_memory", "ray_reuse", "ray")
METHOD, DATASET, ARCH, SEED = "ce", "synthetic_tiny_rgb", "small_cnn", 0


class Timers:
    """Seconds inside ``train_trial`` and inside its per-epoch callback, summed."""

    def __init__(self) -> None:
        self.train_s = self.callback_s = 0.0
        self.train_cpu_s = self.callback_cpu_s = 0.0  # this thread's CPU seconds
        self.trials = 0

    def timed(self, cb: Any) -> Any:
        """``cb`` (a ``train_trial`` callback) with its end-of-epoch hook timed."""
        from scarcelab.train import OnEpochEnd

        def on_epoch(*a: Any, **k: Any) -> Any:
            t, c = time.perf_counter(), time.thread_time()
            try:
                return cb.on_epoch_end(*a, **k)
            finally:
                self.callback_s += time.perf_counter() - t
                self.callback_cpu_s += time.thread_time() - c
        return OnEpochEnd(on_epoch)

    def wrap(self, train_trial: Any) -> Any:
        def timed(*args: Any, **kw: Any) -> Any:
            kw["callbacks"] = [self.timed(cb) for cb in kw.get("callbacks", ())]
            self.trials += 1
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return train_trial(*args, **kw)
            finally:
                self.train_s += time.perf_counter() - t0
                self.train_cpu_s += time.thread_time() - c0
        return timed


def trial_configs(a: argparse.Namespace) -> list[dict[str, Any]]:
    """The configurations scarcelab's search draws for trials 0..n-1 (its sampler depends
    on (seed, trial number, parameter) only), in the order ``_search`` draws them."""
    import optuna

    from scarcelab.methods import get_method
    from scarcelab.methods.space import sample
    from scarcelab.protocols.study_store import TrialSeededSampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = get_method(METHOD).search_space
    study = optuna.create_study(direction="maximize", sampler=TrialSeededSampler(SEED))
    out = []
    for _ in range(a.trials):
        t = study.ask()
        params = sample(space, t)
        params["batch_size"] = t.suggest_categorical("batch_size", list(a.batch_sizes))
        out.append(params)
        study.tell(t, 0.0)
    return out


def _tune_config(a: argparse.Namespace, **kw: Any) -> Any:
    from scarcelab.protocols.tune import TuneConfig

    return TuneConfig(method=METHOD, dataset=DATASET, arch=ARCH, seed=SEED, epochs=a.epochs,
                      grace_period=a.grace, n_trials=a.trials,
                      batch_sizes=tuple(a.batch_sizes), phase="search", **kw)


def _tree_cpu() -> float:
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:4])  # user, system, children_user, children_system
    for ch in me.children(recursive=True):
        try:
            total += sum(ch.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def ours_worker(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    import optuna

    import scarcelab.protocols.tune as tune_mod
    from scarcelab.tracker import InMemoryTracker

    timers = Timers()
    tune_mod.train_trial = timers.wrap(tune_mod.train_trial)  # looked up at call time
    # the method registry (torchvision, via the registry's imports) loaded before the timed
    # span, as the Ray driver has it loaded before ``ray.init``
    configs = trial_configs(a)
    storage = f"sqlite:///{work}/optuna.db"
    if a.system == "ours_mlflow":
        from scarcelab.tracking.mlflow_tracker import MlflowTracker

        tracker: Any = MlflowTracker(experiment="asha-peers",
                                     tracking_uri=f"sqlite:///{work}/mlflow.db")
    else:
        tracker = InMemoryTracker()
    t0, c0 = time.perf_counter(), _tree_cpu()
    res = tune_mod.run_tune(_tune_config(a, storage=storage, study_name="asha-peers"),
                            tracker)
    wall, cpu = time.perf_counter() - t0, _tree_cpu() - c0
    study = optuna.load_study(study_name="asha-peers", storage=storage)
    trials = {t.number: {"state": t.state.name,
                         "values": [t.intermediate_values[k]
                                    for k in sorted(t.intermediate_values)],
                         "params": t.params}
              for t in study.get_trials(deepcopy=False)}
    if [trials[n]["params"] for n in sorted(trials)] != configs:
        raise SystemExit("the search drew other configurations than trial_configs()")
    return {"wall_s": wall, "cpu_s": cpu, "train_s": timers.train_s,
            "callback_s": timers.callback_s, "train_cpu_s": timers.train_cpu_s,
            "callback_cpu_s": timers.callback_cpu_s, "trials": trials,
            "n_done": res.n_complete + res.n_pruned, "n_failed": res.n_failed}


def ray_worker(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    import numpy as np
    import ray
    import torch
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from scarcelab.data import load_raw
    from scarcelab.methods import get_method
    from scarcelab.protocols.tune import AVG_WINDOW, _hp, build_method, prepare
    from scarcelab.train import OnEpochEnd, TrainConfig, train_trial
    from scarcelab.trials import trial_seed

    configs = trial_configs(a)
    t0, c0 = time.perf_counter(), _tree_cpu()
    # the trial workers inherit this environment (PYTHONPATH, OMP_NUM_THREADS); "local":
    # a Ray instance of its own, never one that another user left running on the machine
    # and on loopback only, like a sweep's (tracking/sweep/pool.py, issue 42)
    from scarcelab.tracking.sweep.pool import embedded_init

    embedded_init(ray, num_cpus=1, log_to_driver=False)
    raw = load_raw(DATASET, None)
    search_b, _, mean, std = prepare(raw)
    method_cls = get_method(METHOD)
    settings = _tune_config(a).settings()

    def trainable(config: dict[str, Any], raw: Any, bundle: Any, mean: Any, std: Any
                  ) -> None:
        torch.set_num_threads(a.threads)
        n = int(config["trial"])
        params = configs[n]
        hp = _hp(method_cls, params, {})
        seed_n = trial_seed(SEED, n)  # what scarcelab's _search seeds trial n with
        torch.manual_seed(seed_n)
        g = torch.Generator().manual_seed(seed_n)
        history: list[float] = []
        timing = {"callback_s": 0.0, "callback_cpu_s": 0.0}

        def on_epoch(rep: Any, improved: bool, snap: Any) -> None:
            t, c = time.perf_counter(), time.thread_time()
            history.append(rep.val_balanced_accuracy)
            # cumulative seconds since the trial's training began, callbacks included
            tune.report({"score": float(np.mean(history[-AVG_WINDOW:])),
                         "train_s": t - t_train, "train_cpu_s": c - c_train, **timing})
            timing["callback_s"] += time.perf_counter() - t
            timing["callback_cpu_s"] += time.thread_time() - c

        cfg = TrainConfig(max_epochs=settings.epochs, patience=10**9,
                          batch_labeled=int(params["batch_size"]), device="cpu",
                          labeled_views=(settings.augmentation,))
        method = build_method(method_cls, settings.arch, raw, mean, std, hp)
        t_train, c_train = time.perf_counter(), time.thread_time()
        train_trial(method, bundle, cfg, deadline=float("inf"), generator=g,
                    probe_rng=np.random.default_rng(seed_n), callbacks=[OnEpochEnd(on_epoch)])

    sched = ASHAScheduler(time_attr="training_iteration", metric="score", mode="max",
                          max_t=settings.epochs, grace_period=settings.grace_period,
                          reduction_factor=2, brackets=1)
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trainable, raw=raw, bundle=search_b,
                                                 mean=mean, std=std), {"cpu": 1}),
        param_space={"trial": tune.grid_search(list(range(a.trials)))},
        tune_config=tune.TuneConfig(scheduler=sched, num_samples=1,
                                    max_concurrent_trials=1,
                                    reuse_actors=a.system == "ray_reuse"),
        run_config=tune.RunConfig(name="asha-peers", storage_path=str(work / "ray"),
                                  verbose=0))
    grid = tuner.fit()
    trials: dict[int, dict[str, Any]] = {}
    train_s = callback_s = train_cpu_s = callback_cpu_s = 0.0
    for r in grid:
        df = r.metrics_dataframe
        n = int(r.config["trial"])
        it = int(df["training_iteration"].max())
        trials[n] = {"state": "COMPLETE" if it >= settings.epochs else "PRUNED",
                     "values": [float(v) for v in df.sort_values("training_iteration")
                                ["score"]], "params": configs[n], "error": str(r.error or "")}
        # the last report's cumulative seconds: those after it (one epoch's tail) are
        # the trainable's return, counted as overhead
        last = df.sort_values("training_iteration").iloc[-1]
        train_s += float(last["train_s"])
        callback_s += float(last["callback_s"])
        train_cpu_s += float(last["train_cpu_s"])
        callback_cpu_s += float(last["callback_cpu_s"])
    cpu = _tree_cpu() - c0
    ray.shutdown()
    wall = time.perf_counter() - t0
    n_failed = sum(1 for t in trials.values() if t["error"])
    return {"wall_s": wall, "cpu_s": cpu, "train_s": train_s, "callback_s": callback_s,
            "train_cpu_s": train_cpu_s, "callback_cpu_s": callback_cpu_s, "trials": trials,
            "n_done": len(trials) - n_failed, "n_failed": n_failed}


# ------------------------------------------------------------------------------ driver
def _spawn(args: list[str], threads: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                              ""))
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(threads)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    r = subprocess.run([sys.executable, __file__, "--worker", *args, "--json", out], env=env,
                       check=False)
    if r.returncode != 0:
        raise SystemExit(f"worker {args[:2]} failed with exit code {r.returncode}")
    res = json.loads(Path(out).read_text())
    Path(out).unlink()
    return res


def _outcome(trials: dict[str, Any]) -> dict[str, tuple[str, int]]:
    return {str(n): (t["state"], len(t["values"])) for n, t in trials.items()}


def _values(trials: dict[str, Any]) -> dict[str, list[float]]:
    return {str(n): t["values"] for n, t in trials.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--system", choices=SYSTEMS)
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS[:3]),
                   help="ray = Ray's defaults (a fresh worker process per trial); "
                        "ray_reuse = reuse_actors=True (one worker for all trials)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--grace", type=int, default=1)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work-dir", default="", help="stores and Ray results (default: temp)")
    p.add_argument("--out", default="", help="write every number as JSON here")
    p.add_argument("--json", default="")
    a = p.parse_args()
    if a.worker:
        import torch

        torch.set_num_threads(a.threads)
        work = Path(tempfile.mkdtemp(prefix=f"{a.system}_", dir=a.work_dir or None))
        res = (ray_worker if a.system.startswith("ray") else ours_worker)(a, work)
        Path(a.json).write_text(json.dumps(res))
        return

    load0 = os.getloadavg()[0]
    common = ["--trials", str(a.trials), "--epochs", str(a.epochs), "--grace", str(a.grace),
              "--batch-sizes", *map(str, a.batch_sizes), "--threads", str(a.threads)]
    if a.work_dir:
        Path(a.work_dir).mkdir(parents=True, exist_ok=True)
        common += ["--work-dir", a.work_dir]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in a.systems}
    for r in range(a.rounds):
        order = list(a.systems) if r % 2 == 0 else list(reversed(a.systems))
        for system in order:
            print(f"round {r + 1}/{a.rounds}: {system} (load {os.getloadavg()[0]:.1f})",
                  flush=True)
            res = _spawn(["--system", system, *common], a.threads)
            n = max(1, res["n_done"])
            tr_cpu = res["train_cpu_s"] - res["callback_cpu_s"]
            print(f"  {res['n_done']} trials in {res['wall_s']:.1f} s wall, "
                  f"{res['cpu_s']:.1f} s CPU; trainable {res['train_s'] - res['callback_s']:.1f}"
                  f" s wall / {tr_cpu:.1f} s CPU, per-epoch callback "
                  f"{res['callback_s']:.1f} s / {res['callback_cpu_s']:.1f} s CPU; overhead "
                  f"{(res['wall_s'] - res['train_s']) / n:.2f} s wall, "
                  f"{(res['cpu_s'] - tr_cpu) / n:.2f} s CPU per trial (callbacks included)",
                  flush=True)
            runs[system].append(res)
    rows = {}
    ref = _outcome(runs[a.systems[0]][0]["trials"])
    ref_v = _values(runs[a.systems[0]][0]["trials"])
    for system, rs in runs.items():
        per_hour = [3600.0 * x["n_done"] / x["wall_s"] for x in rs]
        rows[system] = {
            "trials_per_hour": statistics.median(per_hour),
            "wall_s": statistics.median(x["wall_s"] for x in rs),
            "cpu_s": statistics.median(x["cpu_s"] for x in rs),
            "trainable_s": statistics.median(x["train_s"] - x["callback_s"] for x in rs),
            "callback_s": statistics.median(x["callback_s"] for x in rs),
            "overhead_s_per_trial": statistics.median(
                (x["wall_s"] - x["train_s"]) / max(1, x["n_done"]) for x in rs),
            "cpu_s_per_trial": statistics.median(x["cpu_s"] / max(1, x["n_done"]) for x in rs),
            "trainable_cpu_s": statistics.median(x["train_cpu_s"] - x["callback_cpu_s"]
                                                 for x in rs),
            "callback_cpu_s": statistics.median(x["callback_cpu_s"] for x in rs),
            # everything but the training itself (per-epoch callbacks included), per trial
            "overhead_cpu_s_per_trial": statistics.median(
                (x["cpu_s"] - x["train_cpu_s"] + x["callback_cpu_s"]) / max(1, x["n_done"])
                for x in rs),
            "n_done": rs[0]["n_done"], "n_failed": rs[0]["n_failed"],
            "same_outcome": all(_outcome(x["trials"]) == ref for x in rs),
            "same_values": all(_values(x["trials"]) == ref_v for x in rs),
            "pruned": sum(1 for t in rs[0]["trials"].values() if t["state"] == "PRUNED"),
            "epochs_trained": sum(len(t["values"]) for t in rs[0]["trials"].values()),
        }
    print("\n| system | trials/hour | wall / CPU (s) | trainable wall / CPU (s) | per-epoch "
          "callback wall / CPU (s) | overhead per trial wall / CPU (s) | CPU per trial (s) "
          "| pruned, epochs trained | same stops, same reports |")
    print("|---|---|---|---|---|---|---|---|---|")
    for system, t in rows.items():
        print(f"| {system} | {t['trials_per_hour']:.0f} | {t['wall_s']:.1f} / {t['cpu_s']:.1f}"
              f" | {t['trainable_s']:.1f} / {t['trainable_cpu_s']:.1f} | "
              f"{t['callback_s']:.1f} / {t['callback_cpu_s']:.1f} | "
              f"{t['overhead_s_per_trial']:.2f} / {t['overhead_cpu_s_per_trial']:.2f} | "
              f"{t['cpu_s_per_trial']:.2f} | "
              f"{t['pruned']}, {t['epochs_trained']} | "
              f"{'yes' if t['same_outcome'] else 'NO'}, "
              f"{'yes' if t['same_values'] else 'NO'} |")
    summary: dict[str, Any] = {}
    for system, t in rows.items():
        summary[f"{system}_trials_per_hour"] = t["trials_per_hour"]
        summary[f"{system}_overhead_s_per_trial"] = t["overhead_s_per_trial"]
        summary[f"{system}_cpu_s_per_trial"] = t["cpu_s_per_trial"]
        summary[f"{system}_overhead_cpu_s_per_trial"] = t["overhead_cpu_s_per_trial"]
    for peer in ("ray_reuse", "ray"):
        for system in (s for s in rows if s.startswith("ours") and peer in rows):
            summary[f"{system}_vs_{peer}_trials_per_hour"] = (
                rows[system]["trials_per_hour"] / rows[peer]["trials_per_hour"])
    summary["same_stops"] = all(t["same_outcome"] for t in rows.values())
    summary["same_reports"] = all(t["same_values"] for t in rows.values())
    summary["rounds"] = a.rounds
    summary["load"] = round((load0 + os.getloadavg()[0]) / 2, 1)
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "runs": runs, "summary": summary,
                                           "args": vars(a)}, indent=1))
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in summary.items()))


if __name__ == "__main__":
    main()
