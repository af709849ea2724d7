"""A tracking store that cannot be used is one line naming the URI (password hidden) and the
fix, before anything starts (issue 42, item 12): an unsupported scheme, an unwritable or
impossible sqlite path, a full disk, a missing database driver, a database server refusing
connections, ``leaderboard`` on a path with no database yet (not created by the query), and
two studies started together on a sqlite file that does not exist yet (both succeed)."""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from scarcelab.errors import ScarcelabError


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No store checked yet, and MLflow's process-wide tracking URI (which ``leaderboard``
    and these tests set) put back afterwards: an ``ftp://`` URI left behind broke later
    tests that name their store only in the environment."""
    from mlflow.tracking._tracking_service import utils

    from scarcelab.tracking import store_check

    monkeypatch.setattr(store_check, "_CHECKED", set())
    monkeypatch.setattr(utils, "_tracking_uri", utils._tracking_uri)
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "WARNING")


def _refused(uri: str) -> str:
    from scarcelab.tracking.mlflow_tracker import check_tracking_server

    with pytest.raises(ScarcelabError) as e:
        check_tracking_server(uri)
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert "secretpw" not in msg, msg
    return msg


def test_an_unsupported_scheme(tmp_path: Path) -> None:
    msg = _refused("ftp://user:secretpw@example.com/x")
    assert msg.startswith("tracking URI ftp://user:***@example.com/x: the scheme 'ftp' is not")
    assert "sqlite:///PATH" in msg


def test_a_sqlite_path_under_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    msg = _refused(f"sqlite:///{f}/sub/m.db")
    assert f"{f} is a file, so the folder of the sqlite store {f}/sub cannot be created" in msg
    assert "MLFLOW_TRACKING_URI" in msg


def test_an_unwritable_sqlite_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root writes anywhere: the write probe is made to fail as it does for a user on a
    read-only folder (EACCES)."""
    import tempfile

    def denied(*_: Any, **__: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", denied)
    msg = _refused(f"sqlite:///{tmp_path}/ro/m.db")
    assert f"cannot write in {tmp_path} (to create {tmp_path}/ro) (Permission denied)" in msg
    assert not (tmp_path / "ro").exists()


def test_the_check_before_the_data_writes_nothing(tmp_path: Path) -> None:
    """A command checks its store before it reads its data; a data file refused after that
    must leave no database (or folder) behind. The first real use creates them."""
    from scarcelab.tracking.mlflow_tracker import check_tracking_server
    from scarcelab.tracking.store_check import open_store

    uri = f"sqlite:///{tmp_path}/sub/m.db"
    check_tracking_server(uri)
    assert list(tmp_path.iterdir()) == []
    open_store(uri)
    assert (tmp_path / "sub" / "m.db").read_bytes()[:16] == b"SQLite format 3\x00"


def test_a_full_disk_is_refused_before_the_first_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scarcelab.tracking import store_check

    monkeypatch.setattr(store_check, "_free", lambda path: 512 * 1024)
    msg = _refused(f"sqlite:///{tmp_path}/m.db")
    assert f"the disk holding {tmp_path} is full (0.5 MiB free, No space left on device)" in msg
    assert not (tmp_path / "m.db").exists()


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    (tmp_path / "m.db").write_bytes(b"<html>not sqlite</html>")
    msg = _refused(f"sqlite:///{tmp_path}/m.db")
    assert "is not a SQLite database" in msg


@pytest.mark.skipif(importlib.util.find_spec("MySQLdb") is not None,
                    reason="the MySQL driver is installed here")
def test_a_missing_database_driver() -> None:
    msg = _refused("mysql://u:secretpw@127.0.0.1:1/db")
    assert msg == ("tracking URI mysql://u:***@127.0.0.1:1/db: its database driver 'MySQLdb' "
                   "is not installed; pip install pymysql and write mysql+pymysql://…")


@pytest.mark.skipif(importlib.util.find_spec("psycopg") is not None,
                    reason="psycopg 3 is installed here")
def test_postgresql_without_psycopg3_names_the_driver_to_use() -> None:
    msg = _refused("postgresql://u:secretpw@127.0.0.1:1/db")
    assert "its database driver 'psycopg' is not installed" in msg
    if importlib.util.find_spec("psycopg2") is not None:
        assert "write postgresql+psycopg2://" in msg


@pytest.mark.skipif(importlib.util.find_spec("psycopg2") is None, reason="needs psycopg2")
def test_postgresql_refusing_connections() -> None:
    msg = _refused("postgresql+psycopg2://u:secretpw@127.0.0.1:1/db")
    assert msg.startswith("tracking URI postgresql+psycopg2://u:***@127.0.0.1:1/db: the "
                          "postgresql server at 127.0.0.1:1 refuses the connection")
    assert "Connection refused" in msg and "scripts/stack start" in msg


def test_leaderboard_on_a_path_with_no_database_is_one_line_and_creates_nothing(
        tmp_path: Path) -> None:
    from scarcelab.entrypoints.cli import main

    db = tmp_path / "none" / "m.db"
    r = CliRunner().invoke(main, ["leaderboard", "--experiment", "x", "--tracking-uri",
                                  f"sqlite:///{db}"])
    assert r.exit_code == 1, r.output
    assert r.output.strip() == (
        f"Error: tracking URI sqlite:///{db}: there is no tracking database at {db} yet "
        "(nothing has been tracked there); run a study with this tracking URI first, or "
        "point --tracking-uri / MLFLOW_TRACKING_URI at the store that holds your runs")
    assert not db.exists() and not db.parent.exists()


def test_a_study_on_an_unsupported_store_is_one_line_from_the_cli(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    from scarcelab.entrypoints.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "ftp://example.com/x")
    mlflow.set_tracking_uri("ftp://example.com/x")  # over what an earlier test set
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["supervised", "--method", "sup", "--dataset",
                                  "synthetic_tiny", "--arch", "small_cnn", "--device", "cpu",
                                  "--max-trials", "1", "--max-epochs", "1"])
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "Error: tracking URI ftp://example.com/x: the scheme 'ftp'"), r.output


