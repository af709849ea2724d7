"""AL datasets and their per-dataset protocol settings (CDALBench Tables 6 and 7).

Each dataset is a loader returning train/test arrays plus an :class:`ALConfig` with the
classifier, optimiser, budget and seed-set settings the benchmark fixed for it. Every field
can be overridden (``ALConfig.replace``), because the point of a benchmark config is that a
user sees and changes it, not that it is hidden in code.

The synthetic sets are generated from the data RNG (s_D + k), so each repetition sees a
fresh draw — CDALBench regenerates them per run to average over the sampling noise too.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scarcelab import tags as T
from scarcelab.active.classifier import FitConfig, FitSettings
from scarcelab.errors import ConfigError, DataError
from scarcelab.registry import Registry


@dataclass
class ALData:
    """Train (pool + validation source) and official test arrays, float32 features."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    source: str
    note: str = ""
    #: Provenance to log with the sweep (e.g. the encoding key and where it is cached).
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class ALConfig(FitSettings):
    """Protocol settings for one dataset: the optimiser and early-stopping settings of
    :class:`~scarcelab.active.classifier.FitSettings` (inherited, so declared once) and
    the protocol's own. ``fitting`` is ``scratch`` (re-initialise each iteration to the
    repetition's initial weights) or ``finetune`` (warm start). The protocol's fields are
    keyword-only, since ``budget`` has no default."""

    budget: int
    seed_per_class: int = 1
    val_fraction: float = 0.2
    #: ``mlp`` (``hidden`` widths; none = linear) or a scarcelab backbone for image sets.
    arch: str = "mlp"
    hidden: tuple[int, ...] = (24, 12)
    dropout: float = 0.0
    fitting: str = "finetune"
    #: Fitting details beyond FitSettings' (see docs/active.md, "Fitting"): one optimiser
    #: per repetition whose state carries across fits; the seed-set fit's fixed epoch count
    #: (0 = the same rule as every other fit).
    keep_optimizer: bool = False
    first_fit_epochs: int = 0
    #: Which split early stopping watches: ``val`` (the validation split; honest) or
    #: ``test`` (the test set itself, as CDALBench's earlier ``ALGame._fit_classifier`` did:
    #: a leak, kept only to reproduce their numbers; docs/active.md).
    stop_on: str = "val"
    #: With ``finetune``, fit once per newly labeled sample (q fits per query of size q), as
    #: CDALBench's ``ALGame.step`` does; False: one fit per query.
    fit_per_label: bool = False
    query_sizes: tuple[int, ...] = (1, 5)
    extra: dict[str, float] = field(default_factory=dict)

    def fit_config(self) -> FitConfig:
        """What one :func:`~scarcelab.active.classifier.fit` of this protocol takes."""
        return FitConfig(**{f.name: getattr(self, f.name)
                            for f in dataclasses.fields(FitSettings)})

    def replace(self, **changes: object) -> ALConfig:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown AL config field(s) {sorted(unknown)}; valid: "
                              f"{[f.name for f in dataclasses.fields(self)]}")
        if "fitting" in changes and changes["fitting"] not in ("scratch", "finetune"):
            raise ConfigError(f"fitting must be 'scratch' or 'finetune', got "
                              f"{changes['fitting']!r}")
        if "stop_on" in changes and changes["stop_on"] not in ("val", "test"):
            raise ConfigError(f"stop_on must be 'val' or 'test', got {changes['stop_on']!r}")
        for key in ("restore_best", "drop_last", "keep_optimizer", "fit_per_label"):
            if key in changes and changes[key] not in (True, False):  # 0 / 1 pass too
                raise ConfigError(f"{key} must be true or false, got {changes[key]!r}")
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass
class LoadContext:
    """What a loader may need beyond the data folder: the device and, for ``encoded_*``
    sets, how to get the encoder and where to cache its embeddings (``cache=None``: the
    disk cache under the data root; the tracking layer passes an MLflow-backed one).
    ``pretrained`` is a backbone handed in by the caller (e.g. loaded from a scarcelab
    ``self`` run), identified by ``pretrained_id``."""

    device: str = "cpu"
    encoder: dict[str, Any] = field(default_factory=dict)
    cache: Any = None
    pretrained: Any = None
    pretrained_id: str = ""
    accel: Any = None  # the encoder's precision and kernels (scarcelab.accel.Accel)
    #: a user's images (``folder:``/``csv:``): scarcelab.data.own.DataOptions
    data_options: Any = None


