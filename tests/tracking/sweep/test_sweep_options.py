"""``sweep``'s options go through the typed option layer: ``mlflow run -P`` strings parse as
the CLI's own values, and a bad value is a click usage error that names the option."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from scarcelab.entrypoints.cli import main

SPEC = ("name: mini\nretries: 2\ngrids:\n"
        "  - {entry: supervised, method: sup, dataset: synthetic_tiny, seed: [0, 1]}\n"
        "smoke:\n  max_epochs: 1\n")


@pytest.fixture
def spec(tmp_path):
    p = tmp_path / "mini.yaml"
    p.write_text(SPEC)
    return str(p)


def _dry(spec: str, *args: str):
    return CliRunner().invoke(main, ["sweep", spec, "--dry-run", *args])


@pytest.mark.parametrize("args, option", [
    (["--retries", "-1"], "--retries"), (["--retries", "2.5"], "--retries"),
    (["--retries", "many"], "--retries"), (["--jobs", "0"], "--jobs"),
    (["--jobs", "default"], "--jobs"), (["--max-cells", "0"], "--max-cells"),
    (["--full-scale", "maybe"], "--full-scale"), (["--smoke-scale", "2"], "--smoke-scale"),
])
def test_a_bad_value_names_its_option(spec, args, option):
    r = _dry(spec, *args)
    assert r.exit_code == 2, r.output
    assert f"Invalid value for '{option}'" in r.output


def test_mlflow_run_strings_parse_as_the_cli_values(spec):
    """What MLproject's sweep entry passes (``--full-scale false --retries default``) is the
    plain command; ``2.0`` (MLflow's rendering of a float) is 2."""
    plain = _dry(spec)
    assert plain.exit_code == 0, plain.output
    assert "retries=2)" in plain.output and "reference scale" in plain.output
    mlflow_style = _dry(spec, "--address", "", "--full-scale", "false", "--smoke-scale",
                        "false", "--retries", "default")
    assert mlflow_style.output == plain.output
    assert "retries=0)" in _dry(spec, "--retries", "0").output
    assert "retries=3)" in _dry(spec, "--retries", "3.0").output
    smoke = _dry(spec, "--smoke-scale", "true")
    assert smoke.exit_code == 0 and "smoke scale" in smoke.output
    assert smoke.output == _dry(spec, "--smoke").output


def test_the_sweep_run_takes_the_identity_options(spec, store):
    """--run-name, --tags and --description name, tag and describe the sweep run, as on
    every command that logs a run; a resumed sweep (found by its role and sweep tags,
    never its name) keeps its name unless a new one is given. Reserved keys are refused
    while parsing."""
    from mlflow.tracking import MlflowClient

    from scarcelab.tracking.sweep.driver import Driver, Identity
    from scarcelab.tracking.sweep.spec import load_spec

    bad = _dry(spec, "--tags", "scarcelab.role=study")
    assert bad.exit_code == 2 and "scarcelab." in bad.output
    uri = store  # the driver's MlflowClient() reads the process's tracking URI
    sp = load_spec(spec)

    def opened(identity: Identity | None) -> dict[str, str]:
        drv = Driver(sp, identity=identity, echo=lambda s: None)
        rid = drv._open_sweep_run(drv._experiment_id())
        return {"run_id": rid, **MlflowClient(uri).get_run(rid).data.tags}

    first = opened(Identity("nightly mini", {"project": "liver"}, "for the board"))
    assert first["mlflow.runName"] == "nightly mini" and first["project"] == "liver"
    assert first["mlflow.note.content"] == "for the board"
    again = opened(None)  # the same sweep resumed without options: nothing renamed
    assert again["run_id"] == first["run_id"] and again["mlflow.runName"] == "nightly mini"
    renamed = opened(Identity(run_name="mini, second night"))
    assert renamed["run_id"] == first["run_id"]
    assert renamed["mlflow.runName"] == "mini, second night"
    plain = Driver(load_spec(spec), echo=lambda s: None)  # no identity: the default name
    assert plain.identity == Identity()
