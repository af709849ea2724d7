"""Everything MLflow: the ``Tracker`` implementation, stores, and the query layer.

``scarcelab/`` (the learning core) never imports this package; entry points wire the two.
"""

from tracking.leaderboard import leaderboard, load_studies
from tracking.mlflow_tracker import MlflowTracker

__all__ = ["MlflowTracker", "leaderboard", "load_studies"]
