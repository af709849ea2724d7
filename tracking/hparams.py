"""``hparams_from``: the named hyperparameter source of the transfer strategy.

SSL-vs-SSL (Huang et al., CVPR 2024, App. D.2) compares its budgeted search with a
"transfer" strategy that does no search on the target dataset: it trains with the best
configuration found on another dataset (the paper transfers from TissueMNIST, and from
CIFAR-10). In scarcelab the source is named by ``hparams_from``:

* ``defaults`` — the method's literature defaults (no lookup);
* an MLflow **run id** — a study run (its best trial's configuration, tag
  ``scarcelab.best_trial``) or a trial run (its own configuration);
* an MLflow **experiment name** — the finished study of the same method with the highest
  ``best/val_balanced_accuracy`` in that experiment, then its best trial.

The lookup needs MLflow, so it lives here; the core receives the resolved dict as
``StudyConfig.hparams`` plus a label (``StudyConfig.hparams_source``) that is logged on the
study (tag ``scarcelab.hparams_source``). Only the method's own hyperparameters (its search
space and defaults) are taken; batch sizes, arch and seeds are not part of a configuration.
Values come back from MLflow params (JSON strings, see ``tracking.mlflow_tracker``) and are
decoded to the types of the method's defaults.
"""

from __future__ import annotations

import json
import re
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from scarcelab import tags as T
from scarcelab.errors import ConfigError
from scarcelab.methods import get_method
from scarcelab.methods.space import Choice
from scarcelab.redaction import redact

_RUN_ID = re.compile(r"^(?:runs:/)?([0-9a-f]{32})/?$")


def _decode(text: str, like: Any) -> Any:
    """An MLflow param string back to a value of the type of ``like`` (a default)."""
    try:
        v = json.loads(text)
    except json.JSONDecodeError:
        v = {"True": True, "False": False, "None": None}.get(text, text)
    if isinstance(like, bool) or like is None or isinstance(v, bool):
        return v
    if isinstance(like, int) and isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(like, float) and isinstance(v, int):
        return float(v)
    return v


def _reference(method_cls: Any, name: str) -> Any:
    if name in method_cls.defaults:
        return method_cls.defaults[name]
    dist = method_cls.search_space.get(name)
    if isinstance(dist, Choice) and dist.options:
        return dist.options[0]
    return getattr(dist, "low", None)


def _best_study(client: MlflowClient, exp_id: str, method: str, name: str) -> Any:
    runs = client.search_runs(
        [exp_id], f"tags.`{T.ROLE}` = 'study' and tags.`{T.METHOD}` = '{method}' "
        "and attributes.status = 'FINISHED'",
        order_by=["metrics.`best/val_balanced_accuracy` DESC"], max_results=1)
    if not runs:
        raise ConfigError(f"hparams_from={name!r}: experiment {name!r} holds no finished study "
                          f"of {method!r} to take a configuration from")
    return runs[0]


def _best_trial(client: MlflowClient, study: Any, spec: str) -> Any:
    number = study.data.tags.get(T.BEST_TRIAL)
    if number is None:
        raise ConfigError(f"hparams_from={spec!r}: study run {study.info.run_id} has no "
                          "scarcelab.best_trial tag (it did not finish)")
    trials = client.search_runs(
        [study.info.experiment_id], f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{study.info.run_id}' and "
        f"tags.`{T.TRIAL}` = '{number}'", max_results=1)
    if not trials:
        raise ConfigError(f"hparams_from={spec!r}: the best trial ({number}) of study run "
                          f"{study.info.run_id} is not in the tracking store")
    return trials[0]


def resolve_hparams(spec: str, method: str, client: MlflowClient | None = None
                    ) -> tuple[dict[str, Any] | None, str]:
    """``(configuration, label)`` for ``hparams_from=spec``; ``(None, "defaults")`` for
    the defaults. Raises :class:`ConfigError` naming the parameter when nothing matches."""
    spec = (spec or "").strip()
    if spec in ("", "defaults"):
        return None, "defaults"
    method_cls = get_method(method)
    client = client or MlflowClient()
    run = None
    m = _RUN_ID.match(spec)
    if m:
        try:
            run = client.get_run(m.group(1))
        except MlflowException:
            run = None
    if run is None:
        exp = client.get_experiment_by_name(spec)
        if exp is None:
            raise ConfigError(
                f"hparams_from={spec!r}: no MLflow run or experiment of that name at "
                f"{redact(mlflow.get_tracking_uri())}; give 'defaults', a study or trial run "
                "id, or an experiment name")
        run = _best_study(client, exp.experiment_id, method, spec)
        label = f"experiment {spec}: study {run.info.run_id}"
    else:
        label = f"run {run.info.run_id}"
    role = run.data.tags.get(T.ROLE)
    if role == "study":
        trial = _best_trial(client, run, spec)
        label += f", trial {trial.data.tags.get(T.TRIAL)}"
    elif role == "trial":
        trial = run
    else:
        raise ConfigError(f"hparams_from={spec!r}: run {run.info.run_id} is not a scarcelab "
                          f"study or trial (scarcelab.role={role!r})")
    theirs = trial.data.tags.get(T.METHOD)
    if theirs != method_cls.registered_name:
        raise ConfigError(f"hparams_from={spec!r}: that configuration is for method {theirs!r}, "
                          f"not {method!r}")
    names = set(method_cls.search_space) | set(method_cls.defaults)
    hp = {k: _decode(v, _reference(method_cls, k)) for k, v in trial.data.params.items()
          if k in names}
    src = run.data.tags.get(T.DATASET)
    if src:
        label += f" ({src})"
    return hp, label


__all__ = ["resolve_hparams"]
