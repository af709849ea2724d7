"""Every ``SCARCELAB_*`` variable the documentation names is read by live code (issue 42:
docs/threat-model.md promised that ``SCARCELAB_TRUST_PICKLED_MODELS=1`` unlocks pickle
loading, and the only reader of it was a function nothing called). A name counts as read
when it appears in a shell script or in Python code that is reachable: at module level, or
inside a function whose name is used somewhere else; in tests, where it is read from the
environment."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bSCARCELAB_[A-Z0-9_]+\b")
CODE_DIRS = ("scarcelab", "tracking", "entrypoints", "bench", "scripts", "docker", "tests")


def _code_files() -> list[Path]:
    out: list[Path] = []
    for d in CODE_DIRS:
        out += [p for p in (REPO / d).rglob("*") if p.is_file() and p.suffix not in
                {".md", ".json", ".pyc", ".png", ".npz"} and "__pycache__" not in p.parts]
    return out


def _reads_in_tests(tree: ast.AST) -> set[str]:
    """In tests a name counts only where it is read (``os.environ.get(N)``, ``getenv(N)``,
    ``environ[N]``): a test that sets or deletes a variable proves nobody reads it."""
    out: set[str] = set()
    for node in ast.walk(tree):
        arg: ast.AST | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in {"get", "getenv"} and node.args:
            arg = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            arg = node.slice
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out |= set(NAME.findall(arg.value))
    return out


def _live_names(files: list[Path]) -> set[str]:
    """Variable names read by reachable code (see the module's docstring)."""
    texts = {p: p.read_text(errors="replace") for p in files}
    uses = Counter(re.findall(r"\w+", "\n".join(texts.values())))
    live: set[str] = set()
    for p, text in texts.items():
        if p.suffix != ".py":
            live |= set(NAME.findall(text))
            continue
        tree = ast.parse(text)
        if p.relative_to(REPO).parts[0] == "tests":
            live |= _reads_in_tests(tree)
            continue
        owner: dict[int, str] = {}  # id of a node -> its outermost enclosing function
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    owner.setdefault(id(node), fn.name)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            names = set(NAME.findall(node.value))
            fn = owner.get(id(node))
            # module level, or a function used beyond its own definition (a call, a
            # reference, a registration)
            if names and (fn is None or uses[fn] > 1):
                live |= names
    return live


def test_every_variable_the_docs_name_is_read_by_live_code() -> None:
    docs = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]
    named: dict[str, str] = {}
    for d in docs:
        for v in NAME.findall(d.read_text()):
            named.setdefault(v, str(d.relative_to(REPO)))
    assert "SCARCELAB_DATA" in named  # the scan sees the docs at all
    live = _live_names(_code_files())
    assert "SCARCELAB_DATA" in live  # and the code
    dead = {v: where for v, where in named.items() if v not in live}
    assert not dead, f"documented but read by no live code: {dead}"
