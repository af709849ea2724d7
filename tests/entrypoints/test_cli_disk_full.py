"""A disk that fills while a command runs ends as one line, not a traceback (issue 42
item 12): ENOSPC / EDQUOT from any write, wrapped or not, and sqlite's "database or disk is
full". Other errors keep their traceback."""

from __future__ import annotations

import errno
import sqlite3

import click
import pytest
from click.testing import CliRunner

from scarcelab.entrypoints.cli import main


def _with_command(exc: BaseException) -> click.Command:
    @click.command(name="_raise_for_test")
    def cmd() -> None:
        raise exc

    return cmd


@pytest.fixture
def run_raising():
    added: list[str] = []

    def run(exc: BaseException):
        cmd = _with_command(exc)
        main.add_command(cmd)
        added.append(cmd.name)
        return CliRunner().invoke(main, [cmd.name])

    yield run
    for name in added:
        main._commands.pop(name, None)  # type: ignore[attr-defined]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_is_one_line_naming_the_file(run_raising, code: int) -> None:
    r = run_raising(OSError(code, "No space left on device", "/data/run/best.pt"))
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    assert lines[0].startswith("Error: /data/run/best.pt: ")
    assert "free space" in lines[0]
    assert "Traceback" not in r.output


def test_a_wrapped_full_disk_is_found_under_its_wrapper(run_raising) -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/spool/j.log")
        except OSError as inner:
            raise RuntimeError("could not write the journal") from inner
    except RuntimeError as outer:
        r = run_raising(outer)
    assert r.exit_code == 1
    assert r.output.count("\n") == 1 and "/spool/j.log" in r.output


def test_sqlite_full_is_one_line(run_raising) -> None:
    r = run_raising(sqlite3.OperationalError("database or disk is full"))
    assert r.exit_code == 1
    assert r.output.startswith("Error: the sqlite tracking or Optuna database")
    assert r.output.count("\n") == 1


def test_other_errors_keep_their_traceback(run_raising) -> None:
    r = run_raising(OSError(errno.EACCES, "Permission denied", "/x"))
    assert r.exit_code == 1
    assert isinstance(r.exception, PermissionError)
