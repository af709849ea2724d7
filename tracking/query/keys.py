"""The columns that key a leaderboard: one definition (issue 44 item 5).

Runs are comparable only on the same data with the same number of labels: a *block* is one
(dataset, label budget), and every view that compares methods (leaderboard, significance,
gains, ranks, profile) and every figure or page that draws them groups by it. A leaderboard
also ranks within one time budget (issue 43: a 0.5-minute study is not ranked among
3-minute ones), so its ranked block adds ``budget_minutes``.

These were spelled out as ``("dataset", "n_labeled")`` in 17 places of ``views.py``,
``render.py``, ``results/page.py`` and the leaderboard command; a key that gained a column
(issue 44 item 2: a setting that keys a row) would have changed in some of them.
tests/project/test_leaderboard_keys.py fails when the literal pair appears outside this module.
"""

from __future__ import annotations

#: a block: the runs whose methods are compared with one another
BLOCK: tuple[str, ...] = ("dataset", "n_labeled")
#: the block a leaderboard and a significance table rank within
RANKED: tuple[str, ...] = (*BLOCK, "budget_minutes")


def block_columns(*more: str) -> list[str]:
    """The block's columns followed by ``more`` (a ``groupby`` or column list)."""
    return [*BLOCK, *more]
