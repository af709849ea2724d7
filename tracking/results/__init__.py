"""Results pages: a suite's sweep, read back from the tracking store, as one markdown page
beside the source paper's numbers, with a computed verdict per headline claim.

    scarcelab results suites/cdalbench.yaml            # docs/results/cdalbench.md (+ PNGs)
    scarcelab results suites/*.yaml --index            # every page and docs/results/README.md
    scarcelab results suites/cdalbench.yaml --smoke    # the smoke run's page (docs/results/smoke)

Nothing on a page is typed by hand: our numbers come from the store (the runs of the
sweep's cells at the chosen scale), the paper's from ``suites/papers/<suite>.yaml``, where
every value carries its citation (paper or repository, table, row, column) and every
claim a rule that this package evaluates on our numbers (:mod:`.claims`).
"""

from scarcelab.tracking.results.page import SuitePage, build_page, write_index, write_page
from scarcelab.tracking.results.papers import PaperFile, load_paper

__all__ = ["PaperFile", "SuitePage", "build_page", "load_paper", "write_index", "write_page"]
