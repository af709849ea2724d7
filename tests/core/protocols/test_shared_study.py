"""Issue 42 item 6: workers of the same command share one Optuna search.

Two workers of one command (same settings, one shared storage) used to open a study each
(``<key>-<time>-<pid>``): with ``--max-trials 6`` they finished 12 trials numbered 0–5
twice, training the same six configurations. Now the study is named after the command's
settings, so they share its trials, numbering and ``max_trials`` (as Optuna's
``MaxTrialsCallback`` counts a study's trials across workers); a finished study is closed,
so the command run again is a repeat, and ``--study-name new`` asks for a study of one's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from scarcelab.errors import TrialFailed
from scarcelab.protocols.search import StudyConfig, run_study
from scarcelab.tracker import InMemoryTracker

REPO = Path(__file__).resolve().parents[3]

# One worker: a tiny synthetic study (seconds), held after opening its study until the
# other worker has opened its own too, so that neither can finish before the other starts
# (workers started together; without the gate the test would depend on timing).
_WORKER = r"""
import json, os, sys, time
from pathlib import Path
import scarcelab.protocols.search as search_mod
from scarcelab.protocols.search import StudyConfig, run_study
from scarcelab.tracker import InMemoryTracker

url, gate, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
real = search_mod._open_store

def gated(cfg, tracker, key):
    out = real(cfg, tracker, key)
    (gate / str(os.getpid())).touch()
    end = time.time() + 240
    while len(list(gate.iterdir())) < 2 and time.time() < end:
        time.sleep(0.05)
    return out

search_mod._open_store = gated
cfg = StudyConfig(method="sup", dataset="synthetic_tiny", budget_minutes=1.0, max_epochs=2,
                  patience=10, batch_size=16, max_steps_per_epoch=2, max_trials=n,
                  arch="small_cnn", device="cpu", seed=15, storage=url)
t = InMemoryTracker()
res = run_study(cfg, t)
print(json.dumps({"n_trials": res.n_trials, "mine": [tr.tags["scarcelab.trial"]
                                                      for tr in t.trials]}))
"""


def _cfg(**kw):  # type: ignore[no-untyped-def]
    base = dict(method="sup", dataset="synthetic_tiny", budget_minutes=0.5, max_epochs=2,
                patience=10, batch_size=16, max_steps_per_epoch=2, max_trials=2,
                arch="small_cnn", device="cpu", seed=15)
    base.update(kw)
    return StudyConfig(**base)


def test_two_workers_of_one_command_share_one_search_and_its_max_trials(tmp_path):
    """Two processes, same command, one sqlite storage, ``max_trials=4``: one study, four
    finished trials numbered 0–3, four different configurations, split between them."""
    # a generous lock wait: the two workers (and their heartbeats) write one sqlite file
    url = f"sqlite:///{tmp_path / 'optuna.db'}?timeout=120"
    optuna.create_study(study_name="init", storage=url)  # the schema, made once
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("OPTUNA_STORAGE", None)
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, url, str(gate), "4"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=480) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    names = [n for n in optuna.get_all_study_names(url) if n != "init"]
    assert len(names) == 1, f"the workers made {len(names)} studies: {names}"
    trials = optuna.load_study(study_name=names[0], storage=url).trials
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert sorted(t.number for t in done) == [0, 1, 2, 3]
    configs = {json.dumps(t.params, sort_keys=True) for t in done}
    assert len(configs) == 4, "two trials trained the same configuration"
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    reports = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    mine = sorted(int(n) for r in reports for n in r["mine"])
    assert mine == [0, 1, 2, 3]  # each trial trained by one worker only
    # the study's count at each worker's end: the last one to finish sees all four
    assert max(r["n_trials"] for r in reports) == 4


def test_the_command_run_again_after_its_study_finished_repeats_it(tmp_path):
    """A finished study is closed: the same command run later starts ``<key>-r2`` (a repeat,
    as before), and ``fresh_study`` gets a study of its own beside an open one."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    run_study(_cfg(storage=url), InMemoryTracker())
    run_study(_cfg(storage=url), InMemoryTracker())
    names = sorted(optuna.get_all_study_names(url))
    assert len(names) == 2 and names[1] == names[0] + "-r2"
    for n in names:
        study = optuna.load_study(study_name=n, storage=url)
        assert len(study.trials) == 2 and "closed_at" in study.user_attrs
    run_study(_cfg(storage=url, fresh_study=True), InMemoryTracker())
    fresh = set(optuna.get_all_study_names(url)) - set(names)
    assert len(fresh) == 1 and next(iter(fresh)).startswith(names[0] + "-")


def test_a_worker_that_finds_every_trial_taken_ends_with_the_studys_result(tmp_path):
    """A worker that joins a study whose ``max_trials`` other workers already ran trains
    nothing and says so, instead of failing with "no trial completed an epoch"."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    other = optuna.create_study(study_name="taken", storage=url, direction="maximize")
    for v in (0.4, 0.7):
        t = other.ask()
        other.tell(t, v)
    tracker = InMemoryTracker()
    res = run_study(_cfg(storage=url, study_name="taken"), tracker)
    assert (res.n_trials, res.best_trial, res.best_val) == (2, 1, 0.7)
    assert res.best_checkpoint is None and not tracker.trials
    assert tracker.study.status == "FINISHED"
    assert "taken by other workers" in tracker.study.tags["scarcelab.no_trial_left"]
    assert len(other.trials) == 2


def test_a_worker_alone_that_trains_nothing_still_fails(tmp_path):
    """The joined-late result needs trials of other workers: a study with none is still
    the error it was."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    with pytest.raises(TrialFailed):
        run_study(_cfg(storage=url, budget_minutes=1e-4), InMemoryTracker())


def test_study_name_option_maps_to_the_config():
    from scarcelab.entrypoints.study import _study_identity

    assert _study_identity("auto") == {}
    assert _study_identity("new") == {"fresh_study": True}
    assert _study_identity("grid-a") == {"study_name": "grid-a"}


def test_a_worker_without_time_for_a_trial_is_not_taken_for_one_that_joined_late(tmp_path):
    """Without ``max_trials`` no slot can be taken by others: a worker whose budget ended
    before its first trial fails as before, though the study has other workers' trials."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    other = optuna.create_study(study_name="busy", storage=url, direction="maximize")
    t = other.ask()
    other.tell(t, 0.5)
    with pytest.raises(TrialFailed, match="no trial"):
        run_study(_cfg(storage=url, study_name="busy", max_trials=0, budget_minutes=1e-4),
                  InMemoryTracker())
