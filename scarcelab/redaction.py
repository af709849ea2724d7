"""Credentials out of what scarcelab prints, logs and records.

A tracking or storage URI may carry a password (``http://admin:pw@host``,
``postgresql://user:pw@db/optuna``); whatever names such a URI in a message, a tag, a
param or a report names it through :func:`redact`. MLflow's own "View run … at: <URL>"
line (``TrackingServiceClient._log_url``, written to stdout whatever the log level) is
built from the URI's host with its user info, so it is turned off through MLflow's
documented switch when the URI holds a password (:func:`hide_mlflow_links`).
Nothing here imports MLflow.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

#: MLflow's switch for its "View run … at: <URL>" lines (mlflow.environment_variables)
MLFLOW_LINKS_OFF = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


def redact(uri: str | None) -> str:
    """A URI without its password, safe to print or log as a parameter.

    Covers ``user:pw@host``, an empty user (``://:pw@host``), passwords that contain ``@``
    or ``:`` (the user info ends at the *last* ``@`` before the host), and passwords given
    as query parameters (``?password=…``, ``&sslpassword=…``). When in doubt it hides more:
    everything up to that last ``@``."""
    if not uri:
        return ""
    out = re.sub(r"^([A-Za-z][A-Za-z0-9+.\-]*://)([^/?#@:]*):.*@(?=[^@]*$)", r"\1\2:***@",
                 uri, flags=re.S)
    return re.sub(r"(?i)([?&;][a-z_]*(?:password|passwd|pwd|secret|token)[a-z_]*=)[^&;#]*",
                  r"\1***", out)


def has_credentials(uri: str | None) -> bool:
    """Whether ``uri`` carries a password (or a token) that :func:`redact` would hide."""
    if not uri:
        return False
    if redact(uri) != uri:
        return True
    try:
        return bool(urlsplit(uri).password)
    except ValueError:
        return False


def hide_mlflow_links(uri: str | None) -> None:
    """Turn off MLflow's "View run … at: <URL>" lines when ``uri`` holds a password: MLflow
    writes the URL with the user info it was given (issue 42 item 3). MLflow reads the
    switch each time it would print, and child processes inherit it."""
    if has_credentials(uri):
        os.environ[MLFLOW_LINKS_OFF] = "true"
