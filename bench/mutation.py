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

A full run is thousands of mutants (hours on two cores), so ``--sample N --seed S`` tests a
simple random sample instead: mutmut generates every mutant of the target (the population)
and collects its test coverage once, then N mutant names are drawn uniformly without
replacement from the sorted population with ``random.Random(S)`` (not stratified per file:
a simple random sample keeps the binomial interval honest) and only those are run
(``mutmut run NAME...``). The score is then an estimate, reported with its Wilson 95 %
interval; the same seed and unchanged source give the same sample.

    .venv/bin/python bench/mutation.py metrics active --sample 80 --seed 12
    # after adding tests: re-test the sample's survivors only, same copy procedure
    .venv/bin/python bench/mutation.py metrics --rerun-survivors
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
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
                ["tests/core/metrics/test_metrics.py", "tests/core/methods/test_diagnostics.py",
                 "tests/core/metrics/test_fidelity_metrics.py",
                 "tests/core/metrics/test_segmentation_metrics.py",
                 "tests/core/data/test_positive_class.py"]),
    "active": (["scarcelab/active/*"],
               ["tests/core/active/test_active_loop.py",
                "tests/core/active/test_active_strategies.py",
                "tests/core/active/test_active_contract.py",
                "tests/core/active/test_fidelity_al.py", "tests/core/active/test_active_images.py",
                "tests/core/active/test_active_skactiveml.py",
                "tests/core/active/test_active_config.py",
                "tests/core/active/test_active_fast_kernels.py",
                "tests/core/active/test_al_repetition_guard.py",
                "tests/core/active/test_al_sweep_guard.py",
                "tests/entrypoints/test_al_entry_guard.py",
                "tests/core/data/test_dataset_contract.py", "tests/core/data/test_data_guards.py",
                "tests/project/test_hparams_exercised.py", "tests/core/test_registry.py",
                "tests/core/test_names.py"]),
    "methods": (["scarcelab/methods/*"],
                ["tests/core/methods/test_method_contract.py",
                 "tests/core/methods/test_semi_losses.py",
                 "tests/core/methods/test_supervised_methods.py",
                 "tests/core/methods/test_selfsup_methods.py",
                 "tests/core/methods/test_semi_steps.py", "tests/core/losses/test_losses.py",
                 "tests/core/losses/test_ssl_losses.py", "tests/core/methods/test_tune_methods.py",
                 "tests/core/test_perf_levers.py", "tests/core/test_train_trial_guard.py",
                 "tests/core/methods/test_class_weights.py", "tests/tracking/test_encoders.py",
                 "tests/core/methods/test_optimizer.py", "tests/core/methods/test_search_space.py",
                 "tests/project/test_hparams_exercised.py",
                 "tests/core/methods/test_hparam_effects.py", "tests/core/test_registry.py",
                 "tests/core/test_names.py", "tests/core/data/test_tune_rrc.py"]),
    "protocols": (["scarcelab/protocols/*"],
                  ["tests/core/protocols/test_search.py", "tests/core/data/test_splits.py",
                   "tests/core/test_probe.py", "tests/core/protocols/test_contamination.py",
                   "tests/core/protocols/test_search_protocol.py",
                   "tests/core/protocols/test_tune_protocol.py",
                   "tests/core/protocols/test_study_store.py",
                   "tests/core/protocols/test_transfer.py", "tests/tracking/test_hparams_from.py",
                   "tests/core/protocols/test_segment.py", "tests/core/test_trial_runner.py",
                   "tests/core/protocols/test_run_study_guard.py",
                   "tests/core/protocols/test_contamination_guard.py",
                   "tests/entrypoints/test_contamination_entry_guard.py",
                   "tests/core/protocols/test_segment_guard.py",
                   "tests/core/protocols/test_segment_study_guard.py",
                   "tests/core/protocols/test_transfer_guard.py",
                   "tests/core/data/test_transfer_data.py",
                   "tests/core/protocols/test_tune_asha.py",
                   "tests/core/protocols/test_tune_guard.py", "tests/tracking/test_tune_resume.py",
                   "tests/core/protocols/test_kang_protocols.py",
                   "tests/core/methods/test_class_weights.py", "tests/core/data/test_cifair.py",
                   "tests/core/data/test_tune_rrc.py"]),
    "query": (["scarcelab/tracking/query/*", "scarcelab/tracking/stats.py",
               "scarcelab/tracking/al.py"],
              ["tests/tracking/query/test_query.py", "tests/tracking/test_stats.py",
               "tests/tracking/query/test_fidelity_stats.py", "tests/tracking/query/test_table3.py",
               "tests/tracking/test_active_tracking.py", "tests/core/protocols/test_transfer.py",
               "tests/core/protocols/test_tune_protocol.py",
               "tests/tracking/query/test_query_keys.py",
               "tests/tracking/query/test_query_view_registry.py",
               "tests/tracking/test_leaderboard_render.py",
               "tests/tracking/results/test_results_al_report.py",
               "tests/tracking/test_run_identity.py"]),
}


