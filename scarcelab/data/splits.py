"""The realistic split (SSL-vs-SSL §4): small labeled train and validation sets drawn with
the natural class frequencies, everything else of the train split unlabeled.

Where the validation set comes from (``val_from``): SSL-vs-SSL (Huang et al., CVPR 2024,
App. D.1) draws the labeled *validation* set from the dataset's predefined validation split
(TissueMNIST: 400 of the 23,640 official validation images, by class frequency) and the
labeled *train* set from the predefined train split. ``"official"`` does exactly that;
``"train"`` draws both from the train split (the pre-2026 behaviour, for datasets without an
official validation split or to reproduce old studies); ``"auto"`` (the default) is
``"official"`` when the dataset has an official validation split holding at least ``n_val``
images and ``"train"`` otherwise (e.g. BreastMNIST's 78 official validation images cannot
give its default 100). The resolved choice is stored in the split and in its hash.

Published benchmarks often validate on sets larger than the labeled training set, which
no practitioner with 400 labels has; here validation is capped at the labeled size unless
the caller explicitly allows more. Splits are deterministic in a seed, stored as JSON of
indices and identified by a hash that travels with every run.

``label_fraction`` (Kang et al. 2022's label-efficiency setting, docs/pathology.md) keeps
only that share of the labeled set, drawn per class as the first images of the same
seeded order the full labeled set was drawn from, while the validation set stays exactly
the one of ``label_fraction=1``: results at 10 % and 100 % then differ only in the labels
trained on, never in the images a model is selected on. The dropped images join the
unlabeled pool (their labels are dropped, as for every other unlabeled image).

A real unlabeled pool (``RawDataset.unlabeled_x``, a user's ``unlabeled/`` images): the
labeled and validation sets are drawn from the labeled images exactly as above, and the
unlabeled pool is the given one, whole and unchanged (``"unlabeled": "given"``, its size
and a digest of its files' contents). Labeled images left over (neither labeled nor
validation, or dropped by ``label_fraction``) are *unused* (``"unused"``): they never join
the pool, which then holds exactly the files the user gave as unlabeled. The split also
records where the test set came from (``"test"``: folder, holdout or fold i/k) and digests
of the train, validation and test files, all inside its hash.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from scarcelab.data.bundle import DatasetBundle, RawDataset
from scarcelab.errors import ConfigError, DataError

# (n_labeled, n_val) where a study defines them; SSL-vs-SSL Table 1 for tissue/path.
DEFAULT_BUDGETS: dict[str, tuple[int, int]] = {
    "tissuemnist": (400, 400),
    "pathmnist": (450, 450),
    "breastmnist": (100, 100),
    "pneumoniamnist": (400, 400),
    "synthetic_tiny": (30, 30),
    "synthetic_tiny_rgb": (30, 30),
}
FALLBACK_BUDGET = 400
VAL_FROM = ("auto", "official", "train")


def default_budget(name: str, n_train: int) -> tuple[int, int]:
    """The stated default, else 400/400 capped at a quarter of the train split each."""
    if name in DEFAULT_BUDGETS:
        return DEFAULT_BUDGETS[name]
    n = min(FALLBACK_BUDGET, max(2, n_train // 4))
    return n, n


def stratified_counts(class_counts: np.ndarray, n: int) -> np.ndarray:
    """Split ``n`` over classes proportionally (largest remainder), at least 1 per class.

    Natural frequency, not balanced: a balanced labeled set would leak the true class
    prior into a setting where nobody knows it.
    """
    present = class_counts > 0
    k = int(present.sum())
    if n < k:
        raise ConfigError(f"cannot draw {n} samples with at least one from each of {k} classes")
    quota = class_counts / class_counts.sum() * n
    counts = np.floor(quota).astype(int)
    counts[present] = np.maximum(counts[present], 1)
    while counts.sum() > n:  # the max(.,1) floor may overshoot: take from the largest
        counts[np.argmax(counts - quota)] -= 1
    remainder = quota - counts
    while counts.sum() < n:
        i = int(np.argmax(np.where(counts < class_counts, remainder, -np.inf)))
        counts[i] += 1
        remainder[i] = -np.inf
    if np.any(counts > class_counts):
        raise ConfigError(f"not enough samples per class for {n} draws: have {class_counts}")
    return counts


def resolve_val_from(raw: RawDataset, val_from: str, n_val: int) -> str:
    """``auto`` -> ``official`` or ``train`` (see the module docstring); checks the others."""
    if val_from not in VAL_FROM:
        raise ConfigError(f"val_from={val_from!r}: valid values are {', '.join(VAL_FROM)}")
    n_official = 0 if raw.val_y is None else len(raw.val_y)
    if val_from == "auto":
        return "official" if n_official and n_val <= n_official else "train"
    if val_from == "official":
        if not n_official:
            raise ConfigError(f"val_from=official: dataset {raw.name!r} has no official "
                              "validation split; use val_from=train (or auto)")
        if n_val > n_official:
            raise ConfigError(f"val_from=official: n_val={n_val} exceeds the {n_official} "
                              f"images of {raw.name}'s official validation split; lower n_val "
                              "or use val_from=train")
    return val_from


def make_split(
    raw: RawDataset,
    n_labeled: int | str | None = None,
    n_val: int | str | None = None,
    seed: int = 0,
    allow_large_val: bool = False,
    val_from: str = "auto",
    label_fraction: float = 1.0,
) -> dict[str, Any]:
    """Draw labeled / unlabeled index sets from ``raw``'s train split and the validation
    index set from its train or official validation split (``val_from``, see above);
    ``label_fraction`` < 1 keeps that share of the labeled set (see above)."""
    _check_request(raw, label_fraction)
    y = np.asarray(raw.train_y)
    n_train = len(y)
    n_lab, n_v, n_pool = _sizes(raw, n_train, n_labeled, n_val, val_from, label_fraction,
                                allow_large_val)
    source = resolve_val_from(raw, val_from, n_v)
    from_train = n_v if source == "train" else 0
    if n_pool + from_train > n_train:
        if raw.unlabeled_x is not None:  # a user's images: say which ones and the fix
            raise ConfigError(
                f"n_labeled + n_val = {n_pool + from_train} exceeds the {n_train} labeled "
                f"images of {raw.name} left for training{_test_text(raw)}; lower --n-labeled "
                f"and --n-val to at most {n_train} together (e.g. --n-labeled "
                f"{n_train - max(1, n_train // 3)} --n-val {max(1, n_train // 3)})")
        raise ConfigError(
            f"n_labeled + n_val = {n_pool + from_train} exceeds the {n_train} training "
            f"samples of {raw.name}"
        )
    counts = np.bincount(y, minlength=raw.num_classes)
    _check_classes(raw, counts)  # called from here: its warning's stacklevel names our caller
    rng = np.random.default_rng(seed)
    n_lab_c, keep_c = _labeled_quotas(counts, n_pool, n_lab, label_fraction)
    if source == "train":
        labeled, val = _draw_from_train(raw, y, counts, n_lab_c, keep_c, n_v, rng)
    else:
        labeled, val = _draw_with_official_val(raw, y, counts, keep_c, n_v, rng, seed)
    split = {
        "dataset": raw.name,
        "seed": int(seed),
        "n_labeled": n_lab,
        "n_val": n_v,
        "val_from": source,
        "labeled": sorted(labeled),
        "val": sorted(val),
        "unlabeled": _unlabeled(n_train, labeled, val if source == "train" else []),
        "test": "official",
    }
    if label_fraction < 1.0:  # absent at 1: the splits drawn before it keep their JSON
        split["label_fraction"] = float(label_fraction)
        split["n_labeled_pool"] = n_pool
    if raw.unlabeled_x is not None:
        _given_pool(raw, split)
    split["hash"] = split_hash(split)
    return split


#: split keys of a given pool (see the module docstring) that enter its hash
GIVEN_KEYS = ("n_unlabeled", "unlabeled_sha256", "train_sha256", "val_sha256", "test_sha256")


def _given_pool(raw: RawDataset, split: dict[str, Any]) -> None:
    """The split of a dataset with a real pool: the leftover labeled images are unused,
    the pool is the given one; sizes and content digests are recorded."""
    split["unused"] = split["unlabeled"]
    split["unlabeled"] = "given"
    split["n_unlabeled"] = int(len(raw.unlabeled_x))  # type: ignore[arg-type]
    split["test"] = raw.test_from
    split["n_test"] = int(len(raw.test_y))
    for part in ("unlabeled", "train", "val", "test"):
        if part in raw.digests:
            split[f"{part}_sha256"] = raw.digests[part]


def _test_text(raw: RawDataset) -> str:
    """`` (60 of its labeled images are the test hold-out, --test-fraction)`` etc."""
    n = len(raw.test_y)
    if raw.test_from == "holdout":
        return f" ({n} more are the test hold-out, --test-fraction)"
    if raw.test_from.startswith("fold "):
        return f" ({n} more are the test images of {raw.test_from}, --folds)"
    return ""


def unlabeled_count(split: dict[str, Any]) -> int:
    """The size of a split's unlabeled pool, given or drawn."""
    return int(split["n_unlabeled"]) if split["unlabeled"] == "given" \
        else len(split["unlabeled"])


