"""Issue 43 §2: ``scripts/setup`` shows each phase (a line when it starts, its duration when
it ends) and closes with the total time and the venv's size, instead of four lines over
eleven minutes of quiet pip work.

The real script runs here in a copy of the checkout's setup inputs, with a stand-in
interpreter: ``-m venv`` makes a venv whose ``python`` records every ``-m pip`` call and
succeeds without installing anything, and passes everything else (check-pins, the stamp key,
the weed lookup) to this environment's Python. So every phase of a first setup runs, in
order, in about a second, and nothing is downloaded or installed."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INPUTS = ("requirements.txt", "requirements-dev.txt", "pyproject.toml", "python_env.yaml",
          "setup.py")


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _checkout(tmp: Path) -> tuple[Path, dict[str, str], Path]:
    root = tmp / "clone"
    shutil.copytree(REPO / "scripts", root / "scripts")
    for name in INPUTS:
        shutil.copy(REPO / name, root / name)
    pip_log = tmp / "pip.log"
    # the venv's python: pip calls are recorded and succeed; the rest runs for real
    venv_python = (f'#!/usr/bin/env bash\nif [ "$1" = -m ] && [ "$2" = pip ]; then\n'
                   f'  echo "$*" >> {pip_log}; exit 0\nfi\nexec {sys.executable} "$@"\n')
    base = tmp / "python3.11"
    _exe(base, f'#!/usr/bin/env bash\n[ "$1" = -m ] && [ "$2" = venv ] || exit 9\n'
               f'mkdir -p "$3/bin"\ncat > "$3/bin/python" <<\'PY\'\n{venv_python}PY\n'
               f'chmod +x "$3/bin/python"\n')
    env = {**os.environ, "PYTHON": str(base), "MLFLOW_ENV_ROOT": str(tmp / "envs")}
    return root, env, pip_log


def _setup(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(root / "scripts" / "setup")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_first_setup_reports_each_phase_with_its_duration_and_a_total(tmp_path: Path) -> None:
    root, env, pip_log = _checkout(tmp_path)
    r = _setup(root, env)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    started = [m.group(1) for ln in lines if (m := re.fullmatch(r"\[setup\] (.+) \.\.\.", ln))]
    ended = [m.group(1) for ln in lines
             if (m := re.fullmatch(r"\[setup\] (.+): done in \d+\.\ds", ln))]
    assert started == ended, lines  # every phase that starts says how long it took
    kinds = [s.split(":")[0] for s in started]
    assert kinds == ["venv", "pins", "pip", "pip", "pip", "pip", "mlflow", "extras",
                     "postgres"], started
    assert any("torch==" in s and "torchvision==" in s for s in started)  # torch alone
    assert re.fullmatch(r"\[setup\] done in \d+\.\ds; .+/\.venv is \S+", lines[-1]), lines[-1]
    # the phases ran the installs the old script ran, in its order, torch split out first
    calls = pip_log.read_text().splitlines()
    assert [c.split()[-1] for c in calls][-2:] == ["requirements-dev.txt", "."]
    assert any("torch==" in c for c in calls[:-2])
    # quiet otherwise: pip stays -q, and the phases print nothing but their two lines
    assert all(" -q " in c for c in calls)
    assert all(ln.startswith("[setup] ") for ln in lines), lines

    # a second run with nothing changed: no pip work, no pip phase, still a total
    pip_log.unlink()
    r2 = _setup(root, env)
    assert r2.returncode == 0, r2.stderr
    assert not pip_log.exists()
    assert "packages up to date" in r2.stdout and "pip:" not in r2.stdout
    assert r2.stdout.splitlines()[-1].startswith("[setup] done in ")


def test_a_failing_phase_names_itself_with_its_time_and_stops_setup(tmp_path: Path) -> None:
    root, env, pip_log = _checkout(tmp_path)
    venv_py = root / ".venv" / "bin" / "python"
    r = _setup(root, env)
    assert r.returncode == 0, r.stderr
    (root / ".venv" / ".scarcelab-setup.sha256").unlink()  # inputs "changed": pip again
    text = venv_py.read_text().replace("exit 0", "exit 3")  # pip fails
    venv_py.write_text(text)
    r = _setup(root, env)
    assert r.returncode == 3
    assert re.search(r"\[setup\] pip: .+: failed after \d+\.\ds \(exit 3\)", r.stderr), r.stderr
    assert "[setup] done in" not in r.stdout  # no closing line after a failure


def test_durations_read_as_seconds_or_minutes() -> None:
    script = (f'. {REPO}/scripts/setup_phases.sh; fmt_secs 400000; echo; fmt_secs 12345678; '
              'echo; fmt_secs 185000000; echo; phase "fake phase" sleep 0.2')
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    out = r.stdout.splitlines()
    assert out[:3] == ["0.4s", "12.3s", "3m 05s"]
    assert out[3] == "[setup] fake phase ..."
    m = re.fullmatch(r"\[setup\] fake phase: done in (\d+\.\d)s", out[4])
    assert m and 0.2 <= float(m.group(1)) < 5, out
