"""Helpers for scripts/setup: the project's pins and the environment `mlflow run` uses.

Subcommands (run with the project's venv python):

  build-deps  DIR          print python_env.yaml's build_dependencies, one per line
                           (standard library only: runs before anything is installed)
  check-pins  DIR          fail unless every pyproject.toml range has a pin in
                           requirements*.txt (the lock) that satisfies it, and vice versa
  env-dir     DIR          print the virtualenv path `mlflow run` would use for DIR
  link        DIR VENV     point that path at VENV (a symlink), so `mlflow run` skips
                           building its own environment

How `mlflow run` (MLflow 3.17.2, local backend, mlflow/projects/backend/local.py) picks the
environment when no --env-manager is given: MLproject declares `python_env`, so the env
manager is virtualenv; the env directory is

    Path(MLFLOW_ENV_ROOT.get()) / _get_virtualenv_name(_PythonEnv.from_yaml(yaml), work_dir)

where MLFLOW_ENV_ROOT defaults to ~/.mlflow/envs and the name is
"mlflow-" + sha1(str(python_env.to_dict()) + "".join(sorted(expanded requirements))).
`-r requirements.txt` is expanded to its requirement lines, so the name does not depend on
the project's folder (unless a requirement line itself names a path). `_create_virtualenv`
returns at once when that directory exists, following symlinks. These are private MLflow
APIs: mlflow is pinned, and a changed API only costs speed (MLflow builds its own env).
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path

PINNED_MLFLOW = "3.17.2"


def _say(msg: str) -> None:
    print(f"[mlflow-env] {msg}", flush=True)


# --------------------------------------------------------------------------- build-deps


def build_deps(project_dir: Path) -> list[str]:
    """The `build_dependencies:` list of python_env.yaml, parsed without PyYAML."""
    deps: list[str] = []
    inside = False
    for raw in (project_dir / "python_env.yaml").read_text().splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        if not line or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            inside = line.startswith("build_dependencies:")
            continue
        item = line.strip()
        if inside and item.startswith("- "):
            deps.append(item[2:].strip().strip("\"'"))
    return deps


# --------------------------------------------------------------------------- check-pins


def _name(req: str) -> str:
    """Distribution name, normalised (PEP 503), extras dropped: ``moto[server]`` -> moto."""
    m = re.match(r"\s*([A-Za-z0-9_.-]+)", req)
    return re.sub(r"[-_.]+", "-", m.group(1)).lower() if m else req


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:4])


def _satisfies(version: str, spec: str) -> bool:
    """``version`` against a range such as ``>=2.4,<3`` (the forms pyproject.toml uses:
    ==, !=, >=, <=, >, <, ~=); stdlib only, so it runs before anything is installed."""
    v = _version(version)
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = re.match(r"(==|!=|>=|<=|~=|>|<)\s*([\w.*+]+)", part)
        if not m:
            raise ValueError(f"cannot read the version range {part!r}")
        op, w = m.group(1), _version(m.group(2))
        n = max(len(v), len(w))
        vv, ww = v + (0,) * (n - len(v)), w + (0,) * (n - len(w))
        ok = {"==": vv == ww, "!=": vv != ww, ">=": vv >= ww, "<=": vv <= ww, ">": vv > ww,
              "<": vv < ww,
              "~=": vv >= ww and vv[:len(w) - 1] == ww[:len(w) - 1]}[op]
        if not ok:
            return False
    return True


def _pins(path: Path, seen: set[Path] | None = None) -> dict[str, str]:
    """name -> pinned version of a requirements file, following ``-r`` includes."""
    seen = seen or set()
    seen.add(path.resolve())
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("-r "):
            inc = (path.parent / line[3:].strip()).resolve()
            if inc not in seen:
                out.update(_pins(inc, seen))
        elif line and not line.startswith("-"):
            name, _, ver = line.partition("==")
            out[_name(name)] = ver.strip()
    return out


def check_pins(project_dir: Path) -> int:
    """pyproject.toml holds compatible ranges (what `pip install scarcelab` asks of a
    user's environment); requirements.txt (runtime + stack) and requirements-dev.txt (+ dev)
    are the lock CI, scripts/setup and `mlflow run` install. Every declared package must be
    pinned in the lock within its range, and every pin must be declared."""
    meta = tomllib.loads((project_dir / "pyproject.toml").read_text())["project"]
    extras = meta.get("optional-dependencies", {})
    groups = [("requirements.txt", ["dependencies"] + [f"[{k}]" for k in extras if k != "dev"],
               meta.get("dependencies", []) + [r for k, rs in extras.items() if k != "dev"
                                                for r in rs]),
              ("requirements-dev.txt", ["[dev]"], extras.get("dev", []))]
    bad = 0
    lock_all = _pins(project_dir / "requirements-dev.txt")
    declared_all: set[str] = set()
    for fname, where, reqs in groups:
        lock = _pins(project_dir / fname)
        for req in reqs:
            name = _name(req)
            declared_all.add(name)
            spec = re.sub(r"^\s*[A-Za-z0-9_.-]+(\[[^\]]*\])?", "", req).split(";")[0].strip()
            if name not in lock:
                bad += 1
                _say(f"{req!r} ({'/'.join(where)} in pyproject.toml) has no pin in {fname}")
            elif spec and not _satisfies(lock[name], spec):
                bad += 1
                _say(f"{fname} pins {name}=={lock[name]}, outside pyproject.toml's {spec!r}")
    for name in sorted(set(lock_all) - declared_all):
        bad += 1
        _say(f"{name}=={lock_all[name]} is pinned but not declared in pyproject.toml")
    if bad:
        _say("fix: declare each package in pyproject.toml (a range) and pin it in "
             "requirements.txt (runtime/stack) or requirements-dev.txt (dev)")
        return 1
    return 0


# --------------------------------------------------------------------------- env-dir / link


def mlflow_env_dir(project_dir: Path) -> Path:
    """The directory `mlflow run <project_dir>` would use (same calls as the local backend)."""
    import mlflow
    from mlflow.projects import env_type
    from mlflow.projects._project_spec import load_project
    from mlflow.utils.environment import _PythonEnv
    from mlflow.utils.virtualenv import _get_mlflow_virtualenv_root, _get_virtualenv_name

    if mlflow.__version__ != PINNED_MLFLOW:
        _say(
            f"warning: mlflow {mlflow.__version__} installed, this helper was checked "
            f"against {PINNED_MLFLOW}; the env name may not match what `mlflow run` uses"
        )
    work_dir = Path(os.path.abspath(project_dir))
    project = load_project(str(work_dir))
    if project.env_type != env_type.PYTHON or not project.env_config_path:
        raise SystemExit(
            f"{work_dir}/MLproject must declare `python_env: python_env.yaml` "
            f"(found env type {project.env_type!r}, file {project.env_config_path!r})"
        )
    python_env = _PythonEnv.from_yaml(project.env_config_path)
    name = _get_virtualenv_name(python_env, work_dir)
    return Path(_get_mlflow_virtualenv_root()) / name


def _check_venv_matches(project_dir: Path, venv: Path) -> None:
    """Warn where the venv differs from what python_env.yaml asks for (cheap checks only)."""
    from importlib.metadata import PackageNotFoundError, version

    from mlflow.utils.environment import _PythonEnv

    py_env = _PythonEnv.from_yaml(str(project_dir / "python_env.yaml"))
    cfg = (venv / "pyvenv.cfg").read_text() if (venv / "pyvenv.cfg").exists() else ""
    m = re.search(r"^version(?:_info)?\s*=\s*(\S+)", cfg, re.M)
    if m and py_env.python and m.group(1) != str(py_env.python):
        _say(f"warning: {venv} has Python {m.group(1)}, python_env.yaml asks {py_env.python}")
    if Path(sys.prefix).resolve() != venv.resolve():
        return  # only the venv's own interpreter can read its package versions cheaply
    for dep in py_env.build_dependencies or []:
        name, sep, want = dep.partition("==")
        if not sep:
            continue
        try:
            have = version(name.strip())
        except PackageNotFoundError:
            have = None
        if have != want.strip():
            _say(f"warning: {venv} has {name.strip()} {have}, python_env.yaml pins {want}")


# scripts/setup writes this file into .venv once every install step has succeeded.
SETUP_STAMP = ".scarcelab-setup.sha256"


def _usable_venv(path: Path) -> bool:
    return all((path / rel).exists() for rel in ("bin/activate", "bin/python", SETUP_STAMP))


def link(project_dir: Path, venv: Path) -> int:
    venv = Path(os.path.abspath(venv))
    if not (venv / "bin" / "activate").is_file():
        _say(f"error: {venv}/bin/activate not found; `mlflow run` sources it")
        return 1
    env_dir = mlflow_env_dir(project_dir)
    if not env_dir.is_absolute():
        _say(
            f"warning: MLFLOW_ENV_ROOT is relative ({env_dir.parent}); `mlflow run` resolves "
            "it against its own working directory, so the link only helps from here"
        )
    _check_venv_matches(project_dir, venv)
    _say(f"mlflow run env for this project: {env_dir}")

    if env_dir.is_symlink():
        current = os.readlink(env_dir)
        if os.path.realpath(env_dir) == os.path.realpath(venv):
            _say(f"already linked -> {venv}")
            return 0
        if _usable_venv(env_dir) and not os.environ.get("SCARCELAB_RELINK"):
            # Another checkout's finished venv: same env name = same python_env.yaml and the
            # same requirement lines, so it serves this project as well. Taking it over would
            # leave a dangling link once that checkout (e.g. CI's fresh clone) is deleted, and
            # `mlflow run` fails on a dangling link (venv creation: "File exists").
            _say(
                f"kept: {env_dir} -> {current} (another checkout's venv with the same "
                "requirements); set SCARCELAB_RELINK=1 to point it at this one"
            )
            return 0
        if not env_dir.exists():
            state = "dangling"
        elif _usable_venv(env_dir):
            state = "SCARCELAB_RELINK set"
        else:
            state = "not a finished scarcelab venv"
        _say(f"replacing link ({state}: -> {current})")
    elif env_dir.exists():
        _say(
            f"left alone: {env_dir} is a real directory (an env MLflow built itself); "
            f"`mlflow run` will use it. Remove it and re-run scripts/setup to use {venv}"
        )
        return 0

    env_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = env_dir.with_name(f".{env_dir.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(venv, target_is_directory=True)
    os.replace(tmp, env_dir)  # atomic: a concurrent `mlflow run` sees old or new, never none
    _say(f"linked {env_dir} -> {venv}")
    return 0


# --------------------------------------------------------------------------- main


def main(argv: list[str]) -> int:
    usage = "usage: mlflow_env.py {build-deps|check-pins|env-dir} DIR | link DIR VENV"
    if len(argv) < 2:
        print(usage, file=sys.stderr)
        return 2
    cmd, project_dir = argv[0], Path(argv[1])
    if cmd == "build-deps" and len(argv) == 2:
        print("\n".join(build_deps(project_dir)))
        return 0
    if cmd == "check-pins" and len(argv) == 2:
        return check_pins(project_dir)
    if cmd == "env-dir" and len(argv) == 2:
        print(mlflow_env_dir(project_dir))
        return 0
    if cmd == "link" and len(argv) == 3:
        return link(project_dir, Path(argv[2]))
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
