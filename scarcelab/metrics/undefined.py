"""Why a logged metric can come out undefined (NaN or inf), in words a user can act on.

The tracker leaves such a value out of the record and says so once per metric
(``entrypoints._progress``); the reason has to fit the metric. One generic example ("AUROC
when the test set has one class") was printed for ``diag/sem_drift`` too, where it means
nothing. Each reason restates the condition under which the metric's own
code returns NaN/inf: :func:`scarcelab.metrics.diagnostics.semantic_drift`,
``gradient_alignment``, ``ood_filtration_failure``, the ROC-based metrics of
:mod:`scarcelab.metrics.classification` (a class with no samples gives no curve), and the
PQ/DQ/SQ ratios of :mod:`scarcelab.metrics.segmentation` (an empty denominator).
"""

from __future__ import annotations

# (key prefix or exact key, reason); the first match wins, so exact keys come first
_REASONS: tuple[tuple[str, str], ...] = (
    ("diag/sem_drift", "no class had both labeled samples and unlabeled samples passing the "
     "method's pseudo-label filter, so no centroid pair to compare; common in early epochs "
     "under a high confidence threshold"),
    ("diag/grad_align", "the labeled or the unlabeled loss has no gradient on the "
     "classifier, e.g. no unlabeled sample passed the mask"),
    ("diag/ood_ff", "the diagnostic subsample holds no OOD or no in-distribution sample "
     "(NaN), or OOD samples passed while no in-distribution one did (inf)"),
    ("diag/", "the C-Score diagnostics could not be computed for this method in this epoch "
     "(a warning above names the error)"),
    ("seg/", "the evaluated tiles hold no nucleus (of that type) in either the truth or the "
     "prediction, so the ratio has an empty denominator"),
)
_ROC = ("auroc", "sensitivity_at_spec")


def why_undefined(key: str) -> str:
    """The condition under which metric ``key`` is undefined, for the one-time warning."""
    for prefix, reason in _REASONS:
        if key == prefix or (prefix.endswith("/") and key.startswith(prefix)):
            return reason
    if any(r in key for r in _ROC):
        return "the evaluated set holds a single class, so there is no ROC curve"
    return "it cannot be computed from this run's data"