def labeled_rest(split: dict[str, Any]) -> list[int]:
    """Train images neither labeled nor validation: the drawn pool of a public dataset,
    the unused labeled images of a dataset with a given pool."""
    return list(split["unused"]) if split["unlabeled"] == "given" else list(split["unlabeled"])


def _check_request(raw: RawDataset, label_fraction: float) -> None:
    """Refuse what no split can serve before any size is worked out, so the message names
    the real problem rather than a size that follows from it."""
    if not 0.0 < label_fraction <= 1.0:
        raise ConfigError(f"label_fraction must be in (0, 1], got {label_fraction}; e.g. 0.1 "
                          "keeps 10 % of the labeled images")
    if raw.task != "multi-class":
        raise ConfigError(
            f"dataset {raw.name!r} is {raw.task}; scarcelab's classifiers and splits are "
            "single-label multi-class (pick another dataset)"
        )


def _sizes(
    raw: RawDataset,
    n_train: int,
    n_labeled: int | str | None,
    n_val: int | str | None,
    val_from: str,
    label_fraction: float,
    allow_large_val: bool,
) -> tuple[int, int, int]:
    """(n_labeled, n_val, n_pool): the requested sizes with defaults and ``"all"`` resolved
    and the realism rules applied; ``n_pool`` is the labeled size of ``label_fraction=1``,
    the set a smaller fraction is drawn from."""
    d_lab, d_val = raw.default_budget or default_budget(raw.name, n_train)
    val_given = n_val not in (None, "default", "")
    if n_labeled in (None, "default", ""):
        n_labeled = d_lab
        if raw.default_budget and not val_given:  # the source's own pair, e.g. all labels
            n_val, val_given = d_val, True
    if n_labeled == "all":
        # "All labels": every train sample not held out for validation is labeled (the
        # unlabeled pool is empty). Model selection still uses a held-out validation set,
        # by default the dataset's default validation size (docs/cli.md, "All labels"),
        # from the official validation split where val_from picks it (then no train
        # sample is held out).
        if not val_given:
            n_val, val_given = d_val, True
        source = resolve_val_from(raw, val_from, int(n_val))  # type: ignore[arg-type]
        n_labeled = n_train - (int(n_val) if source == "train" else 0)  # type: ignore[arg-type]
    n_labeled = int(n_labeled)  # type: ignore[arg-type]
    n_val = int(n_val) if val_given else n_labeled  # type: ignore[arg-type]
    if n_val < 1 or n_labeled < 1:
        raise ConfigError(f"n_labeled={n_labeled}, n_val={n_val}: both must be >= 1 (an empty "
                          "validation set cannot select a model or stop early)")
    n_pool = n_labeled  # the labeled set of label_fraction = 1
    if label_fraction < 1.0:
        n_labeled = round(label_fraction * n_pool)
    if n_val > n_labeled and not allow_large_val:
        raise ConfigError(
            f"n_val={n_val} is larger than n_labeled={n_labeled}; a validation set larger "
            "than the labeled training set is unrealistic. Lower n_val or pass "
            "allow_large_val=true to override."
        )
    return n_labeled, n_val, n_pool


