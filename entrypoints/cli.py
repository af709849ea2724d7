"""``scarcelab`` command line: mirrors the MLproject entry points (DESIGN §4.1).

``main`` is the click group; every other module of this package adds its commands to it.
"""

from __future__ import annotations

import logging
import sys

import click

from scarcelab.tracking import commands as _commands


def _version() -> str:
    from scarcelab import __version__  # the package's __init__ imports nothing heavy

    return __version__


class _LazyGroup(click.Group):
    """Loads the command modules when the commands are first read, not at import.

    Every command module imports ``main`` from here; loading them when this module was
    imported made ``import scarcelab.entrypoints.study`` on its own a circular import
    (study -> cli -> contamination -> study, partially initialised). Registering a command
    (``add_command``, what ``@main.command`` does) never triggers the load; reading
    ``commands``, ``get_command`` or ``list_commands`` does.
    """

    @property
    def commands(self) -> dict[str, click.Command]:
        if not getattr(self, "_loading", False):
            _load_commands()
        return self._commands

    # click declares ``commands`` a plain attribute; a property with a setter stands in for it
    @commands.setter
    def commands(self, value: dict[str, click.Command]) -> None:  # pyright: ignore[reportIncompatibleVariableOverride]
        self._commands = value

    def invoke(self, ctx: click.Context) -> object:
        """Every command's user errors as one line: a :class:`~scarcelab.errors.
        ScarcelabError` raised outside a command's own ``except`` (a store checked when the
        first tracker is created, a data file read by a helper) ends as ``Error: <message>``,
        exit 1, like the ones a command catches itself, not as a traceback."""
        from scarcelab.errors import ScarcelabError

        try:
            return super().invoke(ctx)
        except ScarcelabError as e:
            raise click.ClickException(str(e)) from None
        except Exception as e:  # noqa: BLE001 - only a full disk is turned into a line
            line = _disk_full_line(e)
            if line is None:
                raise
            raise click.ClickException(line) from None

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        saved, self._loading = getattr(self, "_loading", False), True
        try:
            super().add_command(cmd, name)  # its self.commands[...] write must not load
        finally:
            self._loading = saved


def _disk_full_line(e: BaseException) -> str | None:
    """One line for a disk that filled up while a command ran (issue 42 item 12), or None.

    The start-up check (``tracking/store_check.py``) refuses a store with under 16 MiB free,
    but a disk can fill later, under a checkpoint, a spool record or the sqlite store;
    that used to end in a traceback. Why here: any of those writes can be the one that
    fails, and the fix is the same for all — free space where the file lives. Records
    already written stay: the spool keeps what it could not deliver."""
    import errno
    import os

    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:  # the OSError may sit under a wrapper
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in (errno.ENOSPC, errno.EDQUOT):
            where = cur.filename or "a file"
            return (f"{where}: {os.strerror(cur.errno)} — free space on that disk (or point "
                    f"the store, spool or cache at another one) and run the command again; "
                    f"a study started with a shared store resumes where it stopped")
        if "database or disk is full" in str(cur):  # sqlite's SQLITE_FULL, via SQLAlchemy
            return ("the sqlite tracking or Optuna database: database or disk is full — "
                    "free space on its disk and run the command again; a study resumes "
                    "where it stopped")
        cur = cur.__cause__ or cur.__context__
    return None


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "-V", "--version", prog_name="scarcelab")
@click.option("-v", "--verbose", is_flag=True, help="progress lines also when not on a "
              "terminal, per-epoch lines, INFO logs (also accepted after the command)")
@click.option("-q", "--quiet", is_flag=True, help="no progress output, only summaries")
def main(verbose: bool, quiet: bool) -> None:
    """scarcelab: learning from scarce labels, tuned fairly, tracked in MLflow.

    Every command checks its options before importing torch or MLflow; the same checks
    serve `mlflow run . -e <command> -P name=value`.
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    mlflow_log_level(verbose)
    import os

    from scarcelab.redaction import hide_mlflow_links
    from scarcelab.tracking.lifecycle import die_with_mlflow_run, skip_gc_at_exit

    # MLflow prints "View run … at: <URL>" with the URI's user info (issue 42 item 3)
    hide_mlflow_links(os.environ.get("MLFLOW_TRACKING_URI"))
    die_with_mlflow_run()  # under `mlflow run`: a killed run must not leave us training
    skip_gc_at_exit()  # exit-time garbage collection cost seconds per command


# the sweep and compare layers (tracking/) read the commands through this table rather than
# importing this module: tracking sits below the command line (tests/project/test_layers.py)
_commands.install(lambda: main.commands)


_OURS = "SCARCELAB_MLFLOW_LOGGING_LEVEL_SET"  # marks a level this module chose, not the user


def mlflow_log_level(verbose: bool) -> None:
    """MLflow's INFO lines ("Creating initial MLflow database tables...", "Started
    monitoring system metrics.", "View run … at: …") only with ``-v``: at the normal level
    they broke the progress bar and repeat what the closing summary says.

    MLflow sets its logger's level from ``MLFLOW_LOGGING_LEVEL`` when it is imported
    (``mlflow.utils.logging_utils.get_mlflow_log_level``), which happens after this runs
    (commands import it lazily), so the level goes through that documented variable; a
    value the user set is left alone. Child processes (sweep cells) inherit it and decide
    again from their own flags.
    """
    import os

    if os.environ.get("MLFLOW_LOGGING_LEVEL") and not os.environ.get(_OURS):
        return
    level = "INFO" if verbose else "WARNING"
    os.environ["MLFLOW_LOGGING_LEVEL"] = level
    os.environ[_OURS] = "1"
    if "mlflow" in sys.modules:  # already configured: change the live logger too
        logging.getLogger("mlflow").setLevel(level)


def _load_commands() -> None:
    """Import every module of this package: each adds its commands to ``main``.

    A new entry point is one new file here (plus its MLproject entry); this file is not
    edited.
    """
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    import pkgutil

    import scarcelab.entrypoints as entrypoints

    for info in pkgutil.iter_modules(entrypoints.__path__):
        if info.name not in ("cli", "__main__") and not info.name.startswith("_"):
            importlib.import_module(f"scarcelab.entrypoints.{info.name}")


_loaded = False

if __name__ == "__main__":
    # Run through the imported module so that commands registered on ``entrypoints.cli.main``
    # (not on this ``__main__`` copy of it) are present.
    from scarcelab.entrypoints.cli import main as _main

    sys.exit(_main())
