"""``--help`` as a newcomer reads it (issue 43 §3): every option of every command says
what it does, the study commands group their ~40 options by what a user decides with
them, and ``--run-name`` says which run it names on each command."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

STUDY_COMMANDS = ("supervised", "semi", "self")


def _commands() -> list[tuple[str, click.Command]]:
    from scarcelab.entrypoints.cli import main

    out = []

    def walk(cmd: click.Command, path: str) -> None:
        out.append((path, cmd))
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, f"{path} {name}")

    walk(main, "scarcelab")
    return out


def _help_text(cmd: click.Command, name: str, p: click.Parameter) -> str:
    """What --help prints for ``p``, less click's own ``[default: …]`` / ``[required]``."""
    rec = p.get_help_record(click.Context(cmd, info_name=name))
    assert rec is not None
    return re.sub(r"\s*\[(default: [^\]]*|required)\]", "", rec[1]).strip()


def test_every_option_of_every_command_has_help() -> None:
    missing = []
    for path, cmd in _commands():
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                if len(_help_text(cmd, path.split()[-1], p).split()) < 2:
                    missing.append(f"{path} {'/'.join(p.opts)}")
    assert len(_commands()) >= 15
    assert not missing, "options without help: " + ", ".join(missing)


def test_run_name_says_which_run_it_names() -> None:
    texts = {}
    for path, cmd in _commands():
        for p in cmd.params:
            if "--run-name" in getattr(p, "opts", ()):
                texts[path.split()[-1]] = _help_text(cmd, path.split()[-1], p)
    assert {"al", "leaderboard", "sweep", "semi", "supervised", "self"} <= set(texts)
    for name in ("al", "leaderboard", "sweep", "compare"):
        assert "study run" not in texts[name], (name, texts[name])
    assert "report run" in texts["leaderboard"] and "AL" in texts["al"]
    assert "sweep" in texts["sweep"]
    assert "study run" in texts["semi"]


@pytest.mark.parametrize("command", [*STUDY_COMMANDS, "contamination"])
def test_study_help_groups_the_options(command: str) -> None:
    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, [command, "--help"], terminal_width=100)
    assert r.exit_code == 0, r.output
    heads = [ln[:-1] for ln in r.output.splitlines() if ln.endswith(":") and
             not ln.startswith(" ")]
    assert heads[:2] == ["What to run", "Time budget and search"], heads
    assert {"Batches and device", "MLflow run", "Output"} <= set(heads)
    assert any(h.startswith("Your own images") for h in heads)
    assert "Options" not in heads and "Other options" not in heads  # every option placed
    budget = r.output.split("Time budget and search:")[1].split("\n\n")[0]
    assert "--budget-minutes" in budget and "--max-trials" in budget
    assert "--device" in r.output.split("Batches and device:")[1].split("\n\n")[0]