#: tests left out of every mutation run, and why (each passes in the normal suite): they
#: SIGKILL a child process that imports the package from mutmut's trampolined copy, and
#: under mutmut's stats collection they failed (2 Dec 2026), which stops the target's run
DESELECT: tuple[str, ...] = (
    "tests/core/protocols/test_contamination.py::test_a_killed_sweep_resumes_its_child_studies",
    "tests/tracking/test_tune_resume.py::test_kill9_in_the_asha_search_and_in_the_final_phase_then_resume",
    "tests/tracking/test_tune_resume.py::test_kill9_in_a_shared_optuna_storage_search_then_resume",
)


#: pytest options of every run of a target's selection (mutmut's, the baseline, --direct)
PYTEST_ARGS = ["-x", "-q", "-p", "no:cacheprovider"]


def _deselect_args() -> list[str]:
    """pytest's ``--deselect`` pair for each of :data:`DESELECT`."""
    return [x for node in DESELECT for x in ("--deselect", node)]


def _tests(name: str) -> list[str]:
    """The target's test files that exist in this checkout (a file listed for a target may
    be absent from an older one)."""
    return [t for t in TARGETS[name][1] if (REPO / t).exists()]


def _pytest(name: str) -> list[str]:
    """The target's whole selection in a fresh interpreter (baseline and --direct)."""
    return [sys.executable, "-m", "pytest", *PYTEST_ARGS, *_deselect_args(), *_tests(name)]


