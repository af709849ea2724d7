"""Evaluation metrics (numpy only; see :mod:`scarcelab.metrics.classification`)."""

from scarcelab.metrics.classification import (
    accuracy,
    auroc,
    balanced_accuracy,
    classification_metrics,
    partial_auroc,
    sensitivity_at_specificity,
)

__all__ = [
    "accuracy",
    "auroc",
    "balanced_accuracy",
    "classification_metrics",
    "partial_auroc",
    "sensitivity_at_specificity",
]
