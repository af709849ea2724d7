"""``stack``: start/stop the local tracking stack (same as ``scripts/stack``, DESIGN §4.4)."""

from __future__ import annotations

import click

from scarcelab.entrypoints.cli import main


@main.command(name="stack", short_help="Start/stop the local tracking stack.",
              context_settings={"ignore_unknown_options": True,
                                              "allow_extra_args": True})
@click.argument("action", type=click.Choice(["start", "stop", "status", "env",
                                             "restart-server"]), default="start")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def stack(action: str, args: tuple[str, ...]) -> None:
    """Local PostgreSQL + S3 store + MLflow server; options as ``scripts/stack --help``."""
    from scarcelab.tracking.stack import main as stack_main

    # MLflow Projects passes every parameter; "default" (or '') means "not given".
    rest: list[str] = []
    it = iter(args)
    for a in it:
        if a.startswith("--") and "=" not in a and a not in ("--auth", "--no-auth"):
            val = next(it, "")
            if val not in ("", "default"):
                rest += [a, val]
        elif a != "":
            rest.append(a)
    rc = stack_main([action, *rest])
    if rc:
        raise SystemExit(rc)
