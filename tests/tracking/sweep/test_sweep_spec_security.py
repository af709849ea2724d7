"""Sweep specs as an attack surface (issue 42 items 2 and 5).

Item 5: ``scarcelab sweep --dry-run`` printed each cell's command unquoted, so a spec value
``method: "sup; touch FILE"`` became a second shell command in the printed line. Values of
options that take a registered name (method, dataset, arch, strategy) or one of fixed words
are now checked when the spec is read, before anything is printed, and every printed
argument is shell-quoted. The probe: the printed lines are run by a real shell with
``scarcelab`` defined as a function that records its arguments.

Item 2: a spec's ``env:`` is an allowlist (see ``tracking/sweep/spec.py``): proxy, CA-bundle,
TLS and storage variables sent the tracking server's credentials elsewhere.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from scarcelab.entrypoints.cli import main
from scarcelab.tracking.sweep.spec import SpecError, check_spec_names, parse_spec


def _dry_run(tmp_path: Path, text: str) -> tuple[int, str]:
    p = tmp_path / "g.yaml"
    p.write_text(text)
    r = CliRunner().invoke(main, ["sweep", str(p), "--dry-run"])
    return r.exit_code, r.output


def _run_printed(tmp_path: Path, output: str) -> list[list[str]]:
    """Each printed cell line (after its id) run by ``sh`` with ``scarcelab`` a function
    that records its arguments, one JSON list per call, in ``tmp_path/calls``."""
    calls = tmp_path / "calls"
    script = ['scarcelab() { python3 -c \'import json,sys; print(json.dumps(sys.argv[1:]))\' '
              f'"$@" >> {calls}; }}']
    script += [ln.split("  ", 1)[1] for ln in output.splitlines()[1:]]
    subprocess.run(["sh", "-c", "\n".join(script)], cwd=tmp_path, check=False, timeout=60,
                   capture_output=True)
    return [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []


@pytest.mark.parametrize("key,value", [("method", "sup; touch PWNED"),
                                       ("method", "$(touch PWNED)"),
                                       ("dataset", "synthetic_tiny`touch PWNED`"),
                                       ("arch", "small_cnn && touch PWNED")])
def test_a_value_that_is_no_registered_name_is_refused_before_anything_is_printed(
        tmp_path: Path, key: str, value: str) -> None:
    opts = {"method": "sup", "dataset": "synthetic_tiny", "arch": "small_cnn", key: value}
    text = "name: x\ngrids:\n  - entry: supervised\n" + "".join(
        f"    {k}: {json.dumps(v)}\n" for k, v in opts.items())
    code, out = _dry_run(tmp_path, text)
    line = 4 + list(opts).index(key)
    assert code != 0 and out.count("\n") == 1, out  # one line
    assert f"g.yaml:{line}: {key}: " in out and "unknown" in out and "Traceback" not in out
    assert "scarcelab supervised" not in out  # nothing printed to copy
    _run_printed(tmp_path, out)
    assert not (tmp_path / "PWNED").exists()


def test_a_method_of_another_family_is_refused_at_its_line() -> None:
    sp = parse_spec("name: x\ngrids:\n  - entry: supervised\n    method: fixmatch\n"
                    "    seed: [0, 1]\n", "g.yaml")
    with pytest.raises(SpecError, match=r"^g.yaml:4: method: .*fixmatch is a semi method, "
                                        r"not supervised"):
        check_spec_names(sp)


def test_printed_commands_are_shell_quoted_and_round_trip(tmp_path: Path) -> None:
    """Legit values a shell would split or interpret: a user's image folder with spaces,
    parentheses and a ``$`` in its name, and an option that takes free text. The printed
    line, run by a shell, gives the command exactly the cell's arguments."""
    folder = tmp_path / "my scans (2024) $HOME"
    (folder / "labeled" / "a").mkdir(parents=True)
    (folder / "labeled" / "b").mkdir(parents=True)
    text = ("name: x\ngrids:\n  - entry: supervised\n    method: sup\n"
            f"    dataset: {json.dumps('folder:' + str(folder))}\n"
            "    run-name: [\"a b; touch PWNED\", plain]\n")
    code, out = _dry_run(tmp_path, text)
    assert code == 0, out
    sp = parse_spec(text, str(tmp_path / "g.yaml"))
    calls = _run_printed(tmp_path, out)
    assert calls == [c.argv() for c in sp.cells]
    assert any(str(folder) in a for a in calls[0])
    assert not (tmp_path / "PWNED").exists()


