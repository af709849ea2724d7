"""Loss functions, one per file, each with a reference-value test."""

from scarcelab.losses.ntxent import nt_xent

__all__ = ["nt_xent"]
