"""How methods are run and tuned: budgeted search, linear probe, (later) ASHA, transfer."""
