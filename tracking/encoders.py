"""Encoders from the tracking store: ``runs:/<id>/model``, ``runs:/<id>/<artifact>``,
``models:/<name>/<version>`` (or ``models:/<name>@<alias>``), on top of the local forms
(``random``, a weights file) that ``scarcelab.models.encoder`` resolves.

Every scarcelab study uploads its best checkpoint as ``checkpoints/best.pt`` (a plain
``torch.save`` of a dict whose ``state_dict`` holds the method's tensors, beside ``arch``
and ``in_channels``) and its final model with ``mlflow.pytorch.log_model`` as a *pickled*
module. ``runs:/<id>/model`` is therefore read through the checkpoint: same weights (the
exported model is rebuilt from that checkpoint), and the architecture comes with it. Only
a run without a checkpoint falls back to the model's ``data/model.pth``, read with the
same no-code-execution reader (``scarcelab.models.encoder.read_weights``) — never
``mlflow.pytorch.load_model``, which unpickles whatever the store holds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from scarcelab import tags as T
from scarcelab.errors import ConfigError, DataError
from scarcelab.models.encoder import backbone_from_file, build_encoder

CHECKPOINT = "checkpoints/best.pt"
MLFLOW_PREFIXES = ("runs:/", "models:/")


def _client() -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def source_run(spec: str) -> tuple[str, str]:
    """(run id, artifact path inside the run) that ``spec`` points at."""
    client = _client()
    if spec.startswith("runs:/"):
        rest = spec[len("runs:/"):].strip("/")
        run_id, _, sub = rest.partition("/")
        if not run_id:
            raise ConfigError(f"encoder={spec!r}: expected runs:/<run id>/model")
        return run_id, sub or "model"
    rest = spec[len("models:/"):].strip("/")
    try:
        if "@" in rest:
            name, alias = rest.split("@", 1)
            mv = client.get_model_version_by_alias(name, alias)
        else:
            name, _, version = rest.rpartition("/")
            if not name:
                raise ConfigError(f"encoder={spec!r}: expected models:/<name>/<version> or "
                                  "models:/<name>@<alias>")
            if version == "latest":
                versions = client.search_model_versions(f"name = '{name}'")
                if not versions:
                    raise ConfigError(f"encoder={spec!r}: model {name!r} has no versions")
                mv = max(versions, key=lambda v: int(v.version))
            else:
                mv = client.get_model_version(name, version)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the registry's errors are MlflowException
        raise ConfigError(f"encoder={spec!r}: no such registered model version ({e})") from e
    if not mv.run_id:
        raise ConfigError(f"encoder={spec!r}: the model version names no source run, so "
                          "its checkpoint cannot be found; pass runs:/<run id>/model")
    return str(mv.run_id), "model"


def _download(uri: str, dst: str) -> Path | None:
    """``uri`` (``runs:/<id>/<path>``: a run artifact, or in MLflow 3 also a model logged
    under that name) into ``dst``; None when there is no such artifact."""
    from mlflow.artifacts import download_artifacts

    try:
        return Path(download_artifacts(artifact_uri=uri, dst_path=dst))
    except Exception:  # noqa: BLE001 - absent artifact: the caller tries the next layout
        return None


def resolve_encoder(spec: str, arch: str | None, in_channels: int | None,
                    seed: int = 0, norm: str = "auto") -> tuple[nn.Module, dict[str, Any]]:
    """A backbone and where it came from, for any encoder spec a user may pass.

    ``info`` carries ``source`` (= ``spec``, the value of the ``scarcelab.encoder`` tag),
    ``arch``, ``format``, ``input_norm``, ``fingerprint`` (hash of the weights) and, for
    MLflow sources, ``run_id`` plus the source study's ``method`` / ``family`` /
    ``dataset`` tags. ``norm``: the input normalisation the weights expect
    (``scarcelab.models.encoder.parse_norm``).
    """
    if not spec.startswith(MLFLOW_PREFIXES):
        return build_encoder(spec, arch, in_channels or 3, seed, norm=norm)
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    client = _client()
    run_id, sub = source_run(spec)
    try:
        run = client.get_run(run_id)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"encoder={spec!r}: run {run_id} not found in the tracking store "
                          f"({e})") from e
    tags = run.data.tags
    with tempfile.TemporaryDirectory(prefix="scarcelab-encoder-") as tmp:
        path: Path | None = None
        if sub in ("model", CHECKPOINT):
            path = _download(f"runs:/{run_id}/{CHECKPOINT}", tmp)
            if path is not None:
                _verify(path, tags, spec)
        if path is None and sub != CHECKPOINT:
            got = _download(f"runs:/{run_id}/{sub}", tmp)
            if got is not None and got.is_dir():  # an MLflow model folder
                pt2 = sorted(got.rglob("*.pt2"))
                cands = sorted(got.rglob("*.pth")) + sorted(got.rglob("*.pt"))
                got = _backbone_from_pt2(pt2[0], Path(tmp), spec) if pt2 else (
                    cands[0] if cands else None)
            path = got
        if path is None:
            parent = tags.get(MLFLOW_PARENT_RUN_ID)
            hint = (f"it is a trial of study run {parent}: pass runs:/{parent}/model" if
                    tags.get(T.ROLE) == "trial" and parent else
                    "pass a scarcelab study run (scarcelab.role = study)")
            raise DataError(f"encoder={spec!r}: run {run_id} has neither {CHECKPOINT} nor "
                            f"weights under {sub!r}; {hint}")
        net, info = backbone_from_file(path, arch or tags.get(T.ARCH), in_channels,
                                       source=spec, norm=norm)
    info.update(run_id=run_id, artifact=str(path.name))
    for k, tag in (("method", T.METHOD), ("family", T.FAMILY), ("dataset", T.DATASET)):
        if tag in tags:
            info.setdefault(f"source_{k}", tags[tag])
    return net, info


def _backbone_from_pt2(pt2: Path, tmp: Path, spec: str) -> Path:
    """A study's model logged in MLflow's ``pt2`` format (scarcelab's default): the archive
    is checked to hold no pickle payload, then only the backbone's tensors are kept, as a
    plain state-dict file for :func:`backbone_from_file`."""
    import torch

    from scarcelab.tracking.safe_io import UnsafeArtifact, load_exported

    try:
        program = load_exported(pt2)
    except UnsafeArtifact as e:
        raise DataError(f"encoder={spec!r}: {e}") from e
    state = {k.removeprefix("backbone."): v for k, v in program.state_dict.items()
             if k.startswith("backbone.")}
    if not state:
        raise DataError(f"encoder={spec!r}: the pt2 model has no backbone.* weights; pass the "
                        "model of a scarcelab study run")
    out = tmp / "backbone_from_pt2.pt"
    torch.save(state, out)
    return out


def _verify(path: Path, tags: dict[str, str], spec: str) -> None:
    """A study records its checkpoint's sha256 in the tracking store: a file in the
    artifact store that differs from it was replaced behind the study's back (the artifact
    store is the less protected of the two, docs/threat-model.md) and is refused."""
    from scarcelab.tracking.safe_io import sha256_file

    want = tags.get(T.CHECKPOINT_SHA256)
    if want and sha256_file(path) != want:
        raise DataError(f"encoder={spec!r}: {CHECKPOINT} differs from the sha256 the study "
                        f"recorded ({T.CHECKPOINT_SHA256}); refusing a checkpoint that was "
                        "replaced in the artifact store")


__all__ = ["CHECKPOINT", "resolve_encoder", "source_run"]
