"""Issue 27 item 11: optuna-dashboard serves the Optuna studies scarcelab's search writes.

A tiny study runs on an Optuna RDB storage (sqlite here; the stack's PostgreSQL in use,
``OPTUNA_STORAGE``), then the dashboard's own WSGI app (``optuna_dashboard.wsgi``, what its
``optuna-dashboard <storage>`` command serves) answers on a free loopback port, and its JSON
API is read back against the storage and the study run's tags.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import pytest

optuna_dashboard = pytest.importorskip(
    "optuna_dashboard", reason="optuna-dashboard is pinned in requirements-dev.txt")


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def _get(base: str, path: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(base + path, timeout=30) as r:
        assert r.status == 200
        return json.load(r)


def test_dashboard_lists_a_scarcelab_study_with_its_trials(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.protocols.search import StudyConfig, run_study
    from scarcelab.tracker import InMemoryTracker

    storage = f"sqlite:///{tmp_path}/optuna.db"
    cfg = StudyConfig(method="sup", dataset="synthetic_tiny", arch="small_cnn", device="cpu",
                      max_epochs=1, max_trials=2, budget_minutes=1, batch_size=16,
                      max_steps_per_epoch=1, storage=storage)
    tr = InMemoryTracker()
    run_study(cfg, tr)
    name = tr.study.tags["scarcelab.optuna_study"]

    server = make_server("127.0.0.1", 0, optuna_dashboard.wsgi(storage), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        studies = _get(base, "/api/studies")["study_summaries"]
        (ours,) = [s for s in studies if s["study_name"] == name]
        assert ours["directions"] == ["maximize"]
        detail = _get(base, f"/api/studies/{ours['study_id']}")
        with urllib.request.urlopen(base + "/dashboard", timeout=30) as r:
            assert r.status == 200 and b"<html" in r.read().lower()  # the UI page itself
    finally:
        server.shutdown()
        server.server_close()
    trials = detail["trials"]
    assert len(trials) == int(tr.study.tags["scarcelab.n_trials"]) == 2
    assert {t["state"] for t in trials} == {"Complete"}
    # the dashboard shows what the storage holds (read independently with optuna)
    study = optuna.load_study(study_name=name, storage=storage)
    assert [t["values"] for t in trials] == [[t.value] for t in study.trials]
    assert {p["name"] for t in trials for p in t["params"]} == {"lr", "weight_decay"}
    best = tr.study.history("best/val_balanced_accuracy")[-1][1]
    assert detail["best_trials"][0]["values"][0] == pytest.approx(best)
    assert detail["best_trials"][0]["number"] == int(tr.study.tags["scarcelab.best_trial"])
