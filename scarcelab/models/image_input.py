"""What a logged classifier does to a raw image before its network (issue 39, item 7).

A study trains on images that went through one transform (``scarcelab.data.imagefiles``:
decode, channels, resize to ``image_size``, uint8) and the network then sees them as
float32 in [0, 1] (``scarcelab.data.augment.to_float``; the fixed normalisation is inside
:class:`~scarcelab.models.classifier.ExportedClassifier`). A user of the logged model has
files or arrays of any size, not that tensor. :class:`InputSpec` records the transform with
the model (``preprocess.json`` beside the network, written by ``scarcelab.tracking.pyfunc_model``)
and :func:`prepare` replays it on new inputs through the *same* functions the training data
went through (``decode_file``, ``to_model_input``), so a test image given as a file gets the
class the run's own test metrics counted.

Learning core: no MLflow here (the MLflow flavor is ``scarcelab.tracking.pyfunc_model``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from scarcelab.errors import DataError

SPEC_VERSION = 1
#: float arrays are read as intensities in [0, 1]; this much rounding slack is accepted
FLOAT_SLACK = 1e-3

INPUT_DOC = (
    "image file paths (str or os.PathLike: PNG, JPEG, BMP, TIFF 8/16-bit, DICOM with pydicom "
    "installed) as a list, a numpy array of strings or a pandas column (named 'image' or "
    "'path', or the only column); or image arrays of any size: one image (H, W), (C, H, W) "
    "or (H, W, C), a batch (N, C, H, W) or (N, H, W, C), or a list mixing paths and arrays. "
    "C is 1 (gray), 3 (RGB), 2 or 4 (with alpha, composited on black). Pixels: uint8 or "
    "other integers within 0-255 as they are, float in [0, 1] (x255), uint16 and larger "
    "integers scaled over each image's min..max (as a 16-bit file). Each image is converted "
    "to the model's channels and resized as the training images were (the MLmodel's "
    "scarcelab.transform).")


def output_columns(class_names: Sequence[str]) -> list[str]:
    """The prediction frame's columns: the predicted class name, then one probability per
    class in the network's output order."""
    return ["class", *[f"p_{n}" for n in class_names]]


def transform_of(source: Any) -> dict[str, str] | None:
    """The transform (``Transform.params()``) recorded with a dataset, if any: under
    ``meta["transform"]`` of a bundle (or a meta mapping itself), or a ``transform``
    attribute / ``meta["transform"]`` of a raw dataset. None for the public datasets,
    which are used at their native size (:func:`training_transform` then says so)."""
    if source is None:
        return None
    meta = source if isinstance(source, Mapping) else getattr(source, "meta", None)
    if isinstance(meta, Mapping) and isinstance(meta.get("transform"), Mapping):
        return {str(k): str(v) for k, v in meta["transform"].items()}
    t = getattr(source, "transform", None)
    if isinstance(t, Mapping):
        return {str(k): str(v) for k, v in t.items()}
    return None


def training_transform(recorded: Mapping[str, str] | None, channels: int) -> dict[str, str]:
    """``recorded`` (the data's own transform), else the one a public dataset's images
    went through: native size (no resize), channels as stored (1: gray, 3: RGB)."""
    if recorded:
        return dict(recorded)
    from scarcelab.data.imagefiles import Transform

    return Transform(image_size=None, channels="gray" if channels == 1 else "rgb").params()


@dataclass(frozen=True)
class InputSpec:
    """The contract of a logged classifier: what it was trained on and what it returns.

    ``transform``: ``Transform.params()`` of the training data; ``channels`` / ``size``:
    the network's input (C, (H, W)); ``class_names``: its outputs, in order."""

    transform: dict[str, str]
    channels: int
    size: tuple[int, int]
    class_names: list[str]
    version: int = SPEC_VERSION
    scaling: str = field(default="uint8 / 255 -> float32 [0, 1]; (x - 0.5) / 0.5 inside the "
                                 "network")

    @classmethod
    def of(cls, model: torch.nn.Module, example: torch.Tensor) -> InputSpec:
        """The spec of an :class:`ExportedClassifier` about to be logged with ``example``
        ((N, C, H, W) floats): the transform it carries (``model.transform``, set by the
        protocol from the dataset), else the native one."""
        if example.ndim != 4:
            raise ValueError(f"an image classifier's example is (N, C, H, W), got "
                             f"{tuple(example.shape)}")
        c, h, w = (int(s) for s in example.shape[1:])
        return cls(transform=training_transform(getattr(model, "transform", None), c),
                   channels=c, size=(h, w),
                   class_names=[str(n) for n in cast("list[str]", model.class_names)])

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "transform": dict(self.transform),
                "channels": self.channels, "size": list(self.size),
                "class_names": list(self.class_names), "scaling": self.scaling,
                "input": INPUT_DOC, "output": output_columns(self.class_names)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> InputSpec:
        if int(d.get("version", 0)) > SPEC_VERSION:
            raise DataError(f"preprocess.json has version {d.get('version')}, newer than this "
                            f"scarcelab reads ({SPEC_VERSION}); upgrade scarcelab")
        return cls(transform={str(k): str(v) for k, v in d["transform"].items()},
                   channels=int(d["channels"]), size=(int(d["size"][0]), int(d["size"][1])),
                   class_names=[str(n) for n in d["class_names"]], version=int(d["version"]))


