"""MLflow's own tags are spelled by MLflow's constants, and no tag has a second name.

Why (issue 44 §6): ``"mlflow.parentRunId"`` typed by hand is a tag nobody finds when it is
misspelled, and ``SWEEP_TAG = T.SWEEP`` re-exported from a module makes two names for one
tag, so a grep for ``T.SWEEP`` misses half its readers. MLflow exports the names of the tags
it reads (``mlflow.utils.mlflow_tags``); ``tracking/`` and ``entrypoints/`` use those, and
scarcelab's own tags are ``scarcelab/tags.py``'s constants (``tests/core/test_tags.py`` checks
that no product file spells a ``scarcelab.*`` tag). The core (``scarcelab/``) may not
import mlflow, and spells no MLflow tag either: the tracker writes those.

The scan reads the product code with ``ast``, so docstrings, comments and error messages
that *mention* a tag are prose, not spellings. What is not a tag although it starts with
``mlflow.``: a file name joined onto a path (``logs / "mlflow.log"``), an MLflow module or
logger name (``"mlflow.tracking"``, found by ``importlib.util.find_spec``), and the bare
namespace ``"mlflow."`` (a prefix test of user tags, not a key).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

from mlflow.utils import mlflow_tags

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("scarcelab", "tracking", "entrypoints")

#: tag value -> MLflow's constant for it
MLFLOW_CONSTANTS = {v: k for k, v in vars(mlflow_tags).items()
                    if k.isupper() and isinstance(v, str) and v.startswith("mlflow.")}
#: the shape of a tag key under MLflow's namespace (``mlflow.log-model.history`` has a dash)
MLFLOW_KEY = re.compile(r"mlflow\.[A-Za-z][\w-]*(\.[A-Za-z][\w-]*)*")
#: a search filter that spells an MLflow tag: ``tags.`mlflow.parentRunId` = '…'``
MLFLOW_FILTER = re.compile(r"tags\.`?mlflow\.")

#: MLflow tags MLflow exports no constant for: each is spelled once, as a module-level
#: constant of the file named here (the file says where the name comes from)
NO_CONSTANT = {
    # read by MLflow 3's UI only (its JS ``ExperimentKind``); see the module's docstring
    "mlflow.experimentKind": "tracking/experiment_kind.py",
}

#: Left for the change that owns these files (issue 44, the layers helper edits them): use
#: ``mlflow.utils.mlflow_tags`` / ``T.*`` there, then delete the entry. An entry that no
#: longer matches anything fails ``test_pending_entries_still_exist``, so the list shrinks.
PENDING: set[tuple[str, str]] = set()  # (file, literal or name) still to fix: none


TAG_MODULES = (("scarcelab", "tags"), ("mlflow.utils", "mlflow_tags"))


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _docstrings(tree: ast.AST) -> set[ast.AST]:
    """The string constants that are a module's, class's or function's docstring."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(body[0].value)
    return out


def _is_mlflow_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that is no package: not a module path
        return False


def mlflow_tag_literals(source: str, rel: str) -> list[tuple[int, str]]:
    """The string literals of ``source`` (file ``rel``) that spell an MLflow tag."""
    tree = ast.parse(source)
    parents, docs = _parents(tree), _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) \
                or node in docs:
            continue
        s, up = node.value, parents.get(node)
        if MLFLOW_FILTER.search(s):
            found.append((node.lineno, s))
        elif s in MLFLOW_CONSTANTS:
            found.append((node.lineno, s))
        elif MLFLOW_KEY.fullmatch(s):
            if isinstance(up, ast.BinOp) and isinstance(up.op, ast.Div) and up.right is node:
                continue  # a file name joined onto a folder
            if NO_CONSTANT.get(s) == rel and isinstance(up, ast.Assign) \
                    and parents.get(up) is tree:
                continue  # the one definition of a tag MLflow has no constant for
            if _is_mlflow_module(s):
                continue  # a module or logger name
            found.append((node.lineno, s))
    return sorted(found)