def _open_store(uri: str, barrier: Any, q: Any) -> None:
    os.environ["MLFLOW_LOGGING_LEVEL"] = "WARNING"
    try:
        from scarcelab.tracking.mlflow_tracker import MlflowTracker, check_tracking_server

        barrier.wait(60)
        check_tracking_server(uri)  # what a study command does first, then its tracker
        MlflowTracker(tracking_uri=uri).client.search_experiments()
        q.put("ok")
    except BaseException as e:  # noqa: BLE001 - reported to the test
        q.put(f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")


def test_studies_started_together_on_a_new_sqlite_file_all_succeed(tmp_path: Path) -> None:
    """Three processes open a store whose file does not exist yet at the same moment.
    Before: MLflow's table creation ran in each; the others died in it ("table
    _alembic_tmp_experiments already exists", "Online migration expected to match one
    row", seen in 3 of 3 tries with 3 processes). Now the first creates the tables under a
    file lock, and the others find them."""
    ctx = mp.get_context("spawn")
    uri = f"sqlite:///{tmp_path}/new.db"
    barrier, q = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_open_store, args=(uri, barrier, q)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    results = [q.get(timeout=10) for _ in procs]
    assert results == ["ok"] * 3, results


def test_a_folder_store_says_what_mlflow_3_wants(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: MlflowException("The filesystem tracking backend … is in maintenance mode")
    as a traceback at the first client."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    msg = _refused(str(tmp_path))
    assert msg.startswith(f"tracking URI {tmp_path} is a folder (MLflow's file store)")
    assert f"sqlite:///{tmp_path}/mlflow.db" in msg
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from scarcelab.tracking.mlflow_tracker import check_tracking_server

    check_tracking_server(str(tmp_path))  # the user's explicit choice: accepted
