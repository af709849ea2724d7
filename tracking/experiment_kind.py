"""The experiment kind MLflow 3's UI reads to decide what an experiment page opens on.

Why: MLflow 3 shows an experiment whose ``mlflow.experimentKind`` tag is unset either as a
GenAI experiment (an overview of traces, an assistant pane) or asks the user which kind it
is; scarcelab's experiments hold training runs, so they should open on the runs table.
MLflow sets the tag from its UI (the "experiment type" selector) and exports no Python
constant for it: the tag key and the value ``custom_model_development`` ("Machine
learning") are the ones its UI bundle checks (``ExperimentKind.CUSTOM_MODEL_DEVELOPMENT``
in ``mlflow/server/js``; its onboarding skill ``assistant/skills/mlflow-onboarding/SKILL.md``
documents both values), verified against MLflow 3.17.

An experiment that already carries a kind keeps it: the user chose it.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

#: the experiment tag MLflow 3's UI reads for the experiment's kind
KIND_TAG = "mlflow.experimentKind"
#: MLflow's kind for classic (non-GenAI) model development: the page opens on the runs
CLASSIC_ML = "custom_model_development"


def creation_tags() -> dict[str, str]:
    """Tags for ``MlflowClient.create_experiment``: an experiment scarcelab creates is born
    with the classic-ML kind, so that no window exists in which the UI guesses."""
    return {KIND_TAG: CLASSIC_ML}


def mark_classic(client: Any, experiment_id: str) -> None:
    """Give experiment ``experiment_id`` the classic-ML kind unless it has a kind already.

    Called wherever scarcelab writes runs into an experiment it did not necessarily create
    (``Default``, one made with ``mlflow experiments create``, one a sweep made). A failure
    is logged, never raised: the tag only changes which page the UI opens on, and a study
    must not fail over it (a read-only user, a server that forbids experiment writes).
    """
    try:
        exp = client.get_experiment(str(experiment_id))
        if exp is None or exp.tags.get(KIND_TAG):
            return
        client.set_experiment_tag(str(experiment_id), KIND_TAG, CLASSIC_ML)
    except Exception as e:  # noqa: BLE001 - cosmetic for the UI; the study goes on
        log.warning("could not set %s on experiment %s (%s): the MLflow UI may open it on "
                    "its GenAI overview", KIND_TAG, experiment_id, e)


#: MLflow 3.17's UI ignores the tag above in favour of a per-browser "workflow type" (the
#: GenAI / Model training switch in its sidebar, stored in the browser as
#: ``mlflow.workflowType``, "genai" until the user flips it); a ``workflowType`` query
#: parameter in the page's address overrides it. Checked in headless Chromium against
#: MLflow 3.17.2: an experiment page opens on the GenAI overview with or without the tag,
#: and on the runs table with this parameter.
WORKFLOW_QUERY = "workflowType=machine_learning"


def experiment_url(tracking_uri: str, experiment_id: str) -> str | None:
    """The MLflow UI address of an experiment's runs for an ``http(s)`` tracking URI (the
    stack's server, a shared one), without any user:password the URI carries; None for a
    local store (file, sqlite), which has no UI until ``mlflow ui`` serves it."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    return f"{base}/#/experiments/{experiment_id}?{WORKFLOW_QUERY}"
