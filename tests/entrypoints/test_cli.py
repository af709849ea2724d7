"""The command line as users meet it: bad values refused in one line before anything heavy
runs (one validation layer for ``scarcelab …`` and ``mlflow run -P``), help texts, version,
and the same parameters logged whichever way a study was started (issues 13 §6–7, 16)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
TINY = ["--dataset", "synthetic_tiny", "--arch", "small_cnn", "--device", "cpu",
        "--max-epochs", "1", "--batch-size", "16", "--max-steps-per-epoch", "2",
        "--max-trials", "1", "--budget-minutes", "2"]


def _invoke(args: list[str]):  # type: ignore[no-untyped-def]
    from scarcelab.entrypoints.cli import main

    return CliRunner().invoke(main, args)


def _use_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A private sqlite store, also as MLflow's process-global URI (other test modules set
    theirs), with artifacts under ``tmp_path``."""
    import mlflow

    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(uri)
    return uri


def _error_line(output: str) -> str:
    errors = [ln for ln in output.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1, output
    assert "Traceback" not in output, output
    return errors[0]


# -- item 6: numbers and names, refused while parsing ---------------------------------------
STUDY_BAD = [
    (["--max-epochs", "0"], "--max-epochs"),  # was silently 200
    (["--patience", "0"], "--patience"),  # was silently 20
    (["--budget-minutes", "nan"], "--budget-minutes"),  # was accepted
    (["--budget-minutes", "abc"], "--budget-minutes"),  # was a traceback
    (["--budget-minutes", "-1"], "--budget-minutes"),
    (["--max-epochs", "inf"], "--max-epochs"),  # was a traceback
    (["--max-epochs", "2.5"], "--max-epochs"),
    (["--device", "nosuch"], "--device"),  # was a traceback
    (["--seed", "-1"], "--seed"),  # was a traceback
    (["--n-val", "0"], "--n-val"),  # was accepted, then every trial failed
    (["--n-val", "all"], "--n-val"),
    (["--n-labeled", "-3"], "--n-labeled"),
    (["--batch-size", "0"], "--batch-size"),
    (["--max-trials", "-1"], "--max-trials"),
    (["--allow-large-val", "maybe"], "--allow-large-val"),
    (["--search", "grid"], "--search"),
    (["--set", "oops"], "--set"),
    (["--data-dir", "MISSING"], "--data-dir"),  # the old downloader created it
]


def _missing(args: list[str], tmp_path: Path) -> list[str]:
    """``MISSING``: a folder that certainly does not exist."""
    return [str(tmp_path / "no" / "such" / "folder") if a == "MISSING" else a for a in args]


@pytest.mark.parametrize(("args", "option"), STUDY_BAD)
def test_study_bad_values_are_one_line_errors_naming_the_option(args, option, tmp_path,
                                                                monkeypatch) -> None:  # type: ignore[no-untyped-def]
    db = tmp_path / "m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    r = _invoke(["semi", "--method", "fixmatch", *_missing(args, tmp_path)])
    assert r.exit_code == 2, r.output
    assert f"'{option}'" in _error_line(r.output)
    assert not db.exists()  # refused before any tracking store was touched
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(("args", "option", "words"), [
    (["--set", "lambda_u=abc"], "--set", "lambda_u"),  # was a traceback in every trial
    (["--set", "threshold=inf"], "--set", "threshold"),
    (["--set", "nosuch=1"], "--set", "unknown hyperparameter"),
    (["--n-labeled", "all"], "--n-labeled", "no unlabeled data"),
])
def test_study_values_checked_against_the_method(args, option, words, tmp_path,
                                                  monkeypatch) -> None:  # type: ignore[no-untyped-def]
    db = tmp_path / "m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    r = _invoke(["semi", "--method", "fixmatch", *TINY, *args])
    assert r.exit_code == 2, r.output
    line = _error_line(r.output)
    assert f"'{option}'" in line and words in line
    assert not db.exists()


def test_cuda_on_a_cpu_only_machine_is_a_parameter_error(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    for cmd in (["semi", "--method", "fixmatch"], ["al", "--strategy", "margin"]):
        r = _invoke([*cmd, "--device", "cuda"])
        assert r.exit_code == 2 and "'--device'" in _error_line(r.output), r.output
        assert "CUDA is not available" in r.output


AL_BAD = [
    (["--budget", "-5"], "--budget"),  # was accepted
    (["--query-size", "0"], "--query-size"),  # was silently 1
    (["--repetitions", "0"], "--repetitions"),
    (["--seed-data", "-1"], "--seed-data"),
    (["--max-candidates", "0"], "--max-candidates"),
    (["--data-dir", "MISSING"], "--data-dir"),  # silently read the shared data
    (["--set", "hidden=abc"], "--set"),  # was a traceback
    (["--set", "lr=abc"], "--set"),
    (["--set", "fitting=sideways"], "--set"),
    (["--set", "val_fraction=0"], "--set"),
    (["--set", "nosuch=1"], "--set"),
    (["--early-stop-on", "train"], "--early-stop-on"),
    (["--set", "stop_on=test"], "--set"),  # the leak only through its named flag
    (["--set", "stop_on=train"], "--set"),
]


@pytest.mark.parametrize(("args", "option"), AL_BAD)
def test_al_bad_values_are_one_line_errors(args, option, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    db = tmp_path / "m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    r = _invoke(["al", "--strategy", "margin", "--dataset", "honeypot",
                 *_missing(args, tmp_path)])
    assert r.exit_code == 2, r.output
    assert f"'{option}'" in _error_line(r.output)
    assert not db.exists()


@pytest.mark.parametrize(("args", "option"), [
    (["--ratios", "0,1.5"], "--ratios"), (["--ratios", "abc"], "--ratios"),
    (["--ratios", "0,nan"], "--ratios"), (["--diag-samples", "-1"], "--diag-samples"),
])
def test_contamination_bad_values(args, option, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    r = _invoke(["contamination", "--method", "fixmatch", *args])
    assert r.exit_code == 2 and f"'{option}'" in _error_line(r.output), r.output


def test_typo_is_reported_before_torch_and_mlflow_are_imported() -> None:
    """A real process: the error comes from click's parser, and at that point neither torch
    nor MLflow (nor numpy) has been imported — the ~10 s a typo used to cost."""
    code = ("import json, sys\nfrom scarcelab.entrypoints.cli import main\n"
            "try:\n    main(['semi', '--method', 'fixmatch', '--budget-minutes', 'abc'])\n"
            "except SystemExit as e:\n"
            "    print(json.dumps({'rc': e.code, 'heavy': sorted(m for m in ('torch', "
            "'mlflow', 'numpy', 'optuna') if m in sys.modules)}))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res == {"rc": 2, "heavy": []}, out.stderr
    assert "Invalid value for '--budget-minutes'" in out.stderr


def test_console_script_prints_one_error_line() -> None:
    script = Path(sys.executable).parent / "scarcelab"
    if not script.exists():
        pytest.skip("the scarcelab console script is not installed in this environment")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([str(script), "semi", "--method", "fixmatch", "--budget-minutes",
                          "abc"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "Error: Invalid value for '--budget-minutes': 'abc': not a number")


def test_version_and_help_are_complete() -> None:
    from scarcelab import __version__

    r = _invoke(["--version"])
    assert r.exit_code == 0 and __version__ in r.output
    r = _invoke(["--help"])
    assert r.exit_code == 0
    commands = r.output.split("Commands:", 1)[1].strip().splitlines()
    assert len(commands) >= 9
    for line in commands:  # click cut "Run a budgeted semi study (e.g." before
        assert not line.rstrip().endswith(("...", "(e.g.")), line
        assert line.rstrip().endswith("."), line
    assert "-q, --quiet" in r.output and "-V, --version" in r.output


# -- MLproject and the CLI are one set of parameters ---------------------------------------

def _mlproject(entry: str) -> dict:  # type: ignore[type-arg]
    """The entry point as MLflow Projects reads it (its own parser, not a second one)."""
    from mlflow.projects import _project_spec

    ep = _project_spec.load_project(str(REPO)).get_entry_point(entry)
    return {"parameters": {k: {"default": p.default} for k, p in ep.parameters.items()},
            "command": ep.command}


def _entry_points() -> list[str]:
    """Every entry point MLproject declares, read from the file (a new one is checked without
    being named here)."""
    import yaml

    return sorted(yaml.safe_load((REPO / "MLproject").read_text())["entry_points"])


#: CLI options no entry point passes, by entry point ("*": all), and why
CLI_ONLY = {
    "*": {"--experiment": "`mlflow run --experiment-name` chooses it",
          "--run-name": "`mlflow run --run-name` chooses it",
          "-q": "terminal output only", "-v": "terminal output only"},
    **{family: {"--diag-samples": "the per-epoch diagnostics' sample count, a debugging "
                "knob the family entry points have never exposed (contamination does)"}
       for family in ("supervised", "semi", "self")},
    "leaderboard": {"--format": "terminal rendering", "--columns": "terminal rendering",
                    "--view": "the query views; the entry point logs the leaderboard",
                    "--include-failed": "terminal use",
                    "--log": "the entry point always logs", "--tracking-uri": "mlflow run "
                    "sets MLFLOW_TRACKING_URI"},
    "sweep": {"--full": "MLproject passes --full-scale true|false (it cannot omit a flag)",
              "--smoke": "MLproject passes --smoke-scale true|false",
              "--claims": "MLproject passes --claims-scale true|false",
              "--dry-run": "terminal use", "--jobs": "the pool size of a local run",
              "--max-cells": "a debugging cap",
              "--only": "repeatable (a slice of a design, run by hand in a session); "
                        "MLproject would pass one fixed filter"},
    "results": {"--full": "MLproject passes --scale", "--smoke": "MLproject passes --scale",
                "--claims": "MLproject passes --scale",
                "--index": "MLproject passes --write-index true|false",
                "--suites": "the page's suite list; the entry point renders one --spec",
                "--tracking-uri": "mlflow run sets MLFLOW_TRACKING_URI",
                "specs": "positional specs; the entry point passes --spec"},
    "stack": {"args": "the pass-through to scripts/stack, whose own flags MLproject passes"},
    "compare": {"--report-only": "MLproject passes --report-only-value true|false",
                "--option": "repeatable; MLproject passes the same as one --options string",
                "--dry-run": "terminal use", "--write-grid": "terminal use (writes a file "
                "and stops)", "--jobs": "the pool size of a local run",
                "--log": "the entry point always logs"},
}
#: MLproject defaults that differ from the CLI's on purpose, and why (each still differs:
#: a stale entry fails)
DEFAULT_DIFFERS = {
    ("tune", "method"): "`mlflow run . -e tune` runs the CE baseline; the CLI asks for "
                        "--method (or --resume)",
    ("sweep", "full"): "'false' (MLproject) and '' (the CLI's 'not given') both mean no",
    ("sweep", "smoke"): "as full",
    ("sweep", "claims"): "as full",
}


def _cli_param(cmd, command: str, key: str):  # type: ignore[no-untyped-def]
    """The CLI parameter an MLproject parameter reaches: the option whose flag precedes
    ``{key}`` in the command, else the positional argument of that name."""
    import re

    import click

    m = re.search(r"(--[\w-]+) \{" + key + r"\}", command)
    if m:
        return m.group(1), next((p for p in cmd.params if m.group(1) in p.opts), None)
    assert f"{{{key}}}" in command, f"{key} is declared but never passed"
    return key, next((p for p in cmd.params if isinstance(p, click.Argument)
                      and p.name == key), None)


@pytest.mark.parametrize("entry", _entry_points())
def test_every_mlproject_entry_point_matches_its_cli_command(entry: str) -> None:
    """MLproject and the CLI are one set of parameters: each entry point runs the command of
    its name, passes each parameter to an option (or argument) of it, with the same default
    where the CLI has one, and leaves out no CLI option but the listed ones."""
    import click
    from mlflow.projects import _project_spec

    from scarcelab.entrypoints.cli import main

    ep = _project_spec.load_project(str(REPO)).get_entry_point(entry)
    assert ep.command.startswith(f"python -m scarcelab.entrypoints.cli {entry} "), ep.command
    cmd = main.commands[entry]
    passed: set[str] = set()
    for key, p in ep.parameters.items():
        flag, par = _cli_param(cmd, ep.command, key)
        if par is None and cmd.params and any(q.nargs == -1 for q in cmd.params
                                              if isinstance(q, click.Argument)):
            continue  # forwarded to a pass-through (stack): checked by its own test
        assert par is not None, f"{entry}: {flag} (parameter {key}) is no CLI option"
        passed |= set(par.opts)
        if par.required:  # the CLI insists (method, strategy); mlflow run has a default
            continue
        same = str(p.default) == str(par.default)
        if (entry, key) in DEFAULT_DIFFERS:
            assert not same, f"stale DEFAULT_DIFFERS entry {(entry, key)}"
        else:
            assert same, (entry, key, p.default, par.default)
    exempt = set(CLI_ONLY["*"]) | set(CLI_ONLY.get(entry, {}))
    left_out = {q.opts[0] for q in cmd.params if not set(q.opts) & passed} - exempt
    assert not left_out, f"{entry}: CLI options MLproject never passes: {sorted(left_out)}"
    stale = set(CLI_ONLY.get(entry, {})) - {o for q in cmd.params for o in q.opts}
    assert not stale, f"{entry}: CLI_ONLY names options the command lacks: {stale}"


def test_stack_entry_point_passes_only_what_was_given(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`mlflow run . -e stack` passes every port; its 'default' means 'not given', so
    scripts/stack sees only the action unless a port was set."""
    from mlflow.projects import _project_spec

    import scarcelab.tracking.stack as stack_mod
    from scarcelab.entrypoints.cli import main

    seen: list[list[str]] = []
    monkeypatch.setattr(stack_mod, "main", lambda argv: seen.append(argv) or 0)
    ep = _project_spec.load_project(str(REPO)).get_entry_point("stack")
    defaults = {k: str(p.default) for k, p in ep.parameters.items()}
    argv = shlex.split(ep.command.format(**defaults))[3:]
    assert CliRunner().invoke(main, argv).exit_code == 0
    argv = shlex.split(ep.command.format(**{**defaults, "s3_port": "9100"}))[3:]
    assert CliRunner().invoke(main, argv).exit_code == 0
    assert seen == [["start"], ["start", "--s3-port", "9100"]]


def test_entry_maps_agree_with_mlproject() -> None:
    """The parameter -> option maps the merge under `mlflow run` uses (``merge_params``)
    name exactly the entry points' parameters."""
    from mlflow.projects import _project_spec

    from scarcelab.entrypoints.al import AL_ENTRY
    from scarcelab.entrypoints.cli import main
    from scarcelab.entrypoints.contamination import CONTAMINATION_ENTRY
    from scarcelab.entrypoints.study import FAMILY_ENTRY

    project = _project_spec.load_project(str(REPO))
    maps = {"al": AL_ENTRY, "contamination": CONTAMINATION_ENTRY, "supervised": FAMILY_ENTRY,
            "semi": FAMILY_ENTRY, "self": FAMILY_ENTRY}
    for entry, names in maps.items():
        ep = project.get_entry_point(entry)
        assert set(ep.parameters) == set(names), entry
        opts = {p.name: p for p in main.commands[entry].params}
        for key in ep.parameters:
            assert "--" + key.replace("_", "-") in opts[names[key]].opts, (entry, key)


def test_merge_params_follows_the_trackers_rule_under_mlflow_run() -> None:
    from scarcelab.entrypoints.options import merge_params

    entry = {"arch": "auto", "data_dir": "default", "seed": "0", "budget_minutes": "3"}
    merged = merge_params(entry, {"arch": "small_cnn", "data_dir": None, "seed": 0,
                                  "budget_minutes": 3.0, "family": "semi"})
    assert merged == {"arch": "auto", "data_dir": "default", "seed": "0",
                      "budget_minutes": "3", "resolved.arch": "small_cnn",
                      "resolved.budget_minutes": 3.0,  # data_dir None: "not set", no null
                      "family": "semi"}


def _params(uri: str, experiment: str) -> dict[str, str]:
    import mlflow

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=[experiment])
    study = runs[runs["tags.scarcelab.role"] == "study"]
    assert len(study) == 1
    row = study.iloc[0]
    return {c[len("params."):]: row[c] for c in runs.columns
            if c.startswith("params.") and row[c] is not None}


def test_console_script_and_mlflow_run_log_the_same_parameters(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The same tiny study started as ``scarcelab supervised …`` and as MLflow Projects
    starts it — MLflow's own code computes and logs the entry point's parameters and the
    command line, then the command runs under ``MLFLOW_RUN_ID`` — logs identical params.
    (tests/e2e/test_param_parity.py repeats this through a real ``mlflow run``.)"""
    import mlflow
    from mlflow.entities import Param
    from mlflow.projects import _project_spec
    from mlflow.tracking import MlflowClient

    uri = _use_store(tmp_path, monkeypatch)
    user = {"method": "sup", "dataset": "synthetic_tiny", "arch": "auto", "device": "cpu",
            "max_epochs": "1", "batch_size": "16", "max_steps_per_epoch": "2",
            "max_trials": "1", "budget_minutes": "2", "n_labeled": "30"}
    cli = ["supervised", *[a for k, v in user.items()
                           for a in (f"--{k.replace('_', '-')}", v)]]
    r = _invoke([*cli, "--experiment", "cli"])
    assert r.exit_code == 0, r.output

    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    exp = client.create_experiment("project")
    ep = _project_spec.load_project(str(REPO)).get_entry_point("supervised")
    final, extra = ep.compute_parameters(user, storage_dir=None)
    run = client.create_run(exp)
    client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in
                                              list(final.items()) + list(extra.items())])
    argv = shlex.split(ep.compute_command(user, storage_dir=None))
    assert argv[:4] == ["python", "-m", "scarcelab.entrypoints.cli", "supervised"]
    monkeypatch.setenv("MLFLOW_RUN_ID", run.info.run_id)
    r = _invoke(argv[3:])
    assert r.exit_code == 0, r.output
    monkeypatch.delenv("MLFLOW_RUN_ID")

    a, b = _params(uri, "cli"), _params(uri, "project")
    assert a == b
    assert a["arch"] == "auto" and a["resolved.arch"] == "small_cnn"
    assert a["data_dir"] == "default" and "''" not in a.values()


def test_contamination_sweep_runs_with_child_progress_and_parent_params(tmp_path,
                                                                         monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import mlflow

    uri = _use_store(tmp_path, monkeypatch)
    r = _invoke(["contamination", "--method", "fixmatch", *TINY, "--n-labeled", "30",
                 "--unlabeled-batch-size", "16", "--diag-samples", "0", "--ood", "gaussian",
                 "--ratios", "0,0.5", "--experiment", "contam", "-v"])
    assert r.exit_code == 0, r.output
    assert "child 1/3: tuning study (r=0)" in r.output
    assert "child 2/3: gaussian r=0" in r.output and "child 3/3: gaussian r=0.5" in r.output
    assert "parent run: " in r.output
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["contam"])
    parent = runs[runs["tags.scarcelab.role"] == "contamination"].iloc[0]
    # entry parameters as given (as mlflow run logs them), resolved values beside them
    assert parent["params.budget_minutes"] == "2"
    assert parent["params.resolved.budget_minutes"] == "2.0"
    assert parent["params.ood_dir"] == "default" and parent["params.set"] == "none"
    children = runs[runs["tags.scarcelab.role"] == "study"]
    assert len(children) == 3  # the tuning study at r=0, then one study per point
    assert (children["tags.scarcelab.sweep_role"] == "tuning").sum() == 1
    assert set(children["tags.mlflow.parentRunId"]) == {parent.run_id}
