"""Dataset sources: each module registers its loaders in ``scarcelab.data.DATASETS``."""