def _transform(spec: InputSpec) -> Any:
    """The recorded ``Transform`` (``image_size`` / ``fit``; its channel mode only names
    how files were decoded — ``to_model_input`` converts to the network's count)."""
    from scarcelab.data.imagefiles import Transform

    t = spec.transform
    size = t.get("image_size", "native")
    tr = Transform(image_size=None if size == "native" else int(size),
                   channels=t.get("channels", "auto"), fit=t.get("fit", "crop"))
    if tr.image_size is not None and (tr.image_size, tr.image_size) != tuple(spec.size):
        raise DataError(f"preprocess.json: transform image_size {size} differs from the "
                        f"network's input {spec.size[0]}x{spec.size[1]}")
    return tr


def _pixels(a: np.ndarray) -> np.ndarray:
    """An array's intensities in a form ``to_model_input`` reads as the training data was
    stored: floats as [0, 1] (x255, rounded), integers within 0-255 (what JSON from
    ``mlflow models serve`` and Python lists give: int64) as uint8; ``uint16`` and integers
    beyond 0-255 are left to ``to_model_input``'s 16-bit rule (each image's min..max, as
    a 16-bit file is read)."""
    if a.dtype == np.uint8 or a.dtype == np.bool_ or a.dtype == np.uint16 or a.size == 0:
        return a
    if np.issubdtype(a.dtype, np.floating):
        finite = bool(np.isfinite(a).all())
        lo, hi = (float(a.min()), float(a.max())) if finite else (float("nan"),) * 2
        if not finite or lo < -FLOAT_SLACK or hi > 1 + FLOAT_SLACK:
            raise DataError(f"float image arrays are read as intensities in [0, 1], "
                            f"got values in [{lo:g}, {hi:g}]; divide 0-255 data by 255 or "
                            "pass uint8")
        return np.clip(np.rint(a * 255.0), 0, 255).astype(np.uint8)
    if np.issubdtype(a.dtype, np.integer) and a.min() >= 0 and a.max() <= 255:
        return a.astype(np.uint8)
    return a


def _is_path(x: Any) -> bool:
    return isinstance(x, (str, os.PathLike, np.str_))


def _column(data: Any) -> Any:
    """A DataFrame's image column (named ``image`` or ``path``, or its only column) or a
    Series, as a list; anything else as it is."""
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas comes with MLflow
        return data
    if isinstance(data, pd.DataFrame):
        named = [c for c in ("image", "path") if c in data.columns]
        if named:
            data = data[named[0]]
        elif data.shape[1] == 1:
            data = data.iloc[:, 0]
        else:
            raise DataError(f"a DataFrame input has one column of images (named 'image' or "
                            f"'path', or its only column); got columns {list(data.columns)}")
    if isinstance(data, pd.Series):
        return data.tolist()
    return data


def _items(data: Any) -> Iterator[tuple[str, Any]]:
    """``data`` as single images — a path or one (H, W) / (C, H, W) / (H, W, C) array — each
    with the name an error about it gives."""
    data = _column(data)
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu().numpy()
    if _is_path(data):
        yield "input", data
        return
    if isinstance(data, np.ndarray) and data.dtype.kind not in "USO":
        if data.ndim == 3 and data.shape[0] == 2 and data.shape[-1] > 4:
            # (2, H, W) reads as gray + alpha; from JSON or a stack it is far more often
            # two gray images, which would silently come back as one prediction
            raise DataError(f"input: a (2, H, W) array {data.shape} is ambiguous; pass two "
                            "gray images as (2, 1, H, W) or a list, one gray + alpha image "
                            "as (H, W, 2)")
        if data.ndim == 4:
            for j, x in enumerate(data):
                yield f"input[{j}]", x
        else:
            yield "input", data
        return
    if not isinstance(data, (list, tuple, np.ndarray)):
        raise DataError(f"cannot read a {type(data).__name__} as images; pass {INPUT_DOC}")
    for i, x in enumerate(data):
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
        if _is_path(x):
            yield f"input[{i}]", x
        elif isinstance(x, (np.ndarray, list, tuple)):
            a = np.asarray(x)
            if a.ndim == 4:
                for j, y in enumerate(a):
                    yield f"input[{i}][{j}]", y
            else:
                yield f"input[{i}]", a
        else:
            raise DataError(f"input[{i}]: a {type(x).__name__} is neither a file path nor an "
                            "image array")


def batches(data: Any, spec: InputSpec, batch_size: int = 256) -> Iterator[np.ndarray]:
    """``data`` (see :data:`INPUT_DOC`) as the network's input, uint8 (n, C, H, W) batches
    of ``batch_size``, in order. Each image goes through what the training images went
    through: a file ``decode_file``, then ``to_model_input`` (alpha, channels to the
    network's count, resize to the training size per the recorded ``fit`` — nothing when
    it already has that size); an array starts at ``to_model_input``. Files are read one
    at a time, so a long list of paths is never all in memory."""
    from scarcelab.data.imagefiles import decode_file, to_model_input

    tr, out = _transform(spec), []
    for what, x in _items(data):
        try:
            img = decode_file(Path(str(x))) if _is_path(x) else _pixels(np.asarray(x))
            out.append(to_model_input(img, tr, spec.channels, size=spec.size))
        except DataError as e:
            if _is_path(x):
                raise  # the decoder's line names the file
            raise DataError(f"{what}: {e}") from None
        if len(out) == batch_size:
            yield np.stack(out)
            out = []
    if out:
        yield np.stack(out)


def prepare(data: Any, spec: InputSpec) -> np.ndarray:
    """All of ``data`` as one uint8 (N, C, H, W) batch (:func:`batches`)."""
    got = list(batches(data, spec))
    if not got:
        raise DataError("no images given")
    return np.concatenate(got)
