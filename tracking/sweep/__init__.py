"""Benchmark grids as Ray tasks with MLflow as the record: ``scarcelab sweep grid.yaml``.

``spec`` parses and validates a grid spec into cells (no Ray, no MLflow); ``driver`` runs
the cells (embedded Ray or a cluster) and records them under one sweep run.
"""

from scarcelab.tracking.sweep.spec import Cell, SpecError, SweepSpec, load_spec, parse_spec

__all__ = ["Cell", "SpecError", "SweepSpec", "load_spec", "parse_spec"]
