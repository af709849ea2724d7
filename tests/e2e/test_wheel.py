"""The built distribution, as a user who installs it gets it (issue 43 §2): wheel and sdist
built from the tracked files with ``python -m build`` (the wheel from the unpacked sdist, so
a file missing from the sdist fails here), their metadata validated by ``packaging`` (the
core-metadata rules PyPI applies), and the wheel installed into a fresh venv, outside the
checkout, where ``scarcelab --help``, ``scarcelab list datasets`` and a 1-epoch study run.

Why the fresh venv borrows this venv's packages (a path line in a ``.pth``) instead of
resolving them: a resolution downloads ~6 GB (torch's CUDA wheels) per CI run. What the
borrowing cannot hide is what this test is for: the package layout (``tracking/`` and
``entrypoints/`` installed as ``scarcelab.tracking`` / ``scarcelab.entrypoints`` through
the symlinks ``scarcelab/tracking`` and ``scarcelab/entrypoints``), the console script,
``py.typed`` and the metadata. The dependency
ranges against the pins are checked by ``scripts/mlflow_env.py check-pins`` (scripts/setup).
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STUDY = ["supervised", "--method", "sup", "--dataset", "synthetic_tiny", "--arch", "small_cnn",
         "--device", "cpu", "--max-epochs", "1", "--batch-size", "16",
         "--max-steps-per-epoch", "2", "--max-trials", "1", "--budget-minutes", "1",
         "--experiment", "from-wheel"]


def _tracked_copy(dst: Path) -> Path:
    """The checkout's tracked files only (what a clone has; no .venv, no egg-info), so the
    build writes its egg-info and build/ into the copy, never into the checkout."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = REPO / f
        if src.is_symlink():  # scarcelab/tracking -> ../tracking: a link, as a clone has it
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            (dst / f).symlink_to(os.readlink(src))
        elif src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    return dst


def _metadata(raw: bytes) -> object:
    from packaging.metadata import Metadata

    return Metadata.from_email(raw, validate=True)  # raises on any invalid field


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout (the build takes the tracked files)")
    pytest.importorskip("build", reason="`build` is in requirements-dev.txt (scripts/setup)")
    root = tmp_path_factory.mktemp("wheel")
    src = _tracked_copy(root / "src")
    out = root / "dist"
    # --no-isolation: the build backend (setuptools) is this venv's; an isolated build would
    # download it. The wheel is built from the sdist (build's default with both asked).
    p = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel",
                        "--outdir", str(out), str(src)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out


@pytest.mark.e2e
def test_wheel_and_sdist_carry_valid_metadata_and_the_whole_package(dist: Path) -> None:
    import scarcelab

    (whl,) = dist.glob("scarcelab-*.whl")
    (sdist,) = dist.glob("scarcelab-*.tar.gz")
    assert whl.name == f"scarcelab-{scarcelab.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        meta = z.read(f"scarcelab-{scarcelab.__version__}.dist-info/METADATA")
        entry = z.read(f"scarcelab-{scarcelab.__version__}.dist-info/entry_points.txt").decode()
    m = _metadata(meta)
    assert m.name == "scarcelab" and str(m.version) == scarcelab.__version__  # type: ignore[attr-defined]
    assert str(m.requires_python) == "<3.12,>=3.11"  # type: ignore[attr-defined]
    reqs = {r.name for r in m.requires_dist}  # type: ignore[attr-defined]
    assert {"torch", "mlflow", "optuna", "click"} <= reqs
    assert {"all", "stack", "sweep", "dicom", "pathology"} <= set(m.provides_extra)  # type: ignore[attr-defined]
    assert "scarcelab = scarcelab.entrypoints.cli:main" in entry
    # the mapped folders are inside the package; nothing installs a top-level module named
    # tracking/entrypoints (a PyPI distribution of that name exists), no tests, no suites
    for must in ("scarcelab/py.typed", "scarcelab/train.py",
                 "scarcelab/tracking/__init__.py", "scarcelab/tracking/stack.py",
                 "scarcelab/tracking/results/page.py", "scarcelab/entrypoints/cli.py"):
        assert must in names, must
    assert not [n for n in names if n.split("/")[0] in ("tracking", "entrypoints", "tests")]
    with tarfile.open(sdist) as t:
        top = f"scarcelab-{scarcelab.__version__}"
        members = set(t.getnames())
        pkg_info = t.extractfile(f"{top}/PKG-INFO")
        assert pkg_info is not None
        sm = _metadata(pkg_info.read())
    assert str(sm.version) == scarcelab.__version__  # type: ignore[attr-defined]
    for must in ("setup.py", "pyproject.toml", "scarcelab/tracking/stack.py",
                 "scarcelab/entrypoints/cli.py"):
        assert f"{top}/{must}" in members, must
    assert email.message_from_bytes(meta)["Name"] == "scarcelab"


@pytest.mark.e2e
def test_the_wheel_installed_in_a_fresh_venv_runs_help_list_and_a_study(
        dist: Path, tmp_path: Path) -> None:
    (whl,) = dist.glob("scarcelab-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    # this venv's third-party packages, after the fresh venv's own (module docstring); a
    # path line is not a site dir, so the checkout's editable-install hook stays inert
    (site / "zz_borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--no-deps", "--no-index", str(whl)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    work = tmp_path / "work"  # outside the checkout: nothing can come from REPO
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PYTHON"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               MLFLOW_TRACKING_URI=f"sqlite:///{work}/mlflow.db",
               SCARCELAB_CACHE=str(work / "cache"))

    def run(*args: str, timeout: int = 120) -> str:
        r = subprocess.run([str(venv / "bin" / "scarcelab"), *args], cwd=work, env=env,
                           capture_output=True, text=True, timeout=timeout)
        said = r.stdout[-3000:] + r.stderr[-3000:]
        assert r.returncode == 0, f"scarcelab {' '.join(args)}:\n{said}"
        return r.stdout + r.stderr

    where = subprocess.run([str(py), "-c", "import scarcelab.tracking.stack as s, scarcelab; "
                            "print(scarcelab.__file__); print(s.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout.split()
    assert all(w.startswith(str(site)) for w in where), where  # the wheel's, not the checkout's
    assert "supervised" in run("--help") and "semi" in run("--help")
    assert "folder:PATH" in run("list", "datasets")
    out = run(*STUDY, timeout=600)
    assert "best val balanced accuracy" in out, out
