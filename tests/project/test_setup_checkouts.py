"""Issue 27 item 6: one checkout's scripts/setup never touches another checkout.

Older setups linked MLflow's env folder ``$MLFLOW_ENV_ROOT/mlflow-<hash>`` to the
checkout's ``.venv``, the hash from MLflow's private ``_get_virtualenv_name``; the hash does
not depend on the checkout, so a second clone's ``mlflow run`` ran in the first clone's
venv. Now ``mlflow run`` uses the venv through MLflow's documented ``--env-manager local``,
setup links nothing, and it only removes links into its own ``.venv``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _checkout(root: Path) -> Path:
    """A clone as scripts/setup leaves it: a finished ``.venv`` (stamp, activate)."""
    venv = root / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    (venv / ".scarcelab-setup.sha256").write_text("0" * 64)
    return venv


def _legacy_links(project: Path, venv: Path, env_root: Path) -> str:
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "mlflow_env.py"),
                          "legacy-links", str(project), str(venv)],
                         env={**os.environ, "MLFLOW_ENV_ROOT": str(env_root)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_second_clone_removes_only_its_own_legacy_link(tmp_path: Path) -> None:
    a, b = tmp_path / "clone-a", tmp_path / "clone-b"
    va, vb = _checkout(a), _checkout(b)
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "mlflow-0a").symlink_to(va, target_is_directory=True)  # clone A's old setup
    (envs / "mlflow-0b").symlink_to(vb, target_is_directory=True)  # clone B's old setup
    (envs / "mlflow-built").mkdir()  # an env MLflow built itself
    (envs / "mlflow-built" / "marker").write_text("x")
    said = _legacy_links(b, vb, envs)
    assert not (envs / "mlflow-0b").exists() and not (envs / "mlflow-0b").is_symlink()
    assert os.readlink(envs / "mlflow-0a") == str(va)  # clone A's link: untouched
    assert (envs / "mlflow-built" / "marker").read_text() == "x"
    assert f"{envs / 'mlflow-0a'} -> {va}" in said and "left alone" in said
    assert "--env-manager local" in said
    # clone A's setup then removes its own link; nothing else was ever created
    _legacy_links(a, va, envs)
    assert sorted(p.name for p in envs.iterdir()) == ["mlflow-built"]
    assert sorted(p.name for p in a.iterdir()) == [".venv"]  # nothing written in the clone


def test_setup_links_nothing_and_uses_no_private_mlflow_api() -> None:
    """What setup runs: no symlink into MLflow's env folder, no ``_get_virtualenv_name``
    (the old link step), and the README's main command passes ``--env-manager local``."""
    setup = (REPO / "scripts" / "setup").read_text()
    helper = (REPO / "scripts" / "mlflow_env.py").read_text()
    assert "_get_virtualenv_name(" not in helper and "symlink_to(" not in helper
    assert '"$HELPER" link ' not in setup and "legacy-links" in setup
    readme = (REPO / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("## Running studies")]
    assert "mlflow run . -e semi -P method=fixmatch --env-manager local" in quick
