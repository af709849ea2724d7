"""The tracking store checked at the start of a command: one line naming the URI (without
its password) and the fix, instead of a traceback from MLflow, SQLAlchemy or the driver
minutes later.

What is checked, by the URI's kind:

* an unknown scheme (``ftp://``): MLflow raised ``UnsupportedModelRegistryStoreURIException``.
* a database URI (``postgresql://``, ``mysql://``, ``mssql://``): its SQLAlchemy dialect and
  driver are importable (``postgresql://`` means psycopg 3 to SQLAlchemy 2.x; a machine with
  only psycopg2 needs ``postgresql+psycopg2://``), and the server accepts a connection
  (a refused or timed-out connection, a wrong password).
* ``sqlite:///PATH``: its folder exists or can be created, is writable and has space left
  (a disk that is full fails MLflow's first write: ``database or disk is full``); a
  read-only command (``leaderboard``) needs the file to exist, and does not create it.
  A new database is created (MLflow's tables and migrations) under an exclusive file lock:
  two studies started together on a file that did not exist both ran MLflow's table
  creation, and one died in it.
* a folder (MLflow's file store): MLflow 3 refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is
  true (then it must exist for a query, or be writable).

Remote ``http(s)://`` servers are checked by
:func:`scarcelab.tracking.mlflow_tracker.check_tracking_server` (which calls this first).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from scarcelab.errors import ScarcelabError

#: Schemes of database URIs MLflow's SQLAlchemy store accepts (the dialect may carry a
#: ``+driver``).
DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
REMOTE = ("http", "https", "databricks", "databricks-uc", "uc")
#: Below this much free space a store's folder counts as full: MLflow's first write (its
#: tables, a run's rows, a checkpoint) would fail part-way with ENOSPC.
MIN_FREE_BYTES = 16 * 2**20
CONNECT_TIMEOUT_S = 5
DEFAULT_FIX = ("set MLFLOW_TRACKING_URI to a store you can use (unset: ./mlflow.db, a "
               "local sqlite store)")


class StoreUnusable(ScarcelabError):
    """The tracking store cannot be used; nothing was started."""


def _redact(uri: str) -> str:
    from scarcelab.protocols.study_store import redact

    return redact(uri)


def scheme_of(uri: str) -> str:
    """``postgresql+psycopg2://…`` -> ``postgresql``; a plain path -> ``""``."""
    if "://" not in uri:
        return "file" if uri.startswith("file:") else ""
    return uri.split("://", 1)[0].split("+", 1)[0].lower()


_CHECKED: set[tuple[str, bool, bool]] = set()


def check_store(uri: str, *, read_only: bool = False, create: bool = False) -> None:
    """Raise :class:`StoreUnusable` (one line) unless the store at ``uri`` can be used.

    Without ``create`` nothing is written (a command checks its store before its data, and
    a refused data file must leave no database behind); with it (the first real use) a new
    sqlite file gets its folder and MLflow's tables under the lock. A store that passed is
    not checked again in this process (a contamination sweep or k folds open a tracker per
    child)."""
    if (uri, read_only, create) in _CHECKED or (uri, False, True) in _CHECKED:
        return
    _check(uri, read_only, create)
    _CHECKED.add((uri, read_only, create))


def open_store(uri: str | None = None) -> None:
    """:func:`check_store` with ``create``, for the tracking URI in effect when not given:
    what a command calls right before its first MLflow client."""
    if uri is None:
        import mlflow

        uri = mlflow.get_tracking_uri()
    check_store(uri, create=True)


def _check(uri: str, read_only: bool, create: bool) -> None:
    scheme = scheme_of(uri)
    shown = _redact(uri)
    if scheme in REMOTE:
        return  # check_tracking_server asks the server itself
    if scheme in ("", "file"):
        _check_folder(uri, shown, read_only)
    elif scheme == "sqlite":
        _check_sqlite(uri, shown, read_only, create)
    elif scheme in DB_SCHEMES:
        _check_database(uri, shown)
    else:
        raise StoreUnusable(
            f"tracking URI {shown}: the scheme {scheme!r} is not a tracking store MLflow "
            "can use; use sqlite:///PATH (a local file), postgresql://USER@HOST/DB, "
            "http(s)://SERVER (an `mlflow server`) or a folder path")


# --------------------------------------------------------------------------- sqlite


def sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` URI; None for an in-memory database."""
    from sqlalchemy.engine import make_url

    db = make_url(uri).database
    return None if not db or db == ":memory:" else Path(db).expanduser()


def _free(path: Path) -> int:
    return shutil.disk_usage(path).free


def _existing_ancestor(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_writable_dir(folder: Path, shown: str, what: str, create: bool) -> None:
    """``folder``, or the nearest folder above it that exists (where it would be created),
    takes a new file and has room; with ``create`` the folder is made."""
    anc = _existing_ancestor(folder)
    if not anc.is_dir():
        raise StoreUnusable(f"tracking URI {shown}: {anc} is a file, so the {what} {folder} "
                            f"cannot be created; {DEFAULT_FIX}")
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
            anc = folder
        with tempfile.NamedTemporaryFile(dir=anc, prefix=".scarcelab-write-check-"):
            pass  # removed on close: the probe leaves nothing
    except OSError as e:
        where = folder if anc == folder else f"{anc} (to create {folder})"
        raise StoreUnusable(f"tracking URI {shown}: cannot write in {where} "
                            f"({e.strerror or e}); {DEFAULT_FIX}") from None
    free = _free(anc)
    if free < MIN_FREE_BYTES:
        raise StoreUnusable(f"tracking URI {shown}: the disk holding {folder} is full "
                            f"({free / 2**20:.1f} MiB free, {os.strerror(errno.ENOSPC)}); "
                            f"free some space there, or {DEFAULT_FIX}")


def _check_sqlite(uri: str, shown: str, read_only: bool, create: bool) -> None:
    try:
        path = sqlite_path(uri)
    except Exception as e:  # noqa: BLE001 - sqlalchemy.exc.ArgumentError on a malformed URI
        raise StoreUnusable(f"tracking URI {shown} is not a valid sqlite URI ({e}); write "
                            "sqlite:///relative/path.db or sqlite:////absolute/path.db"
                            ) from None
    if path is None:
        return
    if path.is_dir():
        raise StoreUnusable(f"tracking URI {shown}: {path} is a folder, not a database file; "
                            f"name a file in it, e.g. sqlite:///{path / 'mlflow.db'}")
    if read_only:
        if not path.is_file():
            raise StoreUnusable(
                f"tracking URI {shown}: there is no tracking database at {path} yet (nothing "
                "has been tracked there); run a study with this tracking URI first, or point "
                "--tracking-uri / MLFLOW_TRACKING_URI at the store that holds your runs")
        _check_sqlite_header(path, shown)
        return
    _check_writable_dir(path.parent, shown, "folder of the sqlite store", create)
    if path.exists():
        if not os.access(path, os.W_OK):
            raise StoreUnusable(f"tracking URI {shown}: {path} is not writable; make it "
                                f"writable, or {DEFAULT_FIX}")
        _check_sqlite_header(path, shown)
    if create:
        ensure_sqlite_schema(uri, path, shown)


def _check_sqlite_header(path: Path, shown: str) -> None:
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as e:
        raise StoreUnusable(f"tracking URI {shown}: cannot read {path} ({e.strerror}); "
                            f"{DEFAULT_FIX}") from None
    if head and head != b"SQLite format 3\x00":
        raise StoreUnusable(f"tracking URI {shown}: {path} is not a SQLite database (it "
                            f"starts with {head[:8]!r}); point the URI at another file")


def ensure_sqlite_schema(uri: str, path: Path, shown: str) -> None:
    """Create (or migrate) MLflow's tables in ``path`` under an exclusive lock on
    ``<path>.lock``, so that processes starting together on a new file do not all run the
    table creation at once (one of them died in it: "table experiments already exists").
    A database whose tables exist is left alone, and no lock is taken for it."""
    if path.is_file() and path.stat().st_size > 0 and _has_mlflow_tables(path):
        return
    import fcntl

    lock = path.with_name(path.name + ".lock")
    try:
        fh = open(lock, "a")  # noqa: SIM115 - held for the block below
    except OSError as e:
        raise StoreUnusable(f"tracking URI {shown}: cannot create the lock file {lock} "
                            f"({e.strerror}); {DEFAULT_FIX}") from None
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            if not (path.is_file() and _has_mlflow_tables(path)):
                _create_tables(uri, shown)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _has_mlflow_tables(path: Path) -> bool:
    """Whether the file already holds MLflow's schema at its current version (read with the
    sqlite3 module: no MLflow import, no write)."""
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            names = {r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")}
            if not {"alembic_version", "experiments", "runs", "registered_models"} <= names:
                return False
            row = con.execute("SELECT version_num FROM alembic_version").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return row is not None and row[0] == _head_revision()


def _head_revision() -> str | None:
    """MLflow's newest schema revision (its alembic head), read from its migration files."""
    try:
        from alembic.config import Config
        from alembic.script import ScriptDirectory
        from mlflow.store.db.utils import _get_alembic_config

        cfg: Config = _get_alembic_config("sqlite://")
        return ScriptDirectory.from_config(cfg).get_current_head()  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - unknown: let MLflow's own check decide
        return None


def _create_tables(uri: str, shown: str) -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    try:
        store = SqlAlchemyStore(uri, tempfile.gettempdir())
    except Exception as e:  # noqa: BLE001 - reported in one line with the URI
        raise StoreUnusable(f"tracking URI {shown}: could not create MLflow's tables "
                            f"({_why(e)}); {DEFAULT_FIX}") from None
    engine: Any = getattr(store, "engine", None)
    if engine is not None:
        engine.dispose()


# --------------------------------------------------------------------------- databases


def _check_database(uri: str, shown: str) -> None:
    from sqlalchemy.engine import make_url

    try:
        url = make_url(uri)
        dialect = url.get_dialect()
    except Exception as e:  # noqa: BLE001 - ArgumentError, NoSuchModuleError
        raise StoreUnusable(f"tracking URI {shown}: SQLAlchemy has no dialect for it ({_why(e)})"
                            f"; {DEFAULT_FIX}") from None
    try:
        dialect.import_dbapi()
    except ImportError as e:
        name = getattr(e, "name", None) or str(e)
        hint = _driver_hint(url.get_backend_name(), url.get_driver_name())
        raise StoreUnusable(f"tracking URI {shown}: its database driver {name!r} is not "
                            f"installed; {hint}") from None
    from sqlalchemy import create_engine

    args = {"connect_timeout": CONNECT_TIMEOUT_S} if url.get_backend_name() in (
        "postgresql", "mysql") else {}
    engine = create_engine(url, connect_args=args, pool_pre_ping=False)
    try:
        with engine.connect():
            pass
    except Exception as e:  # noqa: BLE001 - OperationalError: refused, timeout, auth
        where = f"{url.host or 'localhost'}:{url.port or 'default port'}"
        raise StoreUnusable(f"tracking URI {shown}: the {url.get_backend_name()} server at "
                            f"{where} refuses the connection ({_why(e)}); start it "
                            "(scripts/stack start for the local stack) or fix the host, port, "
                            "user and password in the URI") from None
    finally:
        engine.dispose()


def _driver_hint(backend: str, driver: str) -> str:
    import importlib.util

    if backend == "postgresql":
        if importlib.util.find_spec("psycopg2") is not None and driver != "psycopg2":
            return ("psycopg2 is installed: write postgresql+psycopg2://… , or pip install "
                    "'psycopg[binary]'")
        return "pip install 'psycopg[binary]' (or psycopg2-binary with postgresql+psycopg2://)"
    if backend == "mysql":
        return "pip install pymysql and write mysql+pymysql://…"
    if backend == "mssql":
        return "pip install pyodbc (mssql+pyodbc://…)"
    return f"install the driver of {backend}+{driver}"


def _why(e: BaseException) -> str:
    """The first line of the innermost message, without SQLAlchemy's background link."""
    inner = getattr(e, "orig", None) or e
    text = str(inner).strip().splitlines()[0] if str(inner).strip() else ""
    return f"{type(inner).__name__}: {text[:200]}" if text else type(inner).__name__


# --------------------------------------------------------------------------- folders


def _check_folder(uri: str, shown: str, read_only: bool) -> None:
    path = Path(uri[len("file://"):] if uri.startswith("file://") else
                uri[len("file:"):] if uri.startswith("file:") else uri).expanduser()
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() not in ("true", "1"):
        raise StoreUnusable(
            f"tracking URI {shown} is a folder (MLflow's file store), which MLflow 3 refuses "
            "unless MLFLOW_ALLOW_FILE_STORE=true; use a database file instead, e.g. "
            f"sqlite:///{path / 'mlflow.db'} (`mlflow migrate-filestore` moves runs already "
            "in the folder)")
    if read_only:
        if not path.is_dir():
            raise StoreUnusable(f"tracking URI {shown}: there is no tracking store at {path} "
                                "yet; run a study with this tracking URI first, or point "
                                "--tracking-uri / MLFLOW_TRACKING_URI at your store")
        return
    _check_writable_dir(path, shown, "store folder", create=False)


__all__ = ["StoreUnusable", "check_store", "ensure_sqlite_schema", "open_store", "scheme_of",
           "sqlite_path"]
