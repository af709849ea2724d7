"""scarcelab: a benchmark suite for learning from scarce labels.

The learning core. It never imports mlflow: protocols report through
:class:`scarcelab.tracker.Tracker`, which ``tracking/`` implements with MLflow.
"""

__version__ = "0.1.0"