def tag_aliases(source: str) -> list[tuple[int, str]]:
    """Names ``source`` binds to a tag constant: ``X = T.ROLE``, ``X = MLFLOW_RUN_NOTE``,
    ``from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE as NOTE``."""
    tree = ast.parse(source)
    modules: set[str] = set()  # names of the tag modules (T)
    constants: set[str] = set()  # constants imported by their own name
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if (node.module, a.name) in TAG_MODULES:
                    modules.add(a.asname or a.name)
                elif node.module in ("scarcelab.tags", "mlflow.utils.mlflow_tags"):
                    if a.asname and a.asname != a.name:
                        found.append((node.lineno, a.asname))
                    constants.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in ("scarcelab.tags", "mlflow.utils.mlflow_tags") and a.asname:
                    modules.add(a.asname)

    def is_tag(v: ast.expr) -> bool:
        return (isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name)
                and v.value.id in modules and v.attr.isupper()) \
            or (isinstance(v, ast.Name) and v.id in constants)

    for node in ast.walk(tree):
        pairs: list[tuple[ast.expr, ast.expr]] = []
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs += list(zip(t.elts, node.value.elts, strict=False))
                else:
                    pairs.append((t, node.value))
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            pairs.append((node.target, node.value))
        found += [(node.lineno, t.id) for t, v in pairs if isinstance(t, ast.Name) and is_tag(v)]
    return sorted(found)


def _scan() -> tuple[list[tuple[str, int, str]], list[tuple[str, int, str]]]:
    literals, aliases = [], []
    files = [p for d in PRODUCT for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 50
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        source = path.read_text()
        literals += [(rel, line, s) for line, s in mlflow_tag_literals(source, rel)]
        aliases += [(rel, line, n) for line, n in tag_aliases(source)]
    return literals, aliases


def test_finder_finds_what_it_must() -> None:
    src = ('"""Module doc may name ``mlflow.parentRunId``."""\n'
           "from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE as NOTE\n"  # 2
           "from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME\n"
           "from scarcelab import tags as T\n"
           'KIND = "mlflow.experimentKind"\n'  # 5: allowed in its file
           'a = {"mlflow.parentRunId": 1}\n'  # 6
           "b = f\"tags.`mlflow.parentRunId` = '{x}'\"\n"  # 7
           'c = "mlflow.someNewTag"\n'  # 8: no constant, not the listed file
           'ok = (logs / "mlflow.log", "mlflow.tracking", "mlflow.", f"mlflow.{k}")\n'
           'e = "the mlflow.parentRunId tag is missing"\n'
           "ROLE = T.ROLE\n"  # 11
           "NAME: str = MLFLOW_RUN_NAME\n"  # 12
           "X, Y = T.CELL, 3\n"  # 13
           "LOST = (T.RECORDS_LOST, T.TRIALS_LOST)\n"
           "def f():\n"
           '    """``mlflow.note.content`` in a docstring."""\n'
           '    return {T.ROLE: "x", MLFLOW_RUN_NAME: "y"}\n')
    assert [n for n, _ in mlflow_tag_literals(src, "tracking/experiment_kind.py")] == [6, 7, 8]
    assert [n for n, _ in mlflow_tag_literals(src, "tracking/other.py")] == [5, 6, 7, 8]
    assert sorted(tag_aliases(src)) == [(2, "NOTE"), (11, "ROLE"), (12, "NAME"), (13, "X")]


def test_mlflow_still_has_no_constant_for_the_tags_we_define() -> None:
    """When MLflow exports a constant for one of them, use it and drop the entry."""
    assert {"mlflow.parentRunId", "mlflow.note.content", "mlflow.source.git.commit",
            "mlflow.runName", "mlflow.log-model.history"} <= set(MLFLOW_CONSTANTS)
    assert not set(NO_CONSTANT) & set(MLFLOW_CONSTANTS)


def test_no_product_file_spells_an_mlflow_tag() -> None:
    literals, _ = _scan()
    bad = [f"{rel}:{line}: {s!r}" for rel, line, s in literals if (rel, s) not in PENDING]
    assert not bad, ("use mlflow.utils.mlflow_tags (or list a tag MLflow has no constant "
                     "for in NO_CONSTANT):\n" + "\n".join(bad))


def test_no_product_file_gives_a_tag_a_second_name() -> None:
    _, aliases = _scan()
    bad = [f"{rel}:{line}: {n}" for rel, line, n in aliases if (rel, n) not in PENDING]
    assert not bad, "use T.<NAME> / MLflow's constant itself:\n" + "\n".join(bad)


def test_pending_entries_still_exist() -> None:
    literals, aliases = _scan()
    seen = {(rel, s) for rel, _, s in literals} | {(rel, n) for rel, _, n in aliases}
    assert not PENDING - seen, f"fixed: delete from PENDING {sorted(PENDING - seen)}"