# -- item 2: env: is an allowlist ---------------------------------------------------------------

ENV_SPEC = "name: x\nenv:\n  OMP_NUM_THREADS: '1'\n  {name}: '{value}'\ngrids:\n" \
           "  - entry: supervised\n    method: sup\n"


@pytest.mark.parametrize("name,value", [
    ("HTTP_PROXY", "http://127.0.0.1:8888"),  # received the server's Basic-auth credentials
    ("HTTPS_PROXY", "http://127.0.0.1:8888"), ("http_proxy", "http://127.0.0.1:8888"),
    ("ALL_PROXY", "socks5://127.0.0.1:1080"), ("NO_PROXY", "*"),
    ("REQUESTS_CA_BUNDLE", "/tmp/evil-ca.pem"), ("SSL_CERT_FILE", "/tmp/evil-ca.pem"),
    ("CURL_CA_BUNDLE", "/tmp/evil-ca.pem"), ("MLFLOW_TRACKING_INSECURE_TLS", "true"),
    ("MLFLOW_TRACKING_SERVER_CERT_PATH", "/tmp/evil-ca.pem"),
    ("OPTUNA_STORAGE", "postgresql://x@evil/optuna"),  # every cell's search elsewhere
    ("MLFLOW_S3_ENDPOINT_URL", "http://evil:9000"), ("AWS_ENDPOINT_URL", "http://evil:9000"),
    ("MLFLOW_TRACKING_TOKEN", "t"), ("MLFLOW_TRACKING_USERNAME", "admin"),
    ("SCARCELAB_SPOOL_DIR", "/tmp/world-readable"), ("SCARCELAB_MEDMNIST_URL", "http://evil/"),
    ("SCARCELAB_CACHE", "/tmp/poisoned"), ("SCARCELAB_PG_BIN", "/tmp/bin"),
    ("FLAG", "1"),
])
def test_env_outside_the_allowlist_is_refused_in_one_line_naming_file_and_variable(
        tmp_path: Path, name: str, value: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(ENV_SPEC.format(name=name, value=value), "g.yaml")
    msg = str(e.value)
    assert msg.startswith(f"g.yaml:4: env: {name} ") and "\n" not in msg, msg
    code, out = _dry_run(tmp_path, ENV_SPEC.format(name=name, value=value))
    assert code != 0 and out.count("\n") == 1 and f"g.yaml:4: env: {name} " in out, out
    assert "scarcelab supervised" not in out


def test_the_driver_set_gpu_memory_cap_is_not_a_spec_variable() -> None:
    with pytest.raises(SpecError, match="SCARCELAB_GPU_MEMORY_FRACTION is set by the sweep "
                                        "driver"):
        parse_spec(ENV_SPEC.format(name="SCARCELAB_GPU_MEMORY_FRACTION", value="0.5"),
                   "g.yaml")


@pytest.mark.parametrize("name,value", [
    ("MKL_NUM_THREADS", "2"), ("OPENBLAS_NUM_THREADS", "2"),
    ("CUBLAS_WORKSPACE_CONFIG", ":4096:8"), ("CUDA_LAUNCH_BLOCKING", "1"),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"), ("PYTHONHASHSEED", "0"),
    ("PYTHONUNBUFFERED", "1"), ("SCARCELAB_DATA", "/data"), ("SCARCELAB_AL_FASTFIT", "0"),
    ("SCARCELAB_SYSTEM_METRICS", "0"), ("SCARCELAB_USER_MY_PLUGIN_MODE", "fast"),
])
def test_what_a_cell_may_need_still_passes(name: str, value: str) -> None:
    sp = parse_spec(ENV_SPEC.format(name=name, value=value), "g.yaml")
    assert sp.env == {"OMP_NUM_THREADS": "1", name: value}


def test_a_spec_built_in_code_is_held_to_the_allowlist(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.tracking.sweep.driver import Driver
    from scarcelab.tracking.sweep.spec import SweepSpec

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    sp = parse_spec(ENV_SPEC.format(name="PYTHONHASHSEED", value="0"), "g.yaml")
    bad = SweepSpec(sp.name, sp.experiment, sp.cells, env={"HTTPS_PROXY": "http://evil:1"},
                    path="g.yaml")
    with pytest.raises(SpecError, match="HTTPS_PROXY is not a variable a spec may set"):
        Driver(bad, echo=lambda s: None)
