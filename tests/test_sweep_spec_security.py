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
