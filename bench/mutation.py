"""Mutation testing of the scientific core with mutmut (pinned in requirements-dev.txt).

Why: a test suite can pass while a formula is wrong; planting small bugs one at a time and
checking that some test fails measures where the suite is blind (issue 12 found 77 % killed
by hand). Not in CI: it runs every relevant test file once per mutant, hours of CPU for the
whole core — run a target at a time.

Each target mutates one package and runs only the test files that exercise it. The run
happens in a temporary copy of the working tree (tracked and untracked, non-ignored files)
whose ``pyproject.toml`` gets a ``[tool.mutmut]`` section, so the repository's own config
is never touched; ``mutants/`` is left in that copy for ``mutmut show <name>``.

    .venv/bin/python bench/mutation.py metrics active --jobs 2
    .venv/bin/python bench/mutation.py query --keep /tmp/mm    # keep the copy, inspect
    (cd /tmp/mm/query && ../../.venv/bin/mutmut show <mutant name>)

Score = (killed + timeout) / (all mutants tested), mutmut's own definition; survivors are
listed with their diff in ``bench/out/mutation_<target>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: target -> (mutated files glob, test files run against each mutant)
TARGETS: dict[str, tuple[list[str], list[str]]] = {
    "metrics": (["scarcelab/metrics/*"],
                ["tests/test_metrics.py", "tests/test_diagnostics.py",
                 "tests/test_fidelity_metrics.py"]),
    "active": (["scarcelab/active/*"],
               ["tests/test_active_loop.py", "tests/test_active_strategies.py",
                "tests/test_active_contract.py", "tests/test_fidelity_al.py"]),
    "methods": (["scarcelab/methods/*"],
                ["tests/test_method_contract.py", "tests/test_semi_losses.py",
                 "tests/test_supervised_methods.py", "tests/test_selfsup_methods.py"]),
    "protocols": (["scarcelab/protocols/*"],
                  ["tests/test_search.py", "tests/test_splits.py", "tests/test_probe.py",
                   "tests/test_contamination.py"]),
    "query": (["tracking/query/*", "tracking/stats.py", "tracking/al.py"],
              ["tests/test_query.py", "tests/test_stats.py", "tests/test_fidelity_stats.py"]),
}


def _copy_tree(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file() and not rel.startswith("mutants/"):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def _config(only_mutate: list[str], tests: list[str], jobs: int) -> str:
    def arr(xs: list[str]) -> str:
        return "[" + ", ".join(json.dumps(x) for x in xs) + "]"

    return ("\n[tool.mutmut]\n"
            'source_paths = ["scarcelab/", "tracking/"]\n'
            f"only_mutate = {arr(only_mutate)}\n"
            f"pytest_add_cli_args_test_selection = {arr(tests)}\n"
            'pytest_add_cli_args = ["-x", "-q", "-p", "no:cacheprovider"]\n'
            'also_copy = ["entrypoints/", "bench/", "conftest.py"]\n')


def run_target(name: str, workdir: Path, jobs: int) -> dict[str, object]:
    only, tests = TARGETS[name]
    wd = workdir / name
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    _copy_tree(wd)
    with (wd / "pyproject.toml").open("a") as f:
        f.write(_config(only, tests, jobs))
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    env = {**os.environ, "PYTHONPATH": str(wd),
           "SCARCELAB_SHARED_DATA": str(REPO.parent / "shared" / "data")}
    t0 = time.time()
    log = wd / "mutmut_run.log"  # progress while it runs: tail -f this file
    with log.open("w") as f:
        proc = subprocess.run([mutmut, "run", "--max-children", str(jobs)], cwd=wd, env=env,
                              stdout=f, stderr=subprocess.STDOUT, text=True)
    elapsed = time.time() - t0
    tail = log.read_text(errors="replace")[-3000:]
    res = subprocess.run([mutmut, "results", "--all", "true"], cwd=wd, env=env,
                         capture_output=True, text=True)
    status: dict[str, str] = {}
    for line in res.stdout.splitlines():
        if ":" in line:
            k, v = line.strip().rsplit(":", 1)
            status[k.strip()] = v.strip()
    counts: dict[str, int] = {}
    for v in status.values():
        counts[v] = counts.get(v, 0) + 1
    tested = sum(n for s, n in counts.items() if s not in ("skipped", "not checked"))
    score = (counts.get("killed", 0) + counts.get("timeout", 0)) / tested if tested else 0.0
    survivors = {}
    for k, v in status.items():
        if v in ("survived", "no tests"):
            show = subprocess.run([mutmut, "show", k], cwd=wd, env=env, capture_output=True,
                                  text=True)
            survivors[k] = {"status": v, "diff": show.stdout}
    out = {"target": name, "mutated": only, "tests": tests, "counts": counts,
           "score": score, "seconds": round(elapsed, 1), "survivors": survivors,
           "mutmut_rc": proc.returncode, "mutmut_tail": tail}
    print(f"{name}: {counts} score {score:.1%} ({elapsed:.0f} s)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="+", choices=sorted(TARGETS))
    ap.add_argument("--jobs", type=int, default=2, help="mutants tested in parallel")
    ap.add_argument("--keep", default="", help="work in this folder and keep it")
    ap.add_argument("--out", default=str(REPO / "bench" / "out"))
    a = ap.parse_args()
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="scarcelab-mutation-"))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    for t in a.targets:
        res = run_target(t, work, a.jobs)
        (Path(a.out) / f"mutation_{t}.json").write_text(json.dumps(res, indent=1))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
