"""The architecture figures of a revision: long functions, spelled-out tag strings, repeats.

Why: a refactor that promises "no protocol function over ~60 lines", "tags declared once"
and "shared mechanics exist once" should be judged by numbers measured the same way before
and after, not by reading the diff. This prints, over ``scarcelab/`` and ``tracking/``
(``--dirs``):

* ``functions_over_80``: functions (methods and nested functions included, each counted on
  its own) longer than 80 lines, from the ``def`` line (decorators not counted) to the last
  line of the body, as ``ast`` gives them (``lineno``..``end_lineno``); then one
  ``long_function=PATH::QUALNAME:LINES`` line each, longest first;
* ``longest_function`` / ``longest_function_lines``;
* ``scarcelab_literals``: distinct string literals whose whole value is ``scarcelab.<name>``
  (a tag, an experiment key...) outside ``scarcelab/tags.py``, and ``..._occurrences``
  their total count; dotted paths that name a module of the measured tree
  (``"scarcelab.methods.semi"``, an import path, not a tag; any ``scarcelab.tracking.*`` or
  ``scarcelab.entrypoints.*``) are counted apart as
  ``module_path_literals``. Only complete literals count: an f-string's fixed part
  (``f"scarcelab.{key}"``) is not one;
* ``duplicate_pairs``: the pair count of the ``duplicates`` tool (pairs of places sharing
  six or more lines of the same shape) over the same directories, or ``unavailable``.

``--rev REV`` measures a git revision (``git archive`` into a temporary folder, so the
checkout is not touched) as "before" beside the working tree as "after" (or ``--after
REV``); without ``--rev`` only the working tree is measured. The tracked and untracked
(not ignored) files of the working tree are what is measured, as the tool sees them.

    nice -n 10 /work/main/.venv/bin/python bench/architecture.py --rev 0fee5f2

The last line is a ``key=value`` summary (DESIGN §5), ``before->after`` where both exist.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIRS = ("scarcelab", "tracking")
LONG = 80
TAGS_FILE = "scarcelab/tags.py"
LITERAL = re.compile(r"scarcelab\.[A-Za-z0-9_.]+")
#: the repository folders installed under the ``scarcelab`` package (setup.py maps them)
MAPPED = {"tracking": "scarcelab.tracking", "entrypoints": "scarcelab.entrypoints"}


@dataclass
class Figures:
    """What one tree measures; ``functions`` holds ``(PATH::QUALNAME, lines)``."""

    functions: list[tuple[str, int]] = field(default_factory=list)
    literals: Counter[str] = field(default_factory=Counter)
    module_paths: Counter[str] = field(default_factory=Counter)
    duplicate_pairs: int | None = None

    def long(self, limit: int = LONG) -> list[tuple[str, int]]:
        return sorted((f for f in self.functions if f[1] > limit), key=lambda f: (-f[1], f[0]))

    def longest(self) -> tuple[str, int]:
        return max(self.functions, key=lambda f: (f[1], f[0]), default=("-", 0))


def _py_files(root: Path, dirs: tuple[str, ...]) -> list[Path]:
    return sorted(p for d in dirs if (root / d).is_dir() for p in (root / d).rglob("*.py"))


def function_lengths(root: Path, dirs: tuple[str, ...] = DIRS) -> list[tuple[str, int]]:
    """Every function and method below ``dirs``, as ``(path::Outer.inner, lines)``."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str, rel: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                out.append((f"{rel}::{name}", child.end_lineno - child.lineno + 1))
                visit(child, name + ".", rel)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", rel)
            else:
                visit(child, prefix, rel)

    for path in _py_files(root, dirs):
        rel = path.relative_to(root).as_posix()
        visit(ast.parse(path.read_text(encoding="utf-8"), rel), "", rel)
    return out


def module_names(root: Path, dirs: tuple[str, ...] = DIRS) -> set[str]:
    """The dotted import paths of the tree's modules and packages, as installed."""
    names: set[str] = set()
    for path in _py_files(root, dirs):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts and parts[0] in MAPPED:
            parts = [*MAPPED[parts[0]].split("."), *parts[1:]]
        names.add(".".join(parts))
    return names


def is_module_path(value: str, modules: set[str]) -> bool:
    """A module of the measured tree, or any path inside a folder setup.py installs under
    ``scarcelab`` (``"scarcelab.entrypoints.cli"`` when ``entrypoints/`` is not measured)."""
    return value in modules or value in MAPPED.values() or value.startswith(
        tuple(f"{m}." for m in MAPPED.values()))


