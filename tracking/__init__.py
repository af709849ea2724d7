"""Everything MLflow: the ``Tracker`` implementation, stores, and the query layer.

``scarcelab/`` (the learning core) never imports this package; entry points wire the two.
Import what you need from its modules (``tracking.mlflow_tracker``, ``tracking.query``…):
this package itself imports nothing, so that a part that needs no MLflow (the sweep pool
that ``bench/al_sweeps.py`` uses on a torch-only machine) imports without it.
"""
