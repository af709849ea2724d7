"""Every param a study logs is classified for the leaderboard (issue 44 item 2): part of the
row key since the start, added later with the value older studies ran with
(``ADDED_SETTINGS``), or not a setting (``NOT_SETTINGS``). An unclassified new option
would split an older study and a newer one of the same configuration onto two rows, as
``probe_solver``, ``eval_every_steps``, ``schedule_horizon`` and the own-image options did
until this test, and ``--diag-samples 0`` vs ``512`` did (issue 44's example)."""

from __future__ import annotations

import click
import mlflow
import pandas as pd
import pytest
from click.testing import CliRunner

from scarcelab.tracking.query.frame import (
    ADDED_SETTINGS,
    NOT_SETTINGS,
    SETTINGS_BEFORE_ADDED,
    study_settings,
)

TINY = ["--dataset", "synthetic_tiny", "--arch", "small_cnn", "--device", "cpu",
        "--max-epochs", "2", "--batch-size", "8", "--max-steps-per-epoch", "2",
        "--max-trials", "1", "--budget-minutes", "1", "--budget-clock", "cpu", "-q"]
STUDIES = {"supervised": ["--method", "sup"],
           "semi": ["--method", "fixmatch", "--unlabeled-batch-size", "16"],
           "self": ["--method", "simclr"]}


def _study(cmd: str, *extra: str) -> pd.DataFrame:
    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, [cmd, *STUDIES[cmd], *TINY, *extra])
    assert r.exit_code == 0, r.output
    runs = mlflow.search_runs(search_all_experiments=True)
    return runs[runs["tags.scarcelab.role"] == "study"]


def test_every_param_a_study_logs_is_classified(store) -> None:  # type: ignore[no-untyped-def]
    for cmd in STUDIES:
        studies = _study(cmd)
    names = {c[len("params."):] for c in studies.columns  # the studies' own params
             if c.startswith("params.") and studies[c].notna().any()}
    names = {n for n in names if not n.startswith(("resolved.", "hparams.", "override."))}
    assert len(studies) == 3 and {"method", "precision", "seed"} <= names
    unclassified = names - SETTINGS_BEFORE_ADDED - set(ADDED_SETTINGS) - NOT_SETTINGS
    assert not unclassified, (
        f"params no leaderboard rule classifies: {sorted(unclassified)}; add each to "
        "ADDED_SETTINGS (with the value studies logged before it ran with) or NOT_SETTINGS "
        "(tracking/query/frame.py)")
    assert not set(ADDED_SETTINGS) & SETTINGS_BEFORE_ADDED
    assert not NOT_SETTINGS & set(ADDED_SETTINGS)


def test_an_older_study_and_a_newer_one_of_the_same_configuration_are_one_row() -> None:
    base = {"params.method": "sup", "params.dataset": "breastmnist", "params.seed": "0",
            "params.budget_minutes": "3", "params.n_labeled": "100"}
    old = dict(base, run_id="old")  # logged before the added settings existed
    new = dict(base, run_id="new", **{f"params.{k}": v for k, v in ADDED_SETTINGS.items()},
               **{"params.diag_samples": "0"})
    other = dict(new, run_id="bf16", **{"params.precision": "bf16"})
    s = study_settings(pd.DataFrame([old, new, other]))
    assert s.loc["old"].equals(s.loc["new"])
    assert not s.loc["new"].equals(s.loc["bf16"])
    budget = dict(new, run_id="budget", **{"params.schedule_horizon": "budget"})
    s = study_settings(pd.DataFrame([old, budget]))
    assert not s.loc["old"].equals(s.loc["budget"])  # planned differently: another row


def test_diag_samples_does_not_change_what_a_study_trains(store) -> None:  # type: ignore[no-untyped-def]
    """Why ``diag_samples`` is not a setting: the diagnostics read a scratch copy of the
    model outside the budget, so the trials' losses are the same for 0 and 512 samples."""
    losses = {}
    for samples in ("0", "512"):
        _study("semi", "--diag-samples", samples, "--seed", "3", "--max-trials", "2",
               "--experiment", f"diag-{samples}")
        trials = mlflow.search_runs(experiment_names=[f"diag-{samples}"],
                                    filter_string="tags.`scarcelab.role` = 'trial'",
                                    order_by=["start_time ASC"])
        got = trials[["metrics.train/loss", "metrics.train/loss_labeled",
                      "metrics.val/balanced_accuracy"]]
        assert len(got) == 2 and got.notna().all().all()
        losses[samples] = got.round(7).to_numpy().tolist()
    assert losses["0"] == losses["512"]


