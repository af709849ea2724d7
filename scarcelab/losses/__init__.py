"""Loss functions, one per file, each with a reference-value test."""

from scarcelab.losses.ntxent import nt_xent

__all__ = ["nt_xent"]

# self-supervised losses
from scarcelab.losses.barlow import barlow_twins  # noqa: E402
from scarcelab.losses.dino import dino_loss, update_center  # noqa: E402
from scarcelab.losses.infonce import info_nce  # noqa: E402
from scarcelab.losses.negative_cosine import negative_cosine  # noqa: E402
from scarcelab.losses.swav import swapped_prediction  # noqa: E402

__all__ += ["barlow_twins", "dino_loss", "info_nce", "negative_cosine", "swapped_prediction",
            "update_center"]

# losses of classifier methods (here, not in their method files, so each has its own
# reference-value test and a second method can reuse it)
from scarcelab.losses.cosine_ce import cosine_ce_loss  # noqa: E402
from scarcelab.losses.graph_contrastive import graph_contrastive_loss  # noqa: E402
from scarcelab.losses.ole import ole_loss  # noqa: E402

__all__ += ["cosine_ce_loss", "graph_contrastive_loss", "ole_loss"]
