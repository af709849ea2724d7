"""The newer entry points (probe, segment, tune, sweep) answer a bad value with one click
error line naming the option, not a traceback (issue 16, "Errors")."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from scarcelab.entrypoints.cli import main


@pytest.mark.parametrize("args,option", [
    (["probe", "--budget-minutes", "x"], "--budget-minutes"),
    (["probe", "--max-epochs", "0"], "--max-epochs"),
    (["probe", "--seed", "-1"], "--seed"),
    (["probe", "--device", "nosuch"], "--device"),
    (["segment", "--max-epochs", "abc"], "--max-epochs"),
    # before: 0 meant "the default" and a whole segmentation ran (opt_int(...) or 100)
    (["segment", "--max-epochs", "0"], "'--max-epochs'"),
    (["segment", "--batch-size", "0"], "'--batch-size'"),
    (["segment", "--scale", "-1"], "'--scale'"),
    (["segment", "--aggregation", "mean"], "'--aggregation'"),
    (["segment", "--types", "maybe"], "'--types'"),
    (["probe", "--probe-trials", "0"], "'--probe-trials'"),
    (["tune", "--method", "ce", "--epochs", "abc"], "--epochs"),
    (["tune", "--method", "ce", "--n-trials", "-3"], "'--n-trials'"),
    (["tune", "--method", "ce", "--grace-period", "0"], "'--grace-period'"),
    (["tune", "--resume", "no such id"], "'--resume'"),
    (["sweep", "/nonexistent/grid.yaml"], "no such spec file"),
])
def test_bad_values_are_one_line_errors(args, option):
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0
    assert "Traceback" not in r.output and r.exception is None or isinstance(
        r.exception, SystemExit), r.output
    err = [ln for ln in r.output.splitlines() if ln.startswith("Error")]
    assert len(err) == 1 and option in err[0], r.output


def test_segment_cuda_on_a_cpu_machine_is_a_parameter_error():
    """Before: torch's 'Found no NVIDIA driver' traceback after the data was loaded."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = CliRunner().invoke(main, ["segment", "--device", "cuda"])
    assert r.exit_code == 2, r.output
    assert "'--device'" in r.output and "CUDA is not available" in r.output


# -- issue 25 item 9: tune's options go through the typed layer, before any data is read ------

@pytest.mark.parametrize("args,option,words", [
    (["--set", "lr=abc"], "'--set'", "not a number"),  # before: every trial failed
    (["--set", "lambda_ole=abc"], "'--set'", "not a number"),
    (["--set", "nosuch=1"], "'--set'", "unknown hyperparameter"),  # before: after loading
    (["--method", "fixmatch"], "'--method'", "semi"),
    (["--method", "nosuch"], "'--method'", "unknown method"),
    (["--dataset", "nosuch"], "'--dataset'", "unknown dataset"),
    (["--arch", "nosuch"], "'--arch'", "unknown arch"),
    (["--data-dir", "/nonexistent/data"], "'--data-dir'", "does not exist"),  # was ignored
    (["--batch-sizes", "8,x"], "'--batch-sizes'", "not an integer"),
    (["--phase", "sometimes"], "'--phase'", "expected one of"),
    (["--device", "nosuch"], "'--device'", "expected auto"),
])
def test_tune_bad_values_stop_before_the_data_is_read(args, option, words, tmp_path,
                                                      monkeypatch):
    import scarcelab.protocols.tune as tune

    def no_data(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the data was read before the options were checked")

    monkeypatch.setattr(tune, "load_raw", no_data)
    db = tmp_path / "m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    base = {"--method": "ole", "--dataset": "synthetic_tiny_rgb", "--device": "cpu"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    r = CliRunner().invoke(main, ["tune", *[x for kv in base.items() for x in kv]])
    err = [ln for ln in r.output.splitlines() if ln.startswith("Error")]
    assert r.exit_code == 2 and len(err) == 1, r.output
    assert option in err[0] and words in err[0], err[0]
    assert not db.exists()  # no run was created


def test_tune_typed_set_values_reach_the_protocol(monkeypatch):
    """``--set lambda_ole=0.5`` arrives as the float the method expects, not a string."""
    import scarcelab.protocols.tune as tune

    seen = {}

    def stop(cfg, tracker, resume=None):  # type: ignore[no-untyped-def]
        seen.update(cfg.overrides, batch_sizes=cfg.batch_sizes)
        raise tune.ConfigError("stop here")

    monkeypatch.setattr(tune, "run_tune", stop)
    r = CliRunner().invoke(main, ["tune", "--method", "ole", "--dataset", "synthetic_tiny_rgb",
                                  "--set", "lambda_ole=0.5,lr=1e-3", "--batch-sizes", "8, 16",
                                  "--device", "cpu"])
    assert r.exit_code == 1 and "stop here" in r.output, r.output
    assert seen == {"lambda_ole": 0.5, "lr": 0.001, "batch_sizes": (8, 16)}


