"""Every method hyperparameter and every AL strategy parameter is exercised by some test
(scikit-activeml's check that each ``__init__`` parameter of each query strategy has a
test of its own, ``tests/test_query_strategies``-style, read statically here).

A hyperparameter that is declared (a method's ``defaults`` / ``search_space``, a strategy's
annotated class attribute) but that no test ever sets would be tuned, logged and reported
with nothing to say it changes what it names. Training each one (an earlier dynamic draft)
cost minutes; this check reads the test sources with :mod:`ast` instead, in well under a
second.

What counts: a test function (with its decorators, its class's attributes when it is a
method of a test class, and the module-level constants it names) that mentions the
method or strategy (its registered name as a string, or its class name) and the parameter
(as a string, a keyword argument, or an attribute it assigns). That is a test that sets or
reads this parameter for this method, which a newcomer's new hyperparameter has not got
until they write one. It cannot tell a test that checks the effect from one that only
passes the value, so the list below is a floor, not a proof.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from scarcelab.active import STRATEGIES
from scarcelab.active.base import Strategy
from scarcelab.methods import METHODS

TESTS = Path(__file__).resolve().parents[1]
#: hyperparameters that no method file reads: the shared optimiser
#: (``scarcelab.train.make_optimizer``) does, for every method alike, so a test of it
#: exercises them for all methods
OPTIMISER_KEYS = {"lr", "weight_decay"}
#: declared parameters that no test names yet, found by this check; each is a gap to close
#: with a real test (then delete its entry: a stale entry fails), never a parameter to hide
KNOWN_GAPS: dict[str, set[str]] = {}


def _own_words(node: ast.AST) -> set[str]:
    """The strings, keyword names, attribute names and names a piece of source holds."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.add(n.value)
            out.update(n.value.replace(",", " ").split())  # parametrize("a,b", ...)
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Name):
            out.add(n.id)
    return out


def _test_functions(tree: ast.Module) -> Iterator[tuple[ast.AST, list[ast.AST]]]:
    """(test function, the context it reads: its class's attributes) per test."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"):
            yield node, []
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            attrs = [b for b in node.body if isinstance(b, ast.Assign | ast.AnnAssign)]
            for b in node.body:
                if isinstance(b, ast.FunctionDef) and b.name.startswith("test"):
                    yield b, [*attrs, *node.decorator_list]


@cache
def _tests() -> tuple[tuple[str, frozenset[str]], ...]:
    """(test id, words) for every test function under tests/, module constants included."""
    out = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == Path(__file__).name:
            continue
        tree = ast.parse(path.read_text(), str(path))
        consts = {t.id: stmt for stmt in tree.body if isinstance(stmt, ast.Assign | ast.AnnAssign)
                  for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
                  if isinstance(t, ast.Name)}
        for fn, ctx in _test_functions(tree):
            words = _own_words(fn)
            for c in ctx:
                words |= _own_words(c)
            for name in list(words):  # one level of module constants it names
                if name in consts:
                    words |= _own_words(consts[name])
            out.append((f"{path.relative_to(TESTS)}::{fn.name}", frozenset(words)))
    return tuple(out)


def _unexercised(owner_words: set[str], params: list[str]) -> list[str]:
    tests = [w for _, w in _tests() if w & owner_words]
    return [p for p in params if not any(p in w for w in tests)]


def _method_params(name: str) -> list[str]:
    cls = METHODS.get(name)
    return sorted(set(cls.defaults) | set(cls.search_space))


def _strategy_params(name: str) -> list[str]:
    """A strategy's parameters: the annotated class attributes its own classes declare
    (``Strategy.__init__`` accepts exactly the attributes it has)."""
    cls = STRATEGIES.get(name)
    params: set[str] = set()
    for k in cls.__mro__:
        if k is Strategy or not issubclass(k, Strategy):
            continue
        params |= {a for a, t in vars(k).get("__annotations__", {}).items()
                   if "ClassVar" not in str(t)}
    return sorted(params)


def _check(kind: str, name: str, cls: type, params: list[str]) -> None:
    own = [p for p in params if not (kind == "method" and p in OPTIMISER_KEYS)]
    missing = set(_unexercised({name, cls.__name__}, own))
    missing |= set(_unexercised({"make_optimizer"}, sorted(set(params) - set(own))))
    gaps = KNOWN_GAPS.get(f"{kind} {name}", set())
    assert not gaps - missing, (
        f"KNOWN_GAPS[{kind} {name!r}] lists {sorted(gaps - missing)}, which a test now names "
        "(or which the class no longer declares): delete them from the list")
    assert not missing - gaps, (
        f"{kind} {name!r} ({cls.__module__}): no test sets or reads {sorted(missing - gaps)}; "
        f"add a test that names {name!r} and each of them")


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_hyperparameter_is_exercised(name: str) -> None:
    _check("method", name, METHODS.get(name), _method_params(name))


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_every_strategy_parameter_is_exercised(name: str) -> None:
    _check("strategy", name, STRATEGIES.get(name), _strategy_params(name))


def test_the_check_sees_a_missing_parameter_and_a_present_one() -> None:
    """The check itself: a parameter no test mentions is reported, one a test sets is not
    (otherwise every test above could pass by reading nothing)."""
    assert _tests(), "no test sources parsed"
    assert _unexercised({"fixmatch", "FixMatch"}, ["threshold", "no_such_knob_xyz"]) == [
        "no_such_knob_xyz"]
    assert _unexercised({"no_such_method_xyz"}, ["lr"]) == ["lr"]
