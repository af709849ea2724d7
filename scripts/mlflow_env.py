"""Helpers for scripts/setup: the project's pins, and the cleanup of what older setups did.

Subcommands (run with the project's venv python; standard library only):

  build-deps    DIR        print python_env.yaml's build_dependencies, one per line
                           (runs before anything is installed)
  check-pins    DIR        fail unless every pyproject.toml range has a pin in
                           requirements*.txt (the lock) that satisfies it, and vice versa
  legacy-links  DIR VENV   remove the links an older scripts/setup made from MLflow's env
                           folder to VENV (this checkout's), and name those that point at
                           another checkout's venv without touching them

How `mlflow run` uses this checkout's .venv: with MLflow's documented local env manager,
`mlflow run . -e semi -P method=fixmatch --env-manager local` from the activated venv (the
entry point's command runs with the current environment, in this checkout). Without the flag
MLflow builds its own virtualenv from python_env.yaml under $MLFLOW_ENV_ROOT (slow the first
time, then reused; the command still runs this checkout's code).

Earlier versions linked that MLflow-built env's folder ($MLFLOW_ENV_ROOT/mlflow-<hash>) to
.venv, computing <hash> with MLflow's private `_get_virtualenv_name`. The hash depends on
python_env.yaml and the requirement lines only, not on the checkout, so every clone on a
machine shared one link and a second clone's `mlflow run` ran in the first clone's venv
(issue 27 item 6). Nothing here writes outside this checkout any more, except removing a
link that points into it.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path


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
            if name == _name(meta["name"]):
                continue  # an extra made of other extras (`all`), pinned through those
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


# --------------------------------------------------------------------------- legacy-links

# scripts/setup writes this file into .venv once every install step has succeeded.
SETUP_STAMP = ".scarcelab-setup.sha256"


def mlflow_env_root() -> Path:
    """Where `mlflow run` keeps the virtualenvs it builds: MLflow's documented
    ``MLFLOW_ENV_ROOT`` (mlflow.environment_variables), default ``~/.mlflow/envs``."""
    return Path(os.environ.get("MLFLOW_ENV_ROOT") or Path.home() / ".mlflow" / "envs")


def _scarcelab_venv(path: Path) -> bool:
    return (path / SETUP_STAMP).exists() or path.name == ".venv"


def legacy_links(project_dir: Path, venv: Path) -> int:
    """Links ``mlflow-*`` -> a scarcelab ``.venv`` under MLflow's env root, as older setups
    made them: the one(s) into this checkout's ``venv`` are removed (this checkout's own
    doing); one into another checkout is reported and left as it is (never touched)."""
    root = mlflow_env_root()
    if not root.is_dir():
        return 0
    mine = Path(os.path.abspath(venv))
    for entry in sorted(root.glob("mlflow-*")):
        if not entry.is_symlink():
            continue  # a real env MLflow built itself
        target = Path(os.path.abspath(os.path.join(entry.parent, os.readlink(entry))))
        if target == mine or os.path.realpath(entry) == os.path.realpath(mine):
            entry.unlink()
            _say(f"removed {entry} -> {target} (made by an older scripts/setup of this "
                 "checkout); `mlflow run` here: add --env-manager local")
        elif _scarcelab_venv(target) or not target.exists():
            _say(f"note: {entry} -> {target} was made by another checkout's older "
                 "scripts/setup and is left alone; a plain `mlflow run` (without "
                 "--env-manager local) on any checkout would run in that venv: remove the "
                 f"link (rm {entry}) if that checkout is not meant to serve others")
    return 0


# --------------------------------------------------------------------------- main


def main(argv: list[str]) -> int:
    usage = "usage: mlflow_env.py {build-deps|check-pins} DIR | legacy-links DIR VENV"
    if len(argv) < 2:
        print(usage, file=sys.stderr)
        return 2
    cmd, project_dir = argv[0], Path(argv[1])
    if cmd == "build-deps" and len(argv) == 2:
        print("\n".join(build_deps(project_dir)))
        return 0
    if cmd == "check-pins" and len(argv) == 2:
        return check_pins(project_dir)
    if cmd == "legacy-links" and len(argv) == 3:
        return legacy_links(project_dir, Path(argv[2]))
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
