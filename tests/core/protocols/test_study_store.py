"""Shared-storage search bookkeeping on a real Optuna RDB storage (sqlite file)."""

from __future__ import annotations

import os
import time

import optuna
import pytest
from optuna.trial import TrialState
from test_search_protocol import _dead_pid

from scarcelab.methods.space import LogUniform, Uniform, sample
from scarcelab.protocols.study_store import HOST, StudyStore, TrialSeededSampler, redact

SPACE = {"lr": LogUniform(1e-4, 1e-1), "wd": Uniform(0.0, 0.1)}


@pytest.fixture
def url(tmp_path):  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path}/optuna.db"


def _draws(study: optuna.Study, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        t = study.ask()
        out.append(sample(SPACE, t))
        study.tell(t, 0.0)
    return out


def test_configurations_depend_on_trial_number_only(url):
    a = optuna.create_study(sampler=TrialSeededSampler(3))
    b = optuna.create_study(sampler=TrialSeededSampler(3))
    da, db = _draws(a, 4), _draws(b, 4)
    assert da == db  # a resumed process draws what the dead one would have
    assert len({d["lr"] for d in da}) == 4  # and trials differ from each other
    assert _draws(optuna.create_study(sampler=TrialSeededSampler(4)), 1)[0] != da[0]
    # a second process joining the study continues the sequence, it does not restart it
    s1 = StudyStore("s", 3, url)
    _draws(s1.study, 2)
    s2 = StudyStore("s", 3, url)
    assert _draws(s2.study, 2) == da[2:]


def test_orphaned_trials_are_failed_and_not_counted(url, monkeypatch):
    store = StudyStore("s", 0, url)
    done = store.ask()
    store.tell(done, 0.5)
    dead = store.study.ask()
    dead.set_user_attr("owner", f"{HOST}:999999999")  # no such process
    dead.set_user_attr("heartbeat", time.time())
    live = store.study.ask()
    live.set_user_attr("owner", f"{HOST}:{os.getppid()}")
    live.set_user_attr("heartbeat", time.time())
    remote = store.study.ask()
    remote.set_user_attr("owner", "another-host:1")
    remote.set_user_attr("heartbeat", time.time())
    assert store.counts() == {"complete": 1, "failed": 0, "running": 3}
    assert store.fail_orphans() == [dead.number]
    monkeypatch.setattr("scarcelab.protocols.study_store.GRACE_S", -1.0)  # heartbeats stale
    assert sorted(store.fail_orphans()) == [live.number, remote.number]
    trials = store.study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] + [TrialState.FAIL] * 3
    assert all(t.user_attrs.get("crashed") for t in trials[1:])
    assert store.counts() == {"complete": 1, "failed": 0, "running": 0}
    assert store.started_before(10) == 1
    store.close()


def test_heartbeat_and_owner_recorded(url, monkeypatch):
    monkeypatch.setattr("scarcelab.protocols.study_store.HEARTBEAT_S", 0.05)
    store = StudyStore("s", 0, url)
    t = store.ask()
    first = store.study.trials[0].user_attrs["heartbeat"]
    time.sleep(0.5)
    assert store.study.trials[0].user_attrs["heartbeat"] > first
    assert store.study.trials[0].user_attrs["owner"] == f"{HOST}:{os.getpid()}"
    assert store.fail_orphans() == []  # our own trial is never an orphan
    store.tell(t, 1.0)
    assert store.counts()["complete"] == 1


def test_redact_hides_password_only():
    assert redact("postgresql+psycopg2://postgres:s3cr:et@127.0.0.1:5432/optuna") == \
        "postgresql+psycopg2://postgres:***@127.0.0.1:5432/optuna"
    assert redact("sqlite:///x.db") == "sqlite:///x.db"
    assert redact(None) == ""


def test_a_trial_just_asked_by_another_worker_is_not_an_orphan(url, monkeypatch):
    """Between `ask` and setting its owner/heartbeat, another worker's trial has neither:
    its start time counts as its heartbeat, so it is not failed under that worker's feet
    (a race seen in the two-worker e2e test); once really stale, it is."""
    store = StudyStore("s", 0, url)
    other = StudyStore("s", 0, url).study.ask()  # no owner, no heartbeat (yet)
    assert store.fail_orphans() == []
    assert store.study.get_trials()[0].state == TrialState.RUNNING
    monkeypatch.setattr("scarcelab.protocols.study_store.GRACE_S", -1.0)
    assert store.fail_orphans() == [other.number]
    store.close()