def test_the_query_layers_table_is_what_the_options_declare() -> None:
    """One declaration per option (issue 44 item 2): whether a study option keys a row and
    what older studies ran with are declared with the option (``option(..., row=,
    before=)``); tracking/query/declared.py, which the query layer reads without importing
    the command line, must be what those declarations render to."""
    from scarcelab.entrypoints import _declared

    committed = _declared.TARGET.read_text()
    assert committed == _declared.render(), (
        "tracking/query/declared.py is not what the options declare: run "
        "python -m scarcelab.entrypoints._declared --write")
    not_row, before = _declared.declared()
    assert not_row <= NOT_SETTINGS and ADDED_SETTINGS == before
    assert {"seed", "diag_samples", "set"} <= not_row and before["precision"] == "fp32"


def test_every_study_option_is_declared_once_with_its_group() -> None:
    """No study option is a plain ``click.option`` (it would have no group, row or before),
    and one name means one thing on every study command."""
    from scarcelab.entrypoints._declared import STUDY_COMMANDS
    from scarcelab.entrypoints.cli import main
    from scarcelab.entrypoints.options import GROUPS, declaration

    for name in STUDY_COMMANDS:
        for p in main.commands[name].params:  # type: ignore[attr-defined]
            d = declaration(p)
            assert d is not None and d.group in GROUPS, (name, p.name)


def test_a_changed_declaration_fails_until_the_table_is_written(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.entrypoints import _declared
    from scarcelab.entrypoints.cli import main
    from scarcelab.entrypoints.options import declaration

    p = next(p for p in main.commands["semi"].params  # type: ignore[attr-defined]
             if p.name == "probe_solver")
    d = declaration(p)
    assert d is not None
    monkeypatch.setattr(p, "declaration", type(d)(d.group, row=False))
    with pytest.raises(click.ClickException, match="declared"):
        _declared.declared()  # semi now says another thing than supervised
    for cmd in _declared.STUDY_COMMANDS:
        q = next(q for q in main.commands[cmd].params  # type: ignore[attr-defined]
                 if q.name == "probe_solver")
        monkeypatch.setattr(q, "declaration", type(d)(d.group, row=False))
    assert _declared.render() != _declared.TARGET.read_text()
    assert "probe_solver" in _declared.declared()[0]


def test_mlproject_study_entry_points_are_generated_from_the_declarations(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """MLproject's study entry points are what the commands' declarations render
    (entrypoints/_declared.py::render_project), and an option added to a study command
    reaches its entry point by `--write` alone: one declaration, no hand-written
    parameter (issue 44 item 2)."""
    import yaml

    from scarcelab.entrypoints import _declared
    from scarcelab.entrypoints.cli import main
    from scarcelab.entrypoints.options import WHAT, option

    text = _declared.PROJECT.read_text()
    assert text == _declared.render_project(text), (
        "MLproject's study entry points are not what the options declare: run "
        "python -m scarcelab.entrypoints._declared --write")
    eps = yaml.safe_load(text)["entry_points"]
    assert {"supervised", "semi", "self", "contamination"} <= set(eps)
    assert eps["semi"]["parameters"]["method"]["default"] == "fixmatch"
    # a new declared option of semi: the rendered entry point has it, the others do not
    fn = option("--new-knob", group=WHAT, default="7", help="x")(lambda **kw: None)
    new = fn.__click_params__[-1]
    monkeypatch.setattr(main.commands["semi"], "params",  # type: ignore[attr-defined]
                        [*main.commands["semi"].params, new])  # type: ignore[attr-defined]
    got = yaml.safe_load(_declared.render_project(text))["entry_points"]
    assert got["semi"]["parameters"]["new_knob"] == {"type": "string", "default": "7"}
    assert "--new-knob {new_knob}" in got["semi"]["command"]
    assert "new_knob" not in got["self"]["parameters"]
    # the other entry points merge the precision block the first one anchors
    assert got["al"]["parameters"]["precision"] == eps["supervised"]["parameters"]["precision"]
    # an option the command requires needs its MLproject default declared
    monkeypatch.setattr(_declared, "PROJECT_DEFAULTS", {})
    with pytest.raises(click.ClickException, match="PROJECT_DEFAULTS"):
        _declared.render_project(text)
