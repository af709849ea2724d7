"""Installable where users work (issue 16): the wheel installs one top-level package,
``scarcelab`` (tracking/ and entrypoints/ under it), runs in a fresh venv, and the
learning core never imports mlflow."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE_EXCLUDED = ("tracking", "entrypoints")  # scarcelab.tracking / .entrypoints: MLflow side


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(out), str(REPO)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    (whl,) = out.glob("scarcelab-*.whl")
    return whl


def test_wheel_installs_only_the_scarcelab_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(
        (".dist-info", ".data"))}
    assert tops == {"scarcelab"}, tops
    for must in ("scarcelab/tracking/mlflow_tracker.py", "scarcelab/tracking/query/views.py",
                 "scarcelab/tracking/sweep/driver.py", "scarcelab/entrypoints/cli.py",
                 "scarcelab/py.typed", "scarcelab/methods/semi/fixmatch.py"):
        assert must in names, must
    meta = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "Provides-Extra: stack" in text and "Provides-Extra: dev" in text
    assert "Requires-Dist: mlflow<4,>=3.17" in text  # ranges, not pins
    ep = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(
        "entry_points.txt"))).decode()
    assert "scarcelab = scarcelab.entrypoints.cli:main" in ep


def test_wheel_in_a_fresh_venv_lists_methods(wheel: Path, tmp_path: Path) -> None:
    """A venv with nothing but the wheel (its dependencies come from this environment's
    site-packages on PYTHONPATH, which does not process .pth files — so the editable
    checkout is not visible) runs the console script from outside the checkout."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, timeout=300, capture_output=True)
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"],
           "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("MLFLOW_RUN_ID", None)
    r = subprocess.run([str(venv / "bin" / "scarcelab"), "list", "methods"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "fixmatch\tsemi" in r.stdout
    r = subprocess.run([str(py), "-c", "import scarcelab, scarcelab.tracking.stack as s; "
                        "print(scarcelab.__file__); print(s.default_root())"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    pkg_file, root = r.stdout.split()
    assert str(venv) in pkg_file  # the installed copy, not the checkout
    assert root.startswith(str(tmp_path / "state"))  # stack state outside site-packages
    for name in CORE_EXCLUDED:
        r = subprocess.run([str(py), "-c", f"import {name}"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0, f"a top-level module {name!r} is installed"


def _core_modules() -> list[str]:
    out = []
    for p in sorted((REPO / "scarcelab").rglob("*.py")):
        rel = p.relative_to(REPO).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append(".".join(parts))
    return out


def test_the_learning_core_never_imports_mlflow() -> None:
    for p in (REPO / "scarcelab").rglob("*.py"):
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                assert not n.startswith(("mlflow", "scarcelab.tracking", "tracking",
                                         "scarcelab.entrypoints", "entrypoints")), (p, n)
    code = ("import importlib, sys\n"
            f"for m in {_core_modules()!r}:\n    importlib.import_module(m)\n"
            "bad = [m for m in sys.modules if m.split('.')[0] == 'mlflow' or "
            "m.startswith(('scarcelab.tracking', 'scarcelab.entrypoints'))]\n"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