Loader = Callable[[Path, np.random.Generator, LoadContext], ALData]


@dataclass
class ALDatasetSpec:
    loader: Loader
    config: ALConfig
    synthetic: bool = False
    kind: str = "tabular"  # tabular | text | synthetic | image | encoded


#: The fixed AL sets, on the same :class:`~scarcelab.registry.Registry` as every other
#: pluggable kind, so lookup, listing, the unknown-name message and the double-registration
#: guard are the shared ones; :func:`spec` adds the image and ``encoded_`` forms on the fly.
AL_DATASETS: Registry[ALDatasetSpec] = Registry("al dataset")


def register_al_dataset(name: str, config: ALConfig, synthetic: bool = False,
                        kind: str = "tabular") -> Callable[[Loader], Loader]:
    """Register ``loader`` under ``name`` with its protocol settings (a loader stays a plain
    function; the registry holds its :class:`ALDatasetSpec`)."""
    def deco(fn: Loader) -> Loader:
        AL_DATASETS.register(name)(ALDatasetSpec(fn, config, synthetic,
                                                 "synthetic" if synthetic else kind))
        return fn
    return deco


def default_data_dir() -> Path:
    """``$SCARCELAB_DATA`` or ``~/.cache/scarcelab`` (DESIGN §3)."""
    return Path(os.environ.get("SCARCELAB_DATA", Path.home() / ".cache" / "scarcelab"))


#: The project machines keep real data beside the checkout (../shared/data); it is searched
#: after the default data root (never after a --data-dir the user chose) so that
#: `mlflow run . -e al -P dataset=splice` works there without a data_dir, while a user's own
#: copy always wins. Using it is announced on stderr and noted in the run's data_files.json.
SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
_SUBDIRS = ("", "tabular", "text_sms")


def _roots(data_dir: Path) -> list[Path]:
    roots = [data_dir]
    is_default = data_dir.expanduser().resolve() == default_data_dir().expanduser().resolve()
    if is_default and SHARED_DATA.is_dir() and SHARED_DATA.resolve() != data_dir.resolve():
        roots.append(SHARED_DATA)
    return roots


def _in_root(root: Path, names: tuple[str, ...]) -> Path | None:
    for sub in _SUBDIRS:
        for n in names:
            p = root / sub / n
            if p.is_file():
                return p
    return None


def _locate(data_dir: Path, what: str, *groups: tuple[str, ...]) -> list[Path]:
    """One file per group (the first name present wins), all from the SAME folder: a
    partial folder never mixes its train file with another folder's test file. Each file
    is recorded for the run's provenance."""
    from scarcelab.data import provenance

    for i, root in enumerate(_roots(data_dir)):
        found = [_in_root(root, g) for g in groups]
        if all(p is not None for p in found):
            note = provenance.fallback(data_dir, root, what) if i else ""
            return [provenance.record(p, note=note) for p in found if p is not None]
    have = [g[0] for g in groups if _in_root(data_dir, g) is not None]
    missing = [" or ".join(g) for g in groups if _in_root(data_dir, g) is None]
    raise DataError(f"{what}: {'; '.join(missing)} not found in {data_dir} (or its tabular/, "
                    "text_sms/ folders)" + (f", which holds only {have}: a dataset's files "
                                           "must come from one folder" if have else "")
                    + "; pass --data-dir pointing at the folder that holds them")


def _find(data_dir: Path, *names: str) -> Path:
    """One file (the first of ``names`` present), as :func:`_locate` finds it."""
    return _locate(data_dir, names[0], names)[0]


def dataset_config(name: str) -> ALConfig:
    return spec(name).config


