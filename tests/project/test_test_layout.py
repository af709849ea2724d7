"""The tests mirror the product code, and the paths that cite them exist (issue 44 item 7).

Why: 166 test files in one flat folder made "where are the tests of scarcelab/active?" a
grep. tests/README.md states the mirror: ``tests/core/<sub>/`` tests ``scarcelab/<sub>/``,
``tests/tracking/<sub>/`` tests ``tracking/<sub>/``, ``tests/entrypoints/`` and
``tests/bench/`` their folders, ``tests/project/`` the checks that span the repository.
These checks keep it so: a new ``tests/test_*.py`` at the root, a mirror folder whose
product package was renamed or removed, a second test file with a basename already used
(pytest's default ``prepend`` import mode imports test files by basename: a duplicate is
an "import file mismatch"), and a doc or comment citing a test path that does not exist
each fail with the file to move or fix.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: mirror root under tests/ -> the product folder it mirrors
MIRRORS = {"core": "scarcelab", "tracking": "tracking", "entrypoints": "entrypoints",
           "bench": "bench"}
#: folders under tests/ that mirror nothing, and why
NOT_MIRRORS = {
    "project": "checks that span the repository (layers, tags, docs, packaging)",
    "e2e": "end-to-end tests through real MLflow processes; scripts/test runs them apart",
    "data": "small committed inputs the tests read",
    "reference": "recorded reference values the tests compare against",
}
#: files cited by path that are gone on purpose: docs/mutation.md's history says where
#: the kills first written in them live now
HISTORICAL = re.compile(r"tests/test_mutation_kills_\w*\.py")
#: files docs/extending.md asks a newcomer to write: absent here, but cited in the folder
#: that mirrors the code they test, so that folder must exist
EXAMPLES = {"test_entmin.py", "test_ratio.py", "test_bars.py", "test_xor_al.py",
            "test_study_counts.py", "test_NAME.py"}
#: a test file cited by its path from the repository root
CITED = re.compile(r"\btests/(?:[\w.-]+/)*test_\w+\.py")
SCANNED = ("*.md", "*.py", "*.yaml", "*.yml", "*.toml", "*.sh", "*.txt", "*.cfg", "*.ini",
           "*Dockerfile", "MLproject")
SKIPPED = {".venv", "build", ".git", "mlruns", ".scarcelab", "node_modules", "mutants",
           # written by pip install -e (SOURCES.txt lists the files as they were then)
           "scarcelab.egg-info"}


def stray_root_tests(tests: Path) -> list[str]:
    """Test files at tests/'s root, outside the mirror."""
    return sorted(p.name for p in tests.glob("test_*.py"))


def stale_folders(tests: Path, repo: Path) -> list[str]:
    """Folders under tests/ (outside :data:`NOT_MIRRORS`) whose product folder is absent."""
    bad = []
    for d in sorted(p for p in tests.rglob("*") if p.is_dir()):
        rel = d.relative_to(tests).parts
        if "__pycache__" in rel or rel[0] in NOT_MIRRORS:
            continue
        if rel[0] not in MIRRORS or not (repo / MIRRORS[rel[0]] / Path(*rel[1:])).is_dir():
            bad.append(d.relative_to(tests).as_posix())
    return bad


def duplicate_basenames(tests: Path) -> list[str]:
    """Test file names used twice under tests/ (the import mode needs them unique)."""
    seen: dict[str, list[str]] = {}
    for p in tests.rglob("test_*.py"):
        if "__pycache__" not in p.parts:
            seen.setdefault(p.name, []).append(p.relative_to(tests).as_posix())
    return sorted(f"{n}: {sorted(ps)}" for n, ps in seen.items() if len(ps) > 1)


def _text_files(repo: Path) -> list[Path]:
    out = set()
    for pattern in SCANNED:
        for p in repo.rglob(pattern):
            if p.is_file() and not SKIPPED & set(p.relative_to(repo).parts):
                out.add(p)
    return sorted(out)


def _cited_ok(repo: Path, cited: str) -> bool:
    path = repo / cited
    if path.is_file() or HISTORICAL.fullmatch(cited):
        return True
    return path.name in EXAMPLES and path.parent != repo / "tests" and path.parent.is_dir()


def dangling_citations(repo: Path, skip: Path | None = None) -> list[str]:
    """``file:line: tests/...test_x.py`` for each cited test path that does not exist
    (``skip``: a file not to scan, this one, whose made-up layouts cite made-up paths)."""
    bad = []
    for f in _text_files(repo):
        if f == skip:
            continue
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            bad += [f"{f.relative_to(repo)}:{n}: {m.group()}" for m in CITED.finditer(line)
                    if not _cited_ok(repo, m.group())]
    return bad


def test_no_test_file_at_the_tests_root() -> None:
    stray = stray_root_tests(REPO / "tests")
    assert not stray, ("move each into the folder mirroring the code it tests "
                       f"(tests/README.md): {stray}")


def test_every_mirror_folder_names_a_product_package() -> None:
    stale = stale_folders(REPO / "tests", REPO)
    assert not stale, ("these tests/ folders mirror no product folder (renamed or removed?); "
                       f"move their tests or add the folder to NOT_MIRRORS: {stale}")


def test_test_file_basenames_are_unique() -> None:
    dups = duplicate_basenames(REPO / "tests")
    assert not dups, f"rename one of each (pytest imports test files by basename): {dups}"


def test_every_cited_test_path_exists() -> None:
    bad = dangling_citations(REPO, skip=Path(__file__).resolve())
    assert not bad, "cite the test at its path under the mirror:\n" + "\n".join(bad)


def test_the_checks_find_what_they_must(tmp_path: Path) -> None:
    """Each check on a made-up repository: a stray root test, a stale and an unknown
    folder, a duplicate basename and a dangling citation are each reported; the
    well-placed files are not."""
    repo = tmp_path
    (repo / "scarcelab" / "active").mkdir(parents=True)
    tests = repo / "tests"
    for d in ("core/active", "core/gone", "misc", "project", "data/x"):
        (tests / d).mkdir(parents=True)
    for f in ("test_stray.py", "core/active/test_loop.py", "core/gone/test_loop.py",
              "project/test_layers.py"):
        (tests / f).write_text("")
    (repo / "README.md").write_text(
        "see tests/core/active/test_loop.py and tests/test_stray_gone.py;\n"
        "history: tests/test_mutation_kills_active.py\n"
        "write tests/core/active/test_ratio.py, not tests/test_ratio.py\n")
    assert stray_root_tests(tests) == ["test_stray.py"]
    assert stale_folders(tests, repo) == ["core/gone", "misc"]
    assert duplicate_basenames(tests) == [
        "test_loop.py: ['core/active/test_loop.py', 'core/gone/test_loop.py']"]
    assert dangling_citations(repo) == ["README.md:1: tests/test_stray_gone.py",
                                        "README.md:3: tests/test_ratio.py"]
