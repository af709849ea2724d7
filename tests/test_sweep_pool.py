"""The embedded Ray pool runs cells at the caller's priority, not Ray's worker nice 15."""

from __future__ import annotations

import os

import pytest

ray = pytest.importorskip("ray")


def test_embedded_cells_run_at_the_drivers_niceness(monkeypatch: pytest.MonkeyPatch) -> None:
    from scarcelab.tracking.sweep.pool import RayPool

    def niceness() -> int:  # nested: Ray ships it by value (the test module isn't importable)
        import os

        return os.nice(0)

    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    if ray.is_initialized():
        ray.shutdown()
    pool = RayPool(jobs=1)
    try:
        pool.submit("cell", niceness)
        key, value, err = pool.next_done()
    finally:
        pool.shutdown()
    assert err is None and key == "cell"
    # Ray's own default would be 15 here: the cell would yield to every other job
    assert value == os.nice(0)
