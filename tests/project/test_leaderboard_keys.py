"""The leaderboard's row key has one definition, and it is what leaderboards group by
(issue 44 item 5).

``("dataset", "n_labeled")`` was spelled out 17 times in ``views.py``, ``render.py``,
``results/page.py`` and the leaderboard command; ``tracking/query/keys.py`` now holds it.
The first test fails when the literal pair comes back anywhere else in the product code;
the second checks, on a hand-written store, that a leaderboard's and a significance
table's blocks are exactly those keys.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from scarcelab.tracking import query
from scarcelab.tracking.query.keys import BLOCK, RANKED

REPO = Path(__file__).resolve().parents[2]
KEYS = REPO / "tracking" / "query" / "keys.py"
T0 = 1_700_000_000_000


def literal_keys(root: Path = REPO) -> list[str]:
    """``path:line`` of every tuple or list literal in the product code that holds
    ``"dataset"`` then ``"n_labeled"`` side by side, outside ``tracking/query/keys.py``."""
    out = []
    for folder in ("scarcelab", "tracking", "entrypoints"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.resolve() == KEYS.resolve():
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Tuple | ast.List):
                    continue
                vals = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
                pairs = zip(vals, vals[1:], strict=False)
                if any(a == BLOCK[0] and b == BLOCK[1] for a, b in pairs):
                    out.append(f"{path.relative_to(root)}:{node.lineno}")
    return out


def test_the_row_key_is_spelled_once() -> None:
    assert BLOCK == ("dataset", "n_labeled") and RANKED == (*BLOCK, "budget_minutes")
    found = literal_keys()
    assert not found, ("use scarcelab.tracking.query.keys (BLOCK, RANKED, block_columns) "
                       "instead of spelling the leaderboard key out: " + ", ".join(found))


def test_the_scan_finds_a_copy(tmp_path: Path) -> None:
    for folder in ("scarcelab", "tracking", "entrypoints"):
        (tmp_path / folder).mkdir()
    (tmp_path / "tracking" / "v.py").write_text(
        'def f(df):\n    return df.groupby(["dataset", "n_labeled", "x"])\n')
    (tmp_path / "entrypoints" / "c.py").write_text('COLS = ("n_labeled", "dataset")\n')
    assert literal_keys(tmp_path) == ["tracking/v.py:2"]


def _study(c: MlflowClient, exp: str, start: int, n_labeled: str, budget: str, seed: int,
           score: float) -> None:
    run = c.create_run(exp, start_time=start, tags={
        "scarcelab.role": "study", "scarcelab.family": "supervised",
        "scarcelab.method": "sup", "scarcelab.dataset": "dK", "scarcelab.seed": str(seed)})
    rid = run.info.run_id
    c.log_batch(rid, params=[Param(k, v) for k, v in {
        "n_labeled": n_labeled, "budget_minutes": budget, "n_val": "40"}.items()],
        metrics=[Metric("best/val_balanced_accuracy", score, T0, 0),
                 Metric("best/test_balanced_accuracy", score, T0, 0),
                 Metric("time/elapsed_s", 10.0, T0, 0)])
    c.set_terminated(rid, "FINISHED", end_time=start + 100)


def test_leaderboards_group_by_the_key(tmp_path: Path) -> None:
    """Studies that differ only in the label budget (or the time budget) are separate rows
    and separate significance blocks; seeds within one key are one row."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("keys", artifact_location=str(tmp_path / "art"))
    studies = [("40", "3", 0, 0.60), ("40", "3", 1, 0.64), ("80", "3", 0, 0.70),
               ("80", "1", 0, 0.50)]
    for i, s in enumerate(studies):
        _study(c, exp, T0 + 1000 * i, *s)
    t = query.load("keys", uri)
    lb = query.leaderboard(t)
    got = {(r["dataset"], int(r["n_labeled"]), float(r["budget_minutes"])): int(r["n"])
           for _, r in lb.iterrows()}
    assert got == {("dK", 40, 3.0): 2, ("dK", 80, 3.0): 1, ("dK", 80, 1.0): 1}
    assert lb[list(RANKED)].drop_duplicates().shape[0] == len(lb)
    with pytest.warns(UserWarning, match="different time budgets"):
        sig = query.significance(t)
    blocks = {(r["dataset"], int(float(r["n_labeled"])), float(r["budget_minutes"]))
              for _, r in sig.iterrows()}
    assert blocks == set(got) and len(sig) == len(got)  # one method per block here