def spec(name: str) -> ALDatasetSpec:
    """A registered AL set, or one made on the fly from a scarcelab image dataset:
    ``<image dataset>`` (a backbone on the images) and ``encoded_<image dataset>``
    (a linear classifier on self-supervised embeddings), for every name in
    ``scarcelab list datasets``."""
    from scarcelab.data import DATASETS
    from scarcelab.data.own import is_own

    key = name.lower()
    if key in AL_DATASETS:
        return AL_DATASETS.get(key)
    base = name.removeprefix("encoded_")  # a path keeps its case
    if is_own(base) or base.lower() in DATASETS:
        base = base if is_own(base) else base.lower()
        if key.startswith("encoded_"):
            return ALDatasetSpec(_encoded_loader(base), _ENCODED, kind="encoded")
        return ALDatasetSpec(_image_loader(base), _IMAGE, kind="image")
    raise ConfigError(f"unknown AL dataset {name!r}; valid: {', '.join(list_al_datasets())} "
                      "(scarcelab list al-datasets)")


def list_al_datasets() -> list[str]:
    """Registered names plus the image and encoded forms of every image dataset."""
    from scarcelab.data import DATASETS

    images = [n for n in DATASETS.names() if n != "chestmnist"]  # multi-label: not for AL
    return sorted(set(AL_DATASETS.names()) | set(images) | {f"encoded_{n}" for n in images})


def load_al_dataset(name: str, data_dir: str | Path | None,
                    data_rng: np.random.Generator, ctx: LoadContext | None = None) -> ALData:
    """Load by name; synthetic sets draw from ``data_rng`` (s_D + repetition)."""
    s = spec(name)
    data = s.loader(Path(data_dir) if data_dir else default_data_dir(), data_rng,
                    ctx or LoadContext())
    _check(data)
    return data


def _check(data: ALData) -> None:
    """Refuse data that would give confident-looking nonsense (NaN/inf features, one class
    to learn); a one-class test set only warns (accuracy is still defined)."""
    for part, x in (("train", data.x_train), ("test", data.x_test)):
        bad = ~np.isfinite(x)
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise DataError(f"{data.name} ({data.source}): {int(bad.sum())} NaN/inf feature "
                            f"value(s) in the {part} split (first in row {row}); clean the "
                            "file or drop those rows")
    if len(np.unique(data.y_train)) < 2:
        raise DataError(f"{data.name} ({data.source}): the train split has a single class; "
                        "there is nothing to learn or query")
    if len(np.unique(data.y_test)) < 2:
        import warnings

        warnings.warn(f"{data.name}: the test split has a single class; test accuracy is "
                      "not a meaningful benchmark score", UserWarning, stacklevel=3)


# -- real data ------------------------------------------------------------------------------

#: CDALBench's splice settings (Table 7; their configs/splice.yaml) fitted the way their code
#: fits (core/environment.py, ALGame): one NAdam per repetition, state carried across fits;
#: the seed-set fit 50 epochs; then at most 100 epochs per fit, stopping at the first epoch
#: whose validation loss does not improve (``EarlyStopping(patience=0)``) and keeping that
#: last epoch's weights; the incomplete last batch dropped. "hidden: [24, 12]" builds
#: 60-24-24-12-2 in their ``DenseModel`` (an input layer to 24, then one layer per entry of
#: ``hidden_sizes``, the first 24 -> 24), so three hidden layers here.
#: A query of q > 1 samples is q fits, one per newly labeled sample (``ALGame.step`` calls
#: ``fit_classifier`` inside its loop over the action in ``finetuning`` mode).
_TABULAR_FIT = dict(max_epochs=100, patience=1, restore_best=False, drop_last=True,
                    keep_optimizer=True, first_fit_epochs=50, fit_per_label=True)
_SPLICE = ALConfig(budget=400, hidden=(24, 24, 12), fitting="finetune", optimizer="nadam",
                   lr=1.2135e-3, weight_decay=5.955e-5, batch_size=43, val_fraction=0.2,
                   **_TABULAR_FIT)  # type: ignore[arg-type]