def scarcelab_literals(root: Path, dirs: tuple[str, ...] = DIRS
                       ) -> tuple[Counter[str], Counter[str]]:
    """``("scarcelab.*" literals that are not module paths, module-path literals)``, each
    value with its number of occurrences, outside :data:`TAGS_FILE`."""
    modules = module_names(root, dirs)
    tags: Counter[str] = Counter()
    paths: Counter[str] = Counter()
    for path in _py_files(root, dirs):
        rel = path.relative_to(root).as_posix()
        if rel == TAGS_FILE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), rel)
        fixed_parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)
                       for v in n.values}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in fixed_parts and LITERAL.fullmatch(node.value)):
                (paths if is_module_path(node.value, modules) else tags)[node.value] += 1
    return tags, paths


def parse_duplicates(text: str) -> int:
    """The pair count from the first line of ``duplicates`` output ("30 pairs of places
    (...)", or "no duplicates (...)" for none)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    if first.startswith("no duplicates"):
        return 0
    m = re.match(r"(\d+) pairs? of places", first)
    if not m:
        raise ValueError(f"duplicates: unexpected first line {first!r}")
    return int(m.group(1))


def duplicate_pairs(root: Path, seconds: int = 300) -> int | None:
    """The ``duplicates`` tool's pair count over ``root`` (None: the tool is not installed).
    ``root`` holds only the measured folders, so the count is over them alone."""
    tool = shutil.which("duplicates")
    if tool is None:
        return None
    res = subprocess.run([tool, "--repo", str(root), "--most", "1", "--seconds",
                          str(seconds)], capture_output=True, text=True, check=False)
    if "incomplete:" in res.stdout:
        print(f"warning: duplicates did not finish: {res.stdout.strip().splitlines()[-1]}",
              file=sys.stderr)
    return parse_duplicates(res.stdout)


def measure(root: Path, dirs: tuple[str, ...] = DIRS, duplicates: bool = True) -> Figures:
    tags, paths = scarcelab_literals(root, dirs)
    return Figures(function_lengths(root, dirs), tags, paths,
                   duplicate_pairs(root) if duplicates else None)


def materialise(rev: str | None, dirs: tuple[str, ...], dest: Path) -> Path:
    """Copy ``dirs`` of revision ``rev`` (None: the working tree, tracked and untracked
    files git does not ignore) into ``dest``; the checkout itself is left alone."""
    if rev is not None:
        with tempfile.TemporaryFile() as tar:
            subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, *dirs],
                           stdout=tar, check=True)
            tar.seek(0)
            with tarfile.open(fileobj=tar) as tf:
                tf.extractall(dest, filter="data")
        return dest
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard",
                             "-z", "--", *dirs], capture_output=True, check=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def report(label: str, f: Figures) -> dict[str, str]:
    """Print ``label.key=value`` lines; return the summary values."""
    long = f.long()
    name, lines = f.longest()
    values = {
        "functions_over_80": str(len(long)),
        "longest_function": name,
        "longest_function_lines": str(lines),
        "scarcelab_literals": str(len(f.literals)),
        "scarcelab_literal_occurrences": str(sum(f.literals.values())),
        "module_path_literals": str(len(f.module_paths)),
        "duplicate_pairs": "unavailable" if f.duplicate_pairs is None else str(
            f.duplicate_pairs),
    }
    for key, value in values.items():
        print(f"{label}.{key}={value}")
    for fn, n in long:
        print(f"{label}.long_function={fn}:{n}")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", help="the 'before' git revision (default: measure only 'after')")
    ap.add_argument("--after", help="the 'after' revision (default: the working tree)")
    ap.add_argument("--dirs", default=",".join(DIRS), help="comma-separated folders")
    ap.add_argument("--no-duplicates", action="store_true", help="skip the duplicates tool")
    args = ap.parse_args(argv)
    dirs = tuple(d for d in args.dirs.split(",") if d)
    sides = ([("before", args.rev)] if args.rev else []) + [("after", args.after)]
    summary: dict[str, list[str]] = {}
    for label, rev in sides:
        with tempfile.TemporaryDirectory(prefix=f"arch-{label}-") as tmp:
            root = materialise(rev, dirs, Path(tmp))
            print(f"{label}.rev={rev or 'working tree'}")
            for key, value in report(label, measure(root, dirs, not args.no_duplicates)).items():
                summary.setdefault(key, []).append(value)
    print(" ".join(f"{k}={'->'.join(v)}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