def _copy_tree(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file() and not rel.startswith("mutants/"):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def _nest(wd: Path) -> None:
    """Move the copy's ``tracking/`` and ``entrypoints/`` under ``scarcelab/``, the wheel's
    layout. Why: in a checkout they import as ``scarcelab.tracking`` through the package's
    ``__path__`` extension, so mutmut's trampolines record hits as
    ``scarcelab.tracking.query.views.*`` while it names the mutants from the file path
    (``tracking.query.views.*``); no hit matched a mutant and every ``query`` mutant read
    "no tests" (50/50 on 30 Nov 2026). Nested, path and module name agree, and
    ``scarcelab/__init__`` stops extending ``__path__`` because ``scarcelab/tracking`` exists.
    Only the ``query`` target nests: other targets' tests check that ``scarcelab/`` never
    imports mlflow, which the nested copy would break."""
    for d in ("tracking", "entrypoints"):
        shutil.move(str(wd / d), str(wd / "scarcelab" / d))


def _config(only_mutate: list[str], tests: list[str], jobs: int, nested: bool) -> str:
    def arr(xs: list[str]) -> str:
        return "[" + ", ".join(json.dumps(x) for x in xs) + "]"

    sources = '["scarcelab/"]' if nested else '["scarcelab/", "tracking/"]'
    # MLproject (with the python_env.yaml it names) and suites/: tests load the project's
    # entry points (views, sweeps, `mlflow run` argv) from them
    project = '"MLproject", "python_env.yaml", "suites/"'
    also = (f'["bench/", "conftest.py", {project}]' if nested
            else f'["entrypoints/", "bench/", "conftest.py", {project}]')
    return ("\n[tool.mutmut]\n"
            f"source_paths = {sources}\n"
            f"only_mutate = {arr(only_mutate)}\n"
            f"pytest_add_cli_args_test_selection = {arr(tests)}\n"
            f"pytest_add_cli_args = {arr(PYTEST_ARGS + _deselect_args())}\n"
            f"also_copy = {also}\n")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for k successes in n draws: unlike the normal approximation it
    stays inside [0, 1] and is usable near 90-100 %, where these scores live."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def _prepare(name: str, workdir: Path, jobs: int) -> tuple[Path, str, dict[str, str]]:
    only, tests = TARGETS[name][0], _tests(name)
    wd = workdir / name
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    _copy_tree(wd)
    # real-data tests and loaders look for ../shared/data beside the checkout (from the file's
    # own location, which mutmut moves to <copy>/mutants/...): the copy gets the same link
    # Two links: mutmut's workers import from <copy>/mutants/ (so ../shared is <copy>/shared),
    # the --direct check from <copy>/ itself (../shared is beside the copy).
    shared = REPO.parent / "shared"
    if shared.exists():
        for link in (wd / "shared", wd.parent / "shared"):
            if not link.exists():
                link.symlink_to(shared.resolve())
    nested = any(p.startswith("scarcelab/tracking/") for p in only)
    if nested:
        _nest(wd)
    with (wd / "pyproject.toml").open("a") as f:
        f.write(_config(only, tests, jobs, nested))
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    env = {**os.environ, "PYTHONPATH": str(wd),
           "SCARCELAB_SHARED_DATA": str(REPO.parent / "shared" / "data")}
    return wd, mutmut, env


def _statuses(wd: Path) -> dict[str, str]:
    """Every mutant's status read from mutmut's own ``mutants/**/*.meta`` files (the same
    exit-code table ``mutmut results`` uses), so unrun mutants show as 'not checked'."""
    from mutmut.stats import status_by_exit_code  # mutmut is a dev dependency

    out: dict[str, str] = {}
    for meta in sorted((wd / "mutants").rglob("*.meta")):
        for k, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            out[k] = status_by_exit_code[code]
    return out


def _summary(name: str, status: dict[str, str], wd: Path, mutmut: str,
             env: dict[str, str]) -> dict[str, object]:
    counts: dict[str, int] = {}
    for v in status.values():
        counts[v] = counts.get(v, 0) + 1
    tested = sum(n for s, n in counts.items() if s not in ("skipped", "not checked"))
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    survivors = {}
    for k, v in sorted(status.items()):
        if v not in ("killed", "timeout", "skipped", "not checked"):
            show = subprocess.run([mutmut, "show", k], cwd=wd, env=env, capture_output=True,
                                  text=True)
            survivors[k] = {"status": v, "diff": show.stdout}
    lo, hi = wilson(killed, tested)
    return {"target": name, "mutated": TARGETS[name][0], "tests": TARGETS[name][1],
            "counts": counts, "tested": tested, "killed_or_timeout": killed,
            "score": killed / tested if tested else 0.0, "wilson95": [lo, hi],
            "survivors": survivors}


def _mutmut_run(wd: Path, mutmut: str, env: dict[str, str], jobs: int,
                names: list[str]) -> tuple[int, str, float]:
    t0 = time.time()
    log = wd / "mutmut_run.log"  # progress while it runs: tail -f this file
    with log.open("a") as f:
        proc = subprocess.run([mutmut, "run", "--max-children", str(jobs), *names], cwd=wd,
                              env=env, stdout=f, stderr=subprocess.STDOUT, text=True)
    return proc.returncode, log.read_text(errors="replace")[-3000:], time.time() - t0


def _population(wd: Path, mutmut: str, env: dict[str, str], jobs: int) -> list[str]:
    """Generate all mutants and collect coverage without testing any: mutmut generates and
    runs its stats before filtering by name, and stops (assertion) when a filter matches
    nothing — the stats it saved are reused by the next ``mutmut run``."""
    rc, tail, _ = _mutmut_run(wd, mutmut, env, jobs, ["__no_such_mutant__"])
    if not (wd / "mutants" / "mutmut-stats.json").exists():
        raise SystemExit(f"mutmut could not generate mutants / collect stats (rc {rc}):\n{tail}")
    return sorted(_statuses(wd))


def _baseline(name: str, wd: Path, env: dict[str, str], timeout: float) -> str:
    """Run the target's test selection on the unmutated copy: '' when it passes, else why.
    Why: a selection that fails in the copy for an unrelated reason (data the copy cannot
    see) would make every direct check read 'killed' (30 Nov 2026: all 8 active survivors,
    equivalent ones included, because the copy's tests did not find ../shared/data)."""
    try:
        p = subprocess.run(_pytest(name), cwd=wd, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return "baseline timed out"
    if p.returncode == 0:
        return ""
    tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
    print(f"{name}: the unmutated copy fails its own tests (rc {p.returncode}):\n"
          + "\n".join(tail), flush=True)
    return f"baseline failed (rc {p.returncode}): {tail[-1] if tail else ''}"


def _direct(name: str, wd: Path, mutmut: str, env: dict[str, str], mutant: str,
            timeout: float) -> str:
    """Apply one mutant to the copy's source itself and run the target's whole test
    selection in a fresh interpreter. Why: mutmut 3 tests a mutant in a worker forked after
    the package was imported, so a mutation in code that runs only at import time (a
    registration decorator, a loader factory called at module level) is never active there
    and reads as 'survived'; a fresh interpreter imports the mutated source."""
    # every source file, not the target's globs: ``scarcelab/methods/*`` does not reach
    # ``methods/semi/*.py``, and a mutant there read as "not applied"
    files = sorted((wd / "scarcelab").rglob("*.py"))
    saved = {f: f.read_bytes() for f in files}
    try:
        subprocess.run([mutmut, "apply", mutant], cwd=wd, env=env, check=True,
                       capture_output=True)
        if all(f.read_bytes() == b for f, b in saved.items()):
            return "not applied"
        try:
            rc = subprocess.run(_pytest(name), cwd=wd, env=env, capture_output=True,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return "timeout"
        return {0: "survived", 1: "killed"}.get(rc, f"pytest rc {rc}")
    finally:
        for f, b in saved.items():
            f.write_bytes(b)


def _changed_lines(diff: str) -> list[str]:
    return [ln.strip() for ln in diff.splitlines()
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


def _remap(wd: Path, mutmut: str, env: dict[str, str], population: list[str],
           diffs: dict[str, str]) -> dict[str, str]:
    """Old name -> today's name of the same mutation. Why: mutmut numbers a function's
    mutants in order, so an edit to a function between a sample and its re-run renumbers
    them and the old name points at another mutant (30 Nov 2026: ``x_significance__mutmut_115``
    after a guard was added to ``significance``). A name whose recorded diff no longer matches
    is looked up among the same function's mutants by its changed lines."""
    def show(n: str) -> list[str]:
        out = subprocess.run([mutmut, "show", n], cwd=wd, env=env, capture_output=True,
                             text=True).stdout
        return _changed_lines(out)

    out: dict[str, str] = {}
    for old, diff in diffs.items():
        want = _changed_lines(diff)
        if not want or (old in population and show(old) == want):
            out[old] = old
            continue
        prefix = old.rsplit("__mutmut_", 1)[0] + "__mutmut_"
        match = next((n for n in population if n.startswith(prefix) and show(n) == want), None)
        if match is None:
            raise SystemExit(f"{old}: its mutation is no longer in the source (changed lines: "
                             f"{want}); it cannot be re-tested")
        print(f"{old} is now {match} (the function changed since the sample)", flush=True)
        out[old] = match
    return out


def run_target(name: str, workdir: Path, jobs: int, sample: int = 0, seed: int = 0,
               only_names: list[str] | None = None, direct: bool = False,
               direct_timeout: float = 900,
               diffs: dict[str, str] | None = None) -> dict[str, object]:
    """Full run (sample 0), a seeded random sample of ``sample`` mutants, or the mutants
    named in ``only_names`` (the re-run of a sample's survivors)."""
    wd, mutmut, env = _prepare(name, workdir, jobs)
    t0 = time.time()
    if sample or only_names:
        population = _population(wd, mutmut, env, jobs)
        renamed: dict[str, str] = {}
        if only_names and diffs:
            renamed = {o: n for o, n in _remap(wd, mutmut, env, population, diffs).items()
                       if o != n}
            only_names = [renamed.get(n, n) for n in only_names]
        if only_names:
            missing = sorted(set(only_names) - set(population))
            if missing:
                raise SystemExit(f"{name}: mutants not in today's population (source changed?):"
                                 f" {missing[:5]}")
            chosen = sorted(only_names)
        else:
            chosen = sorted(random.Random(seed).sample(population, min(sample, len(population))))
        rc, tail, _ = _mutmut_run(wd, mutmut, env, jobs, chosen)
        status = {k: v for k, v in _statuses(wd).items() if k in set(chosen)}
        out = _summary(name, status, wd, mutmut, env)
        out.update({"mode": "rerun" if only_names else "sample", "population": len(population),
                    "sampled": len(chosen), "seed": seed, "sample_names": chosen,
                    "renamed": renamed})
        if direct:  # second opinion on what still survives (see _direct)
            base = _baseline(name, wd, env, direct_timeout)
            if base:  # the unmutated copy must pass, or every "killed" below is meaningless
                d = {k: f"not checked: {base}" for k in sorted(out["survivors"])}  # type: ignore[arg-type]
            else:
                d = {k: _direct(name, wd, mutmut, env, k, direct_timeout)
                     for k in sorted(out["survivors"])}  # type: ignore[arg-type]
            out["direct"] = d
            print(f"{name}: direct check of {len(d)} survivors: {d}", flush=True)
    else:
        rc, tail, _ = _mutmut_run(wd, mutmut, env, jobs, [])
        out = _summary(name, _statuses(wd), wd, mutmut, env)
        out["mode"] = "full"
    out.update({"seconds": round(time.time() - t0, 1), "mutmut_rc": rc, "mutmut_tail": tail})
    lo, hi = out["wilson95"]  # type: ignore[misc]
    print(f"{name} [{out['mode']}]: {out['counts']} score {out['score']:.1%} "
          f"(Wilson 95 % {lo:.1%}-{hi:.1%}; {out['seconds']:.0f} s)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="+", choices=sorted(TARGETS))
    ap.add_argument("--jobs", type=int, default=2, help="mutants tested in parallel")
    ap.add_argument("--keep", default="", help="work in this folder and keep it")
    ap.add_argument("--out", default=str(REPO / "bench" / "out"))
    ap.add_argument("--sample", type=int, default=0,
                    help="test a seeded uniform random sample of N mutants per target (0: all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --sample draw")
    ap.add_argument("--direct", action="store_true",
                    help="with --rerun-survivors: apply each remaining survivor to the source "
                         "and run the whole test selection in a fresh interpreter (catches "
                         "mutants of import-time code that mutmut's forked workers miss)")
    ap.add_argument("--rerun-survivors", action="store_true",
                    help="re-test only the survivors in OUT/mutation_<target>.json (e.g. after "
                         "adding tests); writes OUT/mutation_<target>_rerun.json")
    a = ap.parse_args()
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="scarcelab-mutation-"))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    for t in a.targets:
        if a.rerun_survivors:
            prev = json.loads((Path(a.out) / f"mutation_{t}.json").read_text())
            names = sorted(prev["survivors"])
            if not names:
                print(f"{t}: no survivors to re-run")
                continue
            res = run_target(t, work, a.jobs, only_names=names, direct=a.direct,
                             diffs={k: v.get("diff", "") for k, v in prev["survivors"].items()})
            res["before"] = {k: prev[k] for k in ("population", "sampled", "seed", "counts",
                                                   "score", "wilson95") if k in prev}
            if prev.get("mode") == "sample":  # the sample's score once these are re-tested
                n = prev["tested"]
                k = prev["killed_or_timeout"] + res["killed_or_timeout"]
                k += sum(v in ("killed", "timeout") for v in res.get("direct", {}).values())
                res["after"] = {"sampled": n, "killed_or_timeout": k, "score": k / n,
                                "wilson95": list(wilson(k, n))}
                print(f"{t}: sample score after re-run {k}/{n} = {k / n:.1%}", flush=True)
            (Path(a.out) / f"mutation_{t}_rerun.json").write_text(json.dumps(res, indent=1))
            continue
        try:
            res = run_target(t, work, a.jobs, sample=a.sample, seed=a.seed)
        except SystemExit as e:  # one target's broken test run must not cost the others
            print(f"{t}: FAILED: {e}", flush=True)
            continue
        (Path(a.out) / f"mutation_{t}.json").write_text(json.dumps(res, indent=1))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