def _labeled_quotas(counts: np.ndarray, n_pool: int, n_labeled: int,
                    label_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Per class: how many images the full labeled set takes (the validation draw from train
    starts after them whatever the fraction, so validation is that of ``label_fraction=1``)
    and how many of those are kept as labeled."""
    n_lab_c = stratified_counts(counts, n_pool)
    keep_c = n_lab_c
    if label_fraction < 1.0:
        k = int((n_lab_c > 0).sum())
        if n_labeled < k:
            raise ConfigError(f"label_fraction={label_fraction} keeps {n_labeled} of "
                              f"{n_pool} labeled images, fewer than the {k} classes; raise "
                              "label_fraction")
        keep_c = stratified_counts(n_lab_c, n_labeled)
    return n_lab_c, keep_c


def _draw_from_train(raw: RawDataset, y: np.ndarray, counts: np.ndarray, n_lab_c: np.ndarray,
                     keep_c: np.ndarray, n_val: int,
                     rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Labeled and validation sets from one seeded order of each class: the labeled images
    first, validation right after the full labeled quota."""
    labeled: list[int] = []
    val: list[int] = []
    remaining = counts - n_lab_c
    n_val_c = stratified_counts(remaining, n_val) if n_val > 0 else np.zeros_like(counts)
    for c in range(raw.num_classes):
        idx = rng.permutation(np.flatnonzero(y == c))
        labeled += idx[: keep_c[c]].tolist()
        val += idx[n_lab_c[c] : n_lab_c[c] + n_val_c[c]].tolist()
    return labeled, val


def _draw_with_official_val(raw: RawDataset, y: np.ndarray, counts: np.ndarray,
                            keep_c: np.ndarray, n_val: int, rng: np.random.Generator,
                            seed: int) -> tuple[list[int], list[int]]:
    """Labeled set from train with the same draws as :func:`_draw_from_train`, validation
    from the official validation split by its own class frequency."""
    labeled: list[int] = []
    val: list[int] = []
    for c in range(raw.num_classes):
        labeled += rng.permutation(np.flatnonzero(y == c))[: keep_c[c]].tolist()
    vy = np.asarray(raw.val_y)
    v_counts = np.bincount(vy, minlength=raw.num_classes)
    n_val_c = stratified_counts(v_counts, n_val) if n_val > 0 else np.zeros_like(counts)
    vrng = np.random.default_rng([seed, 0x7A1])  # its own stream: labeled draws unchanged
    for c in range(raw.num_classes):
        val += vrng.permutation(np.flatnonzero(vy == c))[: n_val_c[c]].tolist()
    return labeled, val


def _unlabeled(n_train: int, labeled: list[int], val_in_train: list[int]) -> list[int]:
    """Every train index neither labeled nor held out for validation."""
    taken = np.zeros(n_train, dtype=bool)
    taken[labeled] = True
    if val_in_train:
        taken[val_in_train] = True
    return np.flatnonzero(~taken).tolist()


def _check_classes(raw: RawDataset, counts: np.ndarray) -> None:
    """A train split with one class gives a labeled set with one class: every model is
    "perfect" on validation and the numbers mean nothing. A one-class test set leaves
    AUROC undefined: it is warned about here and not logged (the entry points drop it)."""
    if int((counts > 0).sum()) < 2:
        raise DataError(f"{raw.name}: the train split has a single class "
                        f"({int(np.argmax(counts))}); a labeled set needs at least two classes")
    if len(np.unique(np.asarray(raw.test_y))) < 2:
        import warnings

        warnings.warn(f"{raw.name}: the test split has a single class; test AUROC is "
                      "undefined and will be missing, balanced accuracy is not comparable",
                      UserWarning, stacklevel=3)


def split_hash(split: dict[str, Any]) -> str:
    """Content hash of the index sets (12 hex chars), independent of the JSON layout.

    ``val_from`` enters the hash only when it is not ``train``: the same index lists mean
    other images when they index the official validation split, while splits drawn the old
    way (validation from train) keep the hashes they always had."""
    payload = {k: split[k] for k in ("dataset", "labeled", "val", "unlabeled", "test")}
    if split.get("val_from", "train") != "train":
        payload["val_from"] = split["val_from"]
    payload.update({k: split[k] for k in GIVEN_KEYS if k in split})  # a given pool only
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def apply_split(raw: RawDataset, split: dict[str, Any]) -> DatasetBundle:
    """Materialise a bundle; checks the split refers to this dataset."""
    if split.get("dataset") != raw.name:
        raise DataError(f"split was drawn for {split.get('dataset')!r}, not {raw.name!r}")
    n = len(raw.train_y)
    official = split.get("val_from", "train") == "official"
    if official and raw.val_y is None:
        raise DataError(f"split takes validation from the official validation split, which "
                        f"{raw.name!r} does not have")
    given = split.get("unlabeled") == "given"
    _check_given(raw, split, given)
    for part in ("labeled", "val", "unused" if given else "unlabeled"):
        in_val = part == "val" and official
        size = len(raw.val_y) if in_val else n  # type: ignore[arg-type]
        if split[part] and max(split[part]) >= size:
            raise DataError(f"split {part} indices exceed the {size} "
                            f"{'validation' if in_val else 'training'} samples of {raw.name}")
    lab, val = (np.asarray(split[k], dtype=np.int64) for k in ("labeled", "val"))
    unl = np.asarray([] if given else split["unlabeled"], dtype=np.int64)
    val_x = raw.val_x if official else raw.train_x
    val_y = raw.val_y if official else raw.train_y
    meta = {
        "name": raw.name,
        "num_classes": raw.num_classes,
        "class_names": list(raw.class_names),
        "channels": raw.channels,
        "resolution": list(raw.resolution),
        "split_hash": split["hash"],
        "val_from": split.get("val_from", "train"),
        "source": raw.source,
        "md5": raw.md5,
    }
    if given:  # absent otherwise: public datasets keep their bundle as it was
        meta.update(unlabeled="given", test_from=raw.test_from)
    if raw.transform is not None:
        meta["transform"] = dict(raw.transform)
    return DatasetBundle(
        labeled_x=raw.train_x[lab],
        labeled_y=raw.train_y[lab],
        unlabeled_x=raw.unlabeled_x if given else raw.train_x[unl],  # type: ignore[arg-type]
        val_x=val_x[val],  # type: ignore[index]
        val_y=val_y[val],  # type: ignore[index]
        test_x=raw.test_x,
        test_y=raw.test_y,
        meta=meta,
        unlabeled_y=None if given else raw.train_y[unl],
    )


def _check_given(raw: RawDataset, split: dict[str, Any], given: bool) -> None:
    """A split of a given pool fits only that very pool (and a drawn one only a dataset
    without one): the digests say whether the files are still the ones it was drawn on."""
    if given != (raw.unlabeled_x is not None):
        raise DataError(f"split of {raw.name} was drawn {'with' if given else 'without'} a "
                        f"given unlabeled pool, but the dataset has {'none' if given else 'one'}")
    if not given:
        return
    for part in ("unlabeled", "train", "val", "test"):
        key = f"{part}_sha256"
        if split.get(key) != raw.digests.get(part):
            raise DataError(f"the {part} images of {raw.name} changed since the split "
                            f"{split.get('hash')} was drawn ({key} differs); draw a new split")
