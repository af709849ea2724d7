"""What a ``probe`` run adds to its MLflow record once the protocol has answered: the test
scores of the reported model under the keys every transfer run shares (``test/accuracy``,
``test/balanced_accuracy``, …, step 0 — a fine-tuning study otherwise has them only on its
trial runs and as ``best/test_*``), the confusion matrix as a PNG figure and as JSON."""

from __future__ import annotations

from typing import Any

import numpy as np

from scarcelab.protocols.transfer import ProbeResult


def confusion_figure(cm: np.ndarray, class_names: list[str], title: str) -> Any:
    """Counts with row-normalised shading (recall per true class on the diagonal)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(class_names)
    rows = cm.sum(1, keepdims=True).clip(min=1)
    fig, ax = plt.subplots(figsize=(1.1 * k + 2.5, 1.1 * k + 1.8))
    ax.imshow(cm / rows, cmap="Blues", vmin=0.0, vmax=1.0)
    for i in range(k):
        for j in range(k):
            ax.text(j, i, str(int(cm[i, j])), ha="center", va="center",
                    color="white" if cm[i, j] / rows[i, 0] > 0.5 else "black", fontsize=9)
    ax.set_xticks(range(k), class_names, rotation=45, ha="right")
    ax.set_yticks(range(k), class_names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def log_probe_outcome(run_id: str, res: ProbeResult, encoder: str) -> None:
    import matplotlib.pyplot as plt
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    if res.protocol == "finetune":  # the linear protocol logged them itself
        client.log_batch(run_id, metrics=[_metric(f"test/{k}", v) for k, v in res.test.items()]
                         + [_metric("val/balanced_accuracy", res.val_balanced_accuracy)])
    fig = confusion_figure(res.confusion, res.class_names,
                           f"{res.protocol} probe, encoder {encoder}\n"
                           f"test accuracy {res.test['accuracy']:.3f}, balanced "
                           f"{res.test['balanced_accuracy']:.3f}")
    try:
        client.log_figure(run_id, fig, "confusion_matrix.png")
    finally:
        plt.close(fig)
    client.log_dict(run_id, {"class_names": res.class_names,
                             "rows_true_cols_predicted": res.confusion.tolist()},
                    "confusion_matrix.json")


def _metric(key: str, value: float) -> Any:
    import time

    from mlflow.entities import Metric

    return Metric(key, float(value), int(time.time() * 1000), 0)


__all__ = ["confusion_figure", "log_probe_outcome"]