@register_al_dataset("splice", _SPLICE)
def _splice(data_dir: Path, rng: np.random.Generator, ctx: LoadContext) -> ALData:
    from scarcelab.data.libsvm import read_libsvm_pair

    tr_p, te_p = _locate(data_dir, "splice", ("splice",), ("splice.t", "splice.t.derived"))
    note = ("test split is splice.t.derived (2079 rows rebuilt from the UCI source), "
            "not LibSVM's official 2175-row splice.t") if te_p.name.endswith(".derived") else ""
    tr, te = read_libsvm_pair(tr_p, te_p)
    # CDALBench scales splice to [0, 1] (``normalize(..., mode="min_max")`` in their
    # datasets/splice.py); LibSVM stores {-1, -1/3, 1/3, 1}.
    x_tr, x_te = _minmax(tr.x, te.x)
    return ALData("splice", x_tr, tr.y, x_te, te.y, tr.num_classes, str(tr_p), note)


@register_al_dataset("dna", dataclasses.replace(_SPLICE, budget=300))
def _dna(data_dir: Path, rng: np.random.Generator, ctx: LoadContext) -> ALData:
    """LibSVM ``dna`` / ``dna.t`` (not in the shared data here; the settings are splice's,
    since both are DNA-sequence tasks of the same encoding — override as needed)."""
    from scarcelab.data.libsvm import read_libsvm_pair

    tr_p, te_p = _locate(data_dir, "dna", ("dna", "dna.scale"), ("dna.t", "dna.scale.t"))
    tr, te = read_libsvm_pair(tr_p, te_p)
    return ALData("dna", tr.x, tr.y, te.x, te.y, tr.num_classes, str(tr_p))


#: USPS: budget 900, as CDALBench's ``configs/usps.yaml`` (``dataset: budget: 900`` in both
#: stored versions, commits 112bb9b6 and c564afd6). A budget of 400, used before,
#: put every USPS AUC ~0.06 under their Table 8 (measured: docs/active.md).
@register_al_dataset("usps", ALConfig(budget=900, hidden=(24, 24, 12), fitting="finetune",
                                      optimizer="adam", lr=8.1e-3, weight_decay=1.5e-6,
                                      batch_size=43, val_fraction=0.2,
                                      **_TABULAR_FIT))  # type: ignore[arg-type]
def _usps(data_dir: Path, rng: np.random.Generator, ctx: LoadContext) -> ALData:
    """USPS from an npz of 16x16 uint8 images, scaled to LibSVM's [-1, 1] (x/127.5 - 1), or
    from LibSVM text files ``usps`` / ``usps.t``."""
    try:
        p = _find(data_dir, "usps.npz")
    except DataError:
        from scarcelab.data.libsvm import read_libsvm_pair

        tr_p, te_p = _locate(data_dir, "usps", ("usps",), ("usps.t",))
        tr, te = read_libsvm_pair(tr_p, te_p)
        return ALData("usps", tr.x, tr.y, te.x, te.y, tr.num_classes, str(tr_p))
    from scarcelab.data.safe_read import load_npz

    d = load_npz(p, ("train_images", "train_labels", "test_images", "test_labels"),
                 fix="restore it (16x16 uint8 images, labels 0-9) or remove it to read the "
                 "LibSVM text files usps / usps.t instead")
    for k in ("train", "test"):
        im, lab = d[f"{k}_images"], d[f"{k}_labels"]
        if im.ndim < 2 or lab.size != len(im):
            raise DataError(f"{p}: {k}_images {im.shape} and {k}_labels {lab.shape} do not "
                            "match; expected (N, 16, 16) images and N labels")
    xs = {k: d[f"{k}_images"].reshape(len(d[f"{k}_images"]), -1).astype(np.float32)
          / 127.5 - 1.0 for k in ("train", "test")}
    ys = {k: d[f"{k}_labels"].reshape(-1).astype(np.int64) for k in ("train", "test")}
    return ALData("usps", xs["train"], ys["train"], xs["test"], ys["test"], 10, str(p))


@register_al_dataset("sms", kind="text",
                     config=ALConfig(budget=100, hidden=(), fitting="scratch",
                                     optimizer="nadam", lr=1e-3, batch_size=64,
                                     val_fraction=0.1))
