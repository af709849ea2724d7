"""One file per query strategy; each registers itself in ``scarcelab.active.STRATEGIES``."""
