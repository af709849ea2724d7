"""Every command module imports on its own, in a fresh interpreter, in any order."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import scarcelab.entrypoints as entrypoints

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(i.name for i in pkgutil.iter_modules(entrypoints.__path__)
                 if i.name not in ("__main__",))


@pytest.mark.parametrize("name", MODULES)
def test_command_module_imports_first(name: str) -> None:
    # importing a command module before cli used to be a circular import
    # (study -> cli -> contamination -> study)
    code = (f"import scarcelab.entrypoints.{name}\n"
            "from scarcelab.entrypoints.cli import main\n"
            "assert {'semi', 'contamination', 'sweep'} <= set(main.commands), main.commands\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
