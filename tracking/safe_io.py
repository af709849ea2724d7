"""Checkpoints and models that load without running code: a store
anyone can write to must not be a way to run code on the machine that reads it.

A study's best checkpoint travels through the artifact store and comes back on resume.
``torch.load(weights_only=False)`` on such a file runs whatever its pickle says, so anyone
who can write the bucket could run code in the next resumed study. Here:

* a checkpoint holds only tensors and plain types (dict / list / tuple / str / int / float /
  bool / None) — :func:`plain` converts numpy scalars and arrays and refuses anything else
  *at save time*, so a checkpoint that cannot be read back safely is never written;
* its SHA-256 is recorded in the tracking store (tag ``scarcelab.checkpoint_sha256``) next
  to the upload, and :func:`load_checkpoint` refuses a file whose digest differs before
  reading a byte of it as a checkpoint; then it is read with ``weights_only=True`` anyway;
* the final model is exported with ``torch.export`` (MLflow's ``pt2`` format: a graph in
  JSON plus raw tensor bytes) and read back only after MLflow's check that the archive
  carries no pickle payload (:func:`load_exported`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scarcelab import tags as T


class UnsafeArtifact(RuntimeError):
    """An artifact failed its integrity / no-code-execution check and was not loaded."""


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def plain(obj: Any, where: str = "checkpoint") -> Any:
    """``obj`` as tensors and plain types only (what ``weights_only=True`` reads back)."""
    if isinstance(obj, np.generic):  # before float: np.float64 *is* a float subclass
        return obj.item()
    if obj is None or type(obj) in (bool, int, float, str) or isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"{where}: key {k!r} is a {type(k).__name__}, not str/int")
            out[k] = plain(v, f"{where}[{k!r}]")
        return out
    if isinstance(obj, (list, tuple)):
        seq = [plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return seq if isinstance(obj, list) else tuple(seq)
    raise TypeError(f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}: a checkpoint "
                    "holds only tensors and plain types (it must load with "
                    "torch.load(weights_only=True)); store its state_dict / numbers instead")


def save_checkpoint(ckpt: dict[str, Any], path: str | Path) -> str:
    """Write ``ckpt`` (plain types only) and return its SHA-256."""
    torch.save(plain(ckpt), path)
    return sha256_file(path)


def load_checkpoint(path: str | Path, expected_sha256: str | None) -> dict[str, Any]:
    """Read a checkpoint fetched from a store: digest first, then ``weights_only=True``."""
    if not expected_sha256:
        raise UnsafeArtifact(f"{path}: no {T.CHECKPOINT_SHA256} recorded for it in the tracking "
                             "store, so it cannot be told apart from a file someone else "
                             "uploaded")
    got = sha256_file(path)
    if got != expected_sha256:
        raise UnsafeArtifact(f"{path}: sha256 {got[:16]}… differs from the {T.CHECKPOINT_SHA256} "
                             f"{expected_sha256[:16]}… this study recorded: the file in the "
                             "artifact store was replaced or damaged")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure here means "not a safe checkpoint"
        raise UnsafeArtifact(f"{path}: not a plain-tensor checkpoint ({type(e).__name__}: "
                             f"{str(e)[:300]})") from e
    if not isinstance(ckpt, dict):
        raise UnsafeArtifact(f"{path}: a checkpoint is a dict, found {type(ckpt).__name__}")
    return ckpt


def export_model(model: torch.nn.Module, example: torch.Tensor, path: str | Path) -> None:
    """``torch.export`` the model (batch dimension dynamic) into a ``.pt2`` archive."""
    model = model.eval()
    ep = torch.export.export(model, (example,),
                             dynamic_shapes=({0: torch.export.Dim.AUTO},))
    torch.export.save(ep, str(path))


def load_exported(path: str | Path) -> Any:
    """An ``ExportedProgram`` from a ``.pt2`` archive, after checking that none of its records
    is a pickle payload (MLflow's own validator: ``torch.export.load`` would otherwise unpickle
    weights and sample inputs with ``weights_only=False``)."""
    check_exported(path)
    return torch.export.load(str(path))


def check_exported(path: str | Path) -> None:
    """Raise :class:`UnsafeArtifact` unless the ``.pt2`` archive at ``path`` is free of
    pickle payloads (MLflow's validator; it reads the zip's records, loads nothing)."""
    from mlflow.pytorch import _validate_pt2_archive_is_pickle_free

    try:
        _validate_pt2_archive_is_pickle_free(str(path))
    except Exception as e:  # noqa: BLE001 - MlflowException or a broken archive
        raise UnsafeArtifact(f"{path}: refused, {e}") from e
