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
