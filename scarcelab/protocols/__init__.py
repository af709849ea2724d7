"""How methods are run and tuned: budgeted search, (later) ASHA, transfer. The linear probe
the epoch loop refits lives below them, in ``scarcelab/probe.py`` (tests/project/test_layers.py)."""