def test_concurrent_first_start_of_the_storage_is_retried(url, monkeypatch):
    """Workers opening an empty database together race to create Optuna's schema; the
    losers' unique-constraint errors are retried until the schema is there."""
    import sqlalchemy.exc

    from scarcelab.protocols import study_store as ss

    real = optuna.storages.RDBStorage
    calls = []

    class Flaky(real):  # type: ignore[misc, valid-type]
        def __init__(self, *a, **k) -> None:  # type: ignore[no-untyped-def]
            calls.append(1)
            if len(calls) == 1:
                raise sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("duplicate key"))
            super().__init__(*a, **k)
    monkeypatch.setattr(optuna.storages, "RDBStorage", Flaky)
    monkeypatch.setattr(ss.time, "sleep", lambda s: None)
    store = StudyStore("s", 0, url)
    assert len(calls) == 2 and store.shared
    store.close()


# -- redaction, heartbeats, large seeds (mutation sample, docs/mutation.md) ----------------
def test_redact_hides_a_password_containing_a_newline():
    """When in doubt it hides more: any character may be in the password, a newline too."""
    assert redact("postgresql://postgres:pa\nss@127.0.0.1:5432/optuna") == \
        "postgresql://postgres:***@127.0.0.1:5432/optuna"


def test_time_of_a_dead_trial_without_heartbeat_is_counted(tmp_path):
    """A dead process's trial that recorded its clock but never a heartbeat still counts
    (its owner is dead); a trial with no heartbeat is not an error."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    store = StudyStore("s", 0, url)
    trial = store.study.ask()
    trial.set_user_attr("owner", f"{HOST}:{_dead_pid()}")
    trial.set_user_attr("elapsed_s", 42.5)
    assert store.spent_by_dead_processes() == 42.5
    store.close()


def test_large_study_seeds_draw_valid_configurations():
    """Draws depend only on (seed, trial, parameter) for any seed: a large one must not make
    the per-parameter sub-seed overflow numpy's 32-bit seed range."""
    from scarcelab.methods.space import LogUniform, sample

    space = {"lr": LogUniform(1e-4, 1e-1)}

    def draws(seed: int) -> list[float]:
        study = optuna.create_study(sampler=TrialSeededSampler(seed))
        out = []
        for _ in range(3):
            t = study.ask()
            out.append(sample(space, t)["lr"])
            study.tell(t, 0.0)
        return out

    for seed in (5_000, 7_000, 123_456):  # seed * 1_000_003 is past 2**32
        a = draws(seed)
        assert a == draws(seed) and all(1e-4 <= v <= 1e-1 for v in a)


def test_a_process_killed_inside_ask_leaves_no_running_trial(url, tmp_path):
    """A SIGKILL between Optuna's ``ask`` and the owner being written left an owner-less
    trial RUNNING that a resume started at once did not fail (its start time was within
    the grace period): the e2e kill-and-resume test failed on it in CI. The asker is now
    recorded before ``ask``, so a resume sees that it is dead."""
    import subprocess
    import sys

    code = (
        "import os, optuna.trial\n"
        "from scarcelab.protocols.study_store import StudyStore\n"
        f"s = StudyStore('s', 0, {url!r})\n"
        "optuna.trial.Trial.set_user_attr = lambda *a, **k: os._exit(3)  # dies right there\n"
        "s.ask()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 3, p.stderr
    store = StudyStore("s", 0, url)
    (t,) = store.study.get_trials()
    assert t.state == TrialState.RUNNING and "owner" not in t.user_attrs
    assert store.fail_orphans() == [t.number]  # at once, not after the grace period
    assert store.study.get_trials()[0].state == TrialState.FAIL
    store.close()


def test_an_ownerless_trial_with_a_live_candidate_asker_waits_for_the_grace(url, monkeypatch):
    """When a live process may have asked the owner-less trial, it is not failed early."""
    store = StudyStore("s", 0, url)
    store.study.set_user_attr(f"asking:{HOST}:999999999", time.time() - 1)  # dead asker
    store.study.set_user_attr(f"asking:{HOST}:{os.getppid()}", time.time() - 1)  # live one
    t = store.study.ask()  # no owner (yet)
    assert store.fail_orphans() == []
    store.study.set_user_attr(f"asking:{HOST}:{os.getppid()}", 0.0)  # that one left ask
    assert store.fail_orphans() == [t.number]
    store.close()