def _sms(data_dir: Path, rng: np.random.Generator, ctx: LoadContext) -> ALData:
    """SMS spam as pre-computed MiniLM sentence embeddings (the encoded-text stand-in).
    The collection has no official split: a fixed 30 % test split (seed 0) is used so that
    every repetition is scored on the same test set."""
    p = _find(data_dir, "sms_minilm_l6_v2_embeddings.npz")
    from scarcelab.data.safe_read import load_npz

    d = load_npz(p, ("embeddings", "labels"), fix="restore it from ../shared/data "
                 "(sha256sum -c SHA256SUMS)")
    x, y = d["embeddings"].astype(np.float32), d["labels"].astype(np.int64)
    if x.ndim != 2 or y.shape != (len(x),):
        raise DataError(f"{p}: embeddings {x.shape} and labels {y.shape} do not match; "
                        "expected (N, D) and (N,)")
    perm = np.random.default_rng(0).permutation(len(y))
    n_test = int(0.3 * len(y))
    te, tr = perm[:n_test], perm[n_test:]
    return ALData("sms", x[tr], y[tr], x[te], y[te], 2, str(p),
                  "fixed 30% test split drawn with seed 0 (no official split)")


# -- synthetic ------------------------------------------------------------------------------

def _minmax(x_tr: np.ndarray, x_te: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = x_tr.min(0), x_tr.max(0)
    scale = np.where(hi > lo, hi - lo, 1.0)
    return ((x_tr - lo) / scale).astype(np.float32), ((x_te - lo) / scale).astype(np.float32)


def honeypot(rng: np.random.Generator, n_per_cluster: int = 150) -> tuple[np.ndarray,
                                                                         np.ndarray]:
    """Two easy clusters plus a noisy honeypot on the likely decision boundary.

    Unit-covariance Gaussians: class 1 at (0, 0) and (4, 3), class 0 at (0, 6) and (4, 3).
    The shared (4, 3) cluster is pure label noise, yet it lies where an uncertainty sampler
    looks, so it traps margin-style strategies — the purpose of this set. CDALBench's
    ``createToy_ThreeClust`` (their ``datasets/sythData.py``): 150 points per cluster.
    """
    centers = [((0.0, 0.0), 1), ((4.0, 3.0), 1), ((0.0, 6.0), 0), ((4.0, 3.0), 0)]
    xs = [rng.normal(size=(n_per_cluster, 2)) + np.asarray(c) for c, _ in centers]
    ys = [np.full(n_per_cluster, lab, dtype=np.int64) for _, lab in centers]
    return np.concatenate(xs), np.concatenate(ys)


def diverging_sine(rng: np.random.Generator, n_per_class: int = 1000) -> tuple[np.ndarray,
                                                                              np.ndarray]:
    """x on an even grid of ``n_per_class`` points over [0, 10], shared by both classes;
    class 0 follows sin(2x) + 0.5x, class 1 sin(2x) - 0.5x, plus N(0, 0.3) noise. The classes
    touch at the left and separate to the right, so the informative region is small and
    local. CDALBench's ``createDivergingSin`` (``datasets/sythData.py``): ``np.linspace(0,
    10, 1000)``, divergence 0.5, frequency 2, noise 0.3."""
    t = np.linspace(0.0, 10.0, n_per_class)
    xs, ys = [], []
    for lab, sign in ((0, 1.0), (1, -1.0)):
        v = np.sin(2 * t) + sign * 0.5 * t + rng.normal(0.0, 0.3, n_per_class)
        xs.append(np.stack([t, v], 1))
        ys.append(np.full(n_per_class, lab, dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


#: CDALBench's synthetic sets are one draw split 80/20 into train (pool + validation) and
#: test (``SynthData._load_data(test_ratio=0.20)``: shuffle, first 20 % test).
SYNTH_TEST_FRACTION = 0.2

#: Fitting as CDALBench's code runs it for these sets (``core/environment.py``,
#: ``ALGame``): one NAdam per repetition whose state carries across fits, the seed-set fit
#: 50 epochs, then up to 100 epochs per fit with ``EarlyStopping(patience=50)`` (stop after
#: 51 epochs without improvement; the last weights are kept), the incomplete last batch
#: dropped. Their config says ``from_scratch``, but ``initial_weights = state_dict()``
#: aliases the live parameters, so every fit in fact continues from the current weights —
#: ``finetune`` here. ``from_scratch`` also means one fit per query (``ALGame.step`` fits
#: after adding all q samples; ``configs/threeclust.yaml``, ``configs/divergingsin.yaml``:
#: ``classifier_fitting_mode: from_scratch``), hence ``fit_per_label=False``.
_SYNTH = ALConfig(budget=60, hidden=(24, 12), fitting="finetune", optimizer="nadam", lr=1e-3,
                  batch_size=32, val_fraction=0.2, max_epochs=100, patience=51,
                  restore_best=False, drop_last=True, keep_optimizer=True,
                  first_fit_epochs=50, fit_per_label=False)


def _synthetic(name: str, gen: Callable[[np.random.Generator], tuple[np.ndarray, np.ndarray]]
               ) -> Loader:
    def load(data_dir: Path, rng: np.random.Generator, ctx: LoadContext) -> ALData:
        x, y = gen(rng)
        ids = rng.permutation(len(y))
        cut = int(len(ids) * SYNTH_TEST_FRACTION)
        te, tr = ids[:cut], ids[cut:]
        x_tr, x_te = _minmax(x[tr], x[te])
        return ALData(name, x_tr, y[tr], x_te, y[te], 2, f"synthetic:{name}",
                      "regenerated from the data seed in every repetition; one draw split "
                      f"{1 - SYNTH_TEST_FRACTION:.0%}/{SYNTH_TEST_FRACTION:.0%} train/test")
    return load


register_al_dataset("honeypot", _SYNTH, synthetic=True)(_synthetic("honeypot", honeypot))
register_al_dataset("diverging_sine", _SYNTH, synthetic=True)(
    _synthetic("diverging_sine", diverging_sine))


# -- images ---------------------------------------------------------------------------------
# CDALBench's image and encoded settings (their repository's configs/mnist.yaml and
# configs/cifar10.yaml): ResNet18 fine-tuned with NAdam lr 1e-3, batch 64; encoded sets a
# linear layer trained from scratch with Adam, budget 500, one seed sample per class.

_IMAGE = ALConfig(budget=400, arch="resnet18", hidden=(), fitting="finetune",
                  optimizer="nadam", lr=1e-3, weight_decay=0.0, batch_size=64,
                  val_fraction=0.04, query_sizes=(20,))
_ENCODED = ALConfig(budget=500, hidden=(), fitting="scratch", optimizer="adam", lr=1.68e-3,
                    weight_decay=1.03e-5, batch_size=64, dropout=0.05, val_fraction=0.04)


def _unit(images: np.ndarray) -> np.ndarray:
    return images.astype(np.float32) / 255.0


def _chosen(data_dir: Path) -> Path | None:
    """The data dir as the image loaders must see it: None when it is only the default root
    (then they may look in the shared data folder, announced), the folder when the user
    chose it (then nothing else is read)."""
    return None if Path(data_dir) == default_data_dir() else data_dir


def given_pool_note(base: str, n_pool: int, n_labeled: int, encoder: str | None) -> str:
    """What an AL sweep does with a dataset's given unlabeled pool (``n_pool`` images), in
    one line: the protocol's pool is the labeled training images (``n_labeled``), whose
    labels the simulated annotator reveals when they are queried — the given images have
    no label to reveal, so they cannot be queried. ``encoder``: how an ``encoded_`` set's
    encoder relates to them (``trained``: it learned from them; ``pretrained``: it came
    from a run and did not), None for an image set. "" when there is no given pool."""
    if not n_pool:
        return ""
    why = (f"AL's annotator is simulated: it reveals labels the data already has, so the "
           f"pool it queries is drawn from the {n_labeled} labeled training images of {base}")
    if encoder == "trained":
        return (f"the {n_pool} given unlabeled images of {base} train the encoder (with the "
                f"labeled ones) and are not queried: {why}")
    alt = (f"al --dataset encoded_{base} without a pretrained --encoder (the encoder it "
           "trains learns from them)" if encoder == "pretrained" else
           f"al --dataset encoded_{base}, whose encoder trains on them")
    return (f"the {n_pool} given unlabeled images of {base} are not used: {why}, and these "
            f"images have none; to learn from them run semi or self, or {alt}")


def _pool_tags(base: str, raw: Any, encoder: str | None) -> dict[str, str]:
    """Say :func:`given_pool_note` once on stderr and return it as the sweep's tag (the run
    description shows it too): a given pool is never dropped silently."""
    n_pool = 0 if raw.unlabeled_x is None else len(raw.unlabeled_x)
    note = given_pool_note(base, n_pool, len(raw.train_y), encoder)
    if not note:
        return {}
    print(f"[scarcelab] {note}", file=sys.stderr, flush=True)
    return {T.UNLABELED_POOL: note}


def _image_loader(base: str) -> Loader:
    def load(data_dir: Path, rng: np.random.Generator, ctx: LoadContext) -> ALData:
        from scarcelab.data import load_raw

        raw = load_raw(base, _chosen(data_dir), ctx.data_options)
        if raw.task != "multi-class":
            raise ConfigError(f"{base} is {raw.task}; AL needs a multi-class dataset")
        return ALData(base, _unit(raw.train_x), raw.train_y.astype(np.int64),
                      _unit(raw.test_x),
                      raw.test_y.astype(np.int64), raw.num_classes, raw.source,
                      "images in [0, 1]; the network normalises them",
                      _pool_tags(base, raw, None))
    return load


def _encoded_loader(base: str) -> Loader:
    def load(data_dir: Path, rng: np.random.Generator, ctx: LoadContext) -> ALData:
        from scarcelab.active.classifier import resolve_device
        from scarcelab.active.encoded import DiskEncodingCache, EncoderConfig, encode_dataset
        from scarcelab.data import load_raw

        raw = load_raw(base, _chosen(data_dir), ctx.data_options)
        if raw.task != "multi-class":
            raise ConfigError(f"{base} is {raw.task}; AL needs a multi-class dataset")
        cfg = EncoderConfig.from_dict(ctx.encoder)
        from scarcelab.data.download import cache_root

        cache = ctx.cache if ctx.cache is not None else DiskEncodingCache(
            cache_root() / "encoded")
        enc, key, where = encode_dataset(base, raw.train_x, raw.train_y, raw.test_x,
                                         raw.test_y, raw.num_classes, cfg,
                                         resolve_device(ctx.device), cache, ctx.pretrained,
                                         ctx.pretrained_id, ctx.accel,
                                         unlabeled_x=raw.unlabeled_x)
        # Self-supervised features are small and uneven in scale (std ~0.02-0.04 per
        # dimension here), so a linear layer trained a few steps from a seed set of one
        # image per class barely leaves its initialisation; standardising with the training
        # images' statistics (no labels involved) fixes that for every encoder alike.
        mu, sd = enc.x_train.mean(0), enc.x_train.std(0)
        sd = np.where(sd > 1e-8, sd, 1.0)
        x_tr, x_te = ((a - mu) / sd for a in (enc.x_train, enc.x_test))
        m = enc.meta
        what = (f"pretrained encoder {m.get('source', '')}" if m.get("encoder") == "pretrained"
                else f"{m.get('encoder')} {m.get('arch')} {m.get('epochs')} epochs")
        return ALData(f"encoded_{base}", x_tr.astype(np.float32), enc.y_train,
                      x_te.astype(np.float32), enc.y_test,
                      raw.num_classes, raw.source,
                      f"{m.get('dim')}-d embeddings from {what}; encoding {key} ({where})",
                      {T.ENCODING_KEY: key, T.ENCODING_SOURCE: where,
                       **_pool_tags(base, raw, "pretrained" if ctx.pretrained is not None
                                    else "trained")})
    return load


register_al_dataset("mnist_5k", dataclasses.replace(_IMAGE, budget=400), kind="image")(
    _image_loader("mnist_5k"))
# CIFAR-10: budget 2000 after 100 seed images per class, validation 1 % (their config).
register_al_dataset("cifar10_5k", dataclasses.replace(_IMAGE, budget=2000, seed_per_class=100,
                                                     val_fraction=0.01, query_sizes=(200,)),
                    kind="image")(_image_loader("cifar10_5k"))
register_al_dataset("encoded_mnist_5k", _ENCODED, kind="encoded")(_encoded_loader("mnist_5k"))
register_al_dataset("encoded_cifar10_5k",
                    dataclasses.replace(_ENCODED, lr=4.22e-3, weight_decay=1.6e-8, dropout=0.0),
                    kind="encoded")(_encoded_loader("cifar10_5k"))
